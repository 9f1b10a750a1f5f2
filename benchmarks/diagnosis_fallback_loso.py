"""How the learned fallback carries to sets it never saw (issue 45, round 21): leave one red-team SET out.

For each set k of `--sets` (default 10..17): fit the fallback on the real corpus's tune half, the generated logs and
every red-team set (4..17) but k, take its threshold from leave-one-group-out pairs (a red-team set is one group, a
tune-half project one group) that exclude set k's logs, and score the whole diagnosis on set k with it, against a
baseline model (`--baseline`: round 20's, which saw no red-team set). Also the fallback's own precision and
coverage on the logs of set k that the rules alone leave `unknown` or answer with the wrong category, and on every
log of set k (rules or not); and the diagnosis with no fallback at all.

    python benchmarks/diagnosis_fallback_loso.py [--sets 10 11 ...] [--k 7] [--baseline MODEL.json]

Never reads the test half of the real corpus.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.diagnosis import fallback as fb  # noqa: E402
from tasks.diagnosis.compress import compress  # noqa: E402
from tasks.diagnosis.diagnose import diagnose  # noqa: E402

SETS = REPO / "tests" / "data" / "diagnosis"


@dataclass
class Scored:
    cat: float
    line: float
    unknown: float


def _labelled(k: int) -> list[dict]:
    root = SETS / f"redteam{k}"
    rows = [json.loads(ln) for ln in (root / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    for r in rows:
        r["path"] = root / "logs" / f"{r['id']}.log"
    return rows


def _score(rows: list[dict], model: fb.Fallback | None) -> Scored:
    """The whole diagnosis of `rows` with `model` as the fallback (None: rules alone)."""
    orig = fb.Fallback.load
    fb.Fallback.load = classmethod(lambda cls, path=fb.MODEL: model)  # type: ignore[method-assign]
    try:
        ds = [diagnose(r["path"], use_fallback=model is not None) for r in rows]
    finally:
        fb.Fallback.load = orig  # type: ignore[method-assign]
    cat = sum(d.category == r["category"] for d, r in zip(ds, rows, strict=True))
    line = sum(bool(d.root_cause_line) and r["root_line"].strip() in d.root_cause_line
               for d, r in zip(ds, rows, strict=True))
    unk = sum(d.category == "unknown" for d in ds)
    n = max(len(rows), 1)
    return Scored(100 * cat / n, 100 * line / n, 100 * unk / n)


def _alone(rows: list[dict], model: fb.Fallback) -> tuple[int, int, int]:
    """(logs the rules alone leave unknown or get wrong, of them the fallback answers, answers right)."""
    missed = [r for r in rows if diagnose(r["path"], use_fallback=False).category != r["category"]]
    answered = right = 0
    for r in missed:
        v = model.predict([(k.line_no, k.text) for k in compress(r["path"]).kept if k.error])
        answered += v is not None
        right += v is not None and v.category == r["category"]
    return len(missed), answered, right


def _every(rows: list[dict], model: fb.Fallback) -> tuple[int, int]:
    """The fallback asked about every log of `rows`, rules or not: (answers, answers of the right category)."""
    answered = right = 0
    for r in rows:
        v = model.predict([(k.line_no, k.text) for k in compress(r["path"]).kept if k.error])
        answered += v is not None
        right += v is not None and v.category == r["category"]
    return answered, right


def _pairs(examples: list[fb.Example], ids: list[str], k: int) -> list[tuple[float, bool, str]]:
    """Each example's confidence from the other groups' logs (one fit on all: the idf barely moves), whether their
    vote is right, and the example's group."""
    model = fb.fit(examples, ids, k)
    groups = [e.group for e in examples]
    out = []
    for g in sorted(set(groups)):
        others = fb.Fallback(model.idf, [d for d, h in zip(model.docs, groups, strict=True) if h != g], 0.0, k)
        for e in examples:
            if e.group == g:
                s, d = others.vote(e.text)
                out.append((s, d is not None and d.category == e.category, g))
    return out


def _threshold(pairs: list[tuple[float, bool, str]], exclude: str) -> float:
    ps = sorted(((s, ok) for s, ok, g in pairs if g != exclude), reverse=True)
    threshold, right = 1.0, 0
    for n, (s, ok) in enumerate(ps, 1):
        right += ok
        if right / n >= fb.TARGET_PRECISION:
            threshold = s
    return threshold


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", type=int, nargs="+", default=list(range(10, 18)))
    ap.add_argument("--baseline", type=Path, default=fb.MODEL, help="the model to compare with (default: shipped)")
    ap.add_argument("--k", type=int, default=fb.K, help="neighbours that vote (1: the nearest alone, as before)")
    args = ap.parse_args(argv)
    base, base_ids = fb.training_examples(redteam=())
    extra, extra_ids = fb.redteam_examples(range(4, 18))
    examples, ids = base + extra, base_ids + extra_ids
    pairs = _pairs(examples, ids, args.k)
    shipped = fb.Fallback.load(args.baseline)
    print("| set | logs | baseline: cat / line / unknown | LOSO wider: cat / line / unknown | threshold | "
          "rules missed | baseline answers / right | wider answers / right | every log: baseline | every log: wider | "
          "no fallback: cat / line / unknown |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in args.sets:
        rows = _labelled(k)
        keep = [(e, i) for e, i in zip(examples, ids, strict=True) if e.group != f"redteam{k}"]
        model = fb.fit([e for e, _ in keep], [i for _, i in keep], args.k)
        model.threshold = _threshold(pairs, f"redteam{k}")
        a, b, c = _score(rows, shipped), _score(rows, model), _score(rows, None)
        m, sa, sr = _alone(rows, shipped)
        _, wa, wr = _alone(rows, model)
        (ea, er), (fa, fr) = _every(rows, shipped), _every(rows, model)
        print(f"| {k} | {len(rows)} | {a.cat:.1f} / {a.line:.1f} / {a.unknown:.1f} | {b.cat:.1f} / {b.line:.1f} / "
              f"{b.unknown:.1f} | {model.threshold:.3f} | {m} | {sa} / {sr} | {wa} / {wr} | {ea} / {er} | "
              f"{fa} / {fr} | {c.cat:.1f} / {c.line:.1f} / {c.unknown:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
