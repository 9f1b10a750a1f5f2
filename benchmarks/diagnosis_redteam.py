"""Score `frenzy diagnose` on a red-team set: logs from projects outside the corpus, labelled from their threads
before the diagnosis was run (tests/data/diagnosis/redteam4 by default, redteam5 with `--set`; PROVENANCE.md in each).

    python benchmarks/diagnosis_redteam.py [--set DIR] [--json OUT]

Prints category accuracy, root-cause line (the label's line is a substring of the answer), `unknown` and the
restart decision, overall, per family (chain, divergence, network, user-env-code, other) and per category
(precision / recall); `--json` writes every log's outcome. The library call is the one `frenzy diagnose` makes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.diagnosis.diagnose import diagnose  # noqa: E402

DEFAULT = REPO / "tests" / "data" / "diagnosis" / "redteam4"
CATEGORIES = ("infrastructure", "framework", "script")


@dataclass
class Outcome:
    id: str
    family: str
    want: str
    got: str
    cat_ok: bool
    line_ok: bool
    unknown: bool
    restart_ok: bool
    line: str
    want_line: str
    seconds: float


def run(root: Path) -> list[Outcome]:
    """Diagnose every log of the set at `root`."""
    rows = [json.loads(ln) for ln in (root / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    out = []
    for r in rows:
        t0 = time.perf_counter()
        d = diagnose(root / "logs" / f"{r['id']}.log")
        line = d.root_cause_line or ""
        out.append(Outcome(r["id"], r["family"], r["category"], d.category, d.category == r["category"],
                           bool(line) and r["root_line"].strip() in line, d.category == "unknown",
                           d.restartable == r["restartable"], line[:200], r["root_line"], time.perf_counter() - t0))
    return out


def _pct(xs: list[Outcome], key: str) -> float:
    return 100 * sum(getattr(x, key) for x in xs) / max(len(xs), 1)


def report(out: list[Outcome]) -> list[str]:
    """The summary lines: overall, per family, per category."""
    t = sorted(x.seconds for x in out)
    lines = [f"{len(out)} logs: category {_pct(out, 'cat_ok'):.1f}%  root line {_pct(out, 'line_ok'):.1f}%  "
             f"unknown {_pct(out, 'unknown'):.1f}%  restart {_pct(out, 'restart_ok'):.1f}%  "
             f"median time {1e3 * t[len(t) // 2]:.1f} ms" if t else "0 logs"]
    for fam in sorted({x.family for x in out}):
        xs = [x for x in out if x.family == fam]
        lines.append(f"  {fam:14s} {len(xs):3d}: category {_pct(xs, 'cat_ok'):5.1f}%  line {_pct(xs, 'line_ok'):5.1f}%"
                     f"  unknown {_pct(xs, 'unknown'):4.1f}%")
    for c in CATEGORIES:
        said, truth = [x for x in out if x.got == c], [x for x in out if x.want == c]
        lines.append(f"  {c:14s} precision {sum(x.cat_ok for x in said) / max(len(said), 1):.2f} "
                     f"recall {sum(x.cat_ok for x in truth) / max(len(truth), 1):.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", type=Path, default=DEFAULT, help="the red-team set (manifest.jsonl and logs/)")
    ap.add_argument("--json", type=Path, help="write every log's outcome here")
    args = ap.parse_args(argv)
    out = run(args.set)
    print("\n".join(report(out)))
    if args.json:
        args.json.write_text(json.dumps([asdict(x) for x in out], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
