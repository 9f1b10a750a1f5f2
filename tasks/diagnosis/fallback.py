"""The learned fallback of the diagnosis (issue 29): for a log no rule explains, the category its K nearest labelled
logs vote for (TF-IDF cosine over the kept error lines, each vote weighted by its similarity), answered only when
the confidence (the winner's share of the vote times the nearest similarity) clears a threshold calibrated by
leaving whole projects and whole red-team sets out; below it the answer stays `unknown` (a person must look).

No dependency: under a thousand sparse vectors, pure Python. The model is `fallback_model.json` next to this file,
trained on the real-log benchmark's tune half (never its test half), two generated logs of each rule type and the
red-team sets redteam4 ... redteam17 (round 21: leaving one set out, the vote of 7 carried to the left-out set at
90% precision where the nearest log alone did not); `frenzy diagnose --retrain-fallback` (or
`python -m tasks.diagnosis.fallback`) rebuilds it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

MODEL = Path(__file__).with_name("fallback_model.json")
_TOKEN = re.compile(r"[a-z][a-z_]{2,}")
_NOISE = re.compile(r"(?:/|\\)[^\s'\"]+|0x[0-9a-f]+|\d+")  # paths, addresses and numbers say nothing of the cause
TARGET_PRECISION = 0.9
REDTEAM = Path(__file__).resolve().parents[2] / "tests" / "data" / "diagnosis"
"""The red-team sets (redteamN/manifest.jsonl and logs/): labelled logs from projects outside the real corpus."""
REDTEAM_SETS = range(4, 18)
"""The red-team sets the shipped model is trained on (round 21: redteam4 ... redteam17, 659 logs)."""


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(_NOISE.sub(" ", text.lower()))


def _vector(counts: Counter, idf: dict[str, float]) -> dict[str, float]:
    v = {t: (1 + math.log(n)) * idf.get(t, 0.0) for t, n in counts.items() if idf.get(t, 0.0) > 0}
    norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
    return {t: x / norm for t, x in v.items()}


def _cos(a: dict[str, float], b: dict[str, float]) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(x * b.get(t, 0.0) for t, x in a.items())


@dataclass
class Example:
    text: str
    category: str
    type: str
    restartable: bool
    group: str
    """The project it came from: calibration leaves a whole project out at a time."""


@dataclass
class Verdict:
    category: str
    type: str
    restartable: bool
    confidence: float
    line: str | None
    line_no: int | None
    neighbour: str


@dataclass(frozen=True)
class Neighbour:
    """A labelled log of the model: its label and its TF-IDF vector (term -> weight, unit length)."""

    id: str
    category: str
    type: str
    restartable: bool
    vec: dict[str, float]


K = 7
"""Neighbours that vote: leaving one red-team set out at a time (round 21), the vote of the 7 nearest labelled logs
held 90% precision on 640 of 861 held-out logs, the single nearest on 187 (benchmarks/results/diagnosis_round21.md)."""


class Fallback:
    def __init__(self, idf: dict[str, float], docs: list[Neighbour], threshold: float, k: int = 1) -> None:
        self.idf, self.docs, self.threshold, self.k = idf, docs, threshold, k

    @classmethod
    def load(cls, path: Path = MODEL) -> Fallback | None:
        try:
            d = json.loads(path.read_text())
            return cls(d["idf"], [Neighbour(**n) for n in d["docs"]], float(d["threshold"]), int(d.get("k", 1)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def nearest(self, text: str) -> tuple[float, Neighbour | None]:
        v = _vector(Counter(tokens(text)), self.idf)
        best, doc = 0.0, None
        for d in self.docs:
            s = _cos(v, d.vec)
            if s > best:
                best, doc = s, d
        return best, doc

    def vote(self, text: str) -> tuple[float, Neighbour | None]:
        """The category the `k` nearest labelled logs vote for (each with its similarity) and its nearest log;
        the confidence is the winner's share of the vote times the nearest log's similarity (one log alone, or
        neighbours that disagree, say less than neighbours that agree)."""
        v = _vector(Counter(tokens(text)), self.idf)
        near = sorted(((_cos(v, d.vec), j) for j, d in enumerate(self.docs)), reverse=True)[:self.k]
        near = [(s, self.docs[j]) for s, j in near if s > 0]
        if not near:
            return 0.0, None
        votes: Counter = Counter()
        for s, d in near:
            votes[d.category] += s
        cat = max(votes, key=lambda c: votes[c])
        return votes[cat] / sum(votes.values()) * near[0][0], next(d for _, d in near if d.category == cat)

    def predict(self, lines: list[tuple[int, str]]) -> Verdict | None:
        """The verdict for a log's kept error lines ((line number, text)), or None below the threshold."""
        score, doc = self.vote("\n".join(t for _, t in lines))
        if doc is None or score < self.threshold:
            return None
        # the cause's line: the kept line that shares the most weight with the neighbour
        best = max(lines, key=lambda lt: _cos(_vector(Counter(tokens(lt[1])), self.idf), doc.vec), default=None)
        return Verdict(doc.category, doc.type, doc.restartable, round(score, 3),
                       best[1].strip() if best else None, best[0] if best else None, doc.id)


def fit(examples: list[Example], ids: list[str], k: int = K) -> Fallback:
    """The model of `examples` (labelled `ids`), its threshold left at 0 (`calibrate` sets it)."""
    df: Counter = Counter()
    counts = [Counter(tokens(e.text)) for e in examples]
    for c in counts:
        df.update(c.keys())
    n = len(examples)
    idf = {t: math.log((1 + n) / (1 + k)) + 1 for t, k in df.items() if k < n}
    docs = [Neighbour(i, e.category, e.type, e.restartable, _vector(c, idf))
            for i, e, c in zip(ids, examples, counts, strict=True)]
    return Fallback(idf, docs, 0.0, k)


def calibrate(examples: list[Example], ids: list[str]) -> tuple[float, list[tuple[float, bool]]]:
    """Leave one group out (a project, a red-team set): each example's confidence from the other groups' logs and
    whether their vote is right; the threshold is the lowest confidence above which the answers reach
    TARGET_PRECISION."""
    pairs = []
    for g in sorted({e.group for e in examples}):
        train = [(e, i) for e, i in zip(examples, ids, strict=True) if e.group != g]
        model = fit([e for e, _ in train], [i for _, i in train])
        for e in examples:
            if e.group == g:
                s, d = model.vote(e.text)
                pairs.append((s, d is not None and d.category == e.category))
    pairs.sort(reverse=True)
    threshold, right = 1.0, 0
    for k, (s, ok) in enumerate(pairs, 1):
        right += ok
        if right / k >= TARGET_PRECISION:
            threshold = s
    return threshold, pairs


def training_examples(redteam: Iterable[int] = REDTEAM_SETS) -> tuple[list[Example], list[str]]:
    """The tune half of the real-log benchmark (kept error lines), two generated logs per rule type and the
    red-team sets `redteam` (each set one group)."""
    import random

    from tasks.diagnosis.compress import compress
    from tasks.diagnosis.corpus import ROOTS, make_log
    from tasks.diagnosis.realbench import load
    from tasks.diagnosis.rules import RULES

    base = {r.type: r for r in RULES}
    out, ids = [], []
    for lg in load("tune"):
        text = "\n".join(k.text for k in compress(lg.path).kept if k.error)
        out.append(Example(text, lg.category, lg.type, lg.restartable, lg.project))
        ids.append(lg.id)
    rng = random.Random(29)
    for kind in sorted(ROOTS):
        for j in range(2):
            lab = make_log(kind, rng, noise_lines=20)
            text = "\n".join(k.text for k in compress(lab.text.encode()).kept if k.error)
            r = base.get(kind)
            out.append(Example(text, r.category if r else "infrastructure", kind, r.restartable if r else True,
                               f"generated:{kind}"))
            ids.append(f"generated/{kind}-{j}")
    more, more_ids = redteam_examples(redteam)
    return out + more, ids + more_ids


def redteam_examples(sets: Iterable[int]) -> tuple[list[Example], list[str]]:
    """The kept error lines of every log of the red-team sets `sets`, each set one group (calibration leaves a
    whole set out at a time)."""
    from tasks.diagnosis.compress import compress

    out, ids = [], []
    for k in sets:
        root = REDTEAM / f"redteam{k}"
        for ln in (root / "manifest.jsonl").read_text().splitlines():
            if not ln.strip():
                continue
            r = json.loads(ln)
            text = "\n".join(x.text for x in compress(root / "logs" / f"{r['id']}.log").kept if x.error)
            out.append(Example(text, r["category"], r["type"], bool(r["restartable"]), f"redteam{k}"))
            ids.append(f"redteam{k}/{r['id']}")
    return out, ids


@dataclass(frozen=True)
class FallbackFit:
    """What `train` fitted and wrote (`frenzy diagnose --retrain-fallback`)."""

    examples: int
    """Labelled logs it was fitted on."""
    threshold: float
    """The calibrated similarity below which it does not answer (3 places)."""
    held_out_answered: int
    held_out_right: int
    path: str
    """The model file written."""

    def to_json(self) -> dict[str, int | float | str]:
        """The JSON object `frenzy diagnose --retrain-fallback --json` prints (fields in declaration order)."""
        return asdict(self)


def train(path: Path = MODEL) -> FallbackFit:
    """Fit on the training examples, calibrate the threshold, write the model; returns what it fitted."""
    examples, ids = training_examples()
    threshold, pairs = calibrate(examples, ids)
    model = fit(examples, ids)
    docs = [replace(d, vec={t: round(x, 4) for t, x in sorted(d.vec.items(), key=lambda kv: -kv[1])[:60]})
            for d in model.docs]
    path.write_text(json.dumps({"threshold": threshold, "k": model.k, "idf": {t: round(x, 4) for t, x in model.idf.items()},
                                "docs": [asdict(d) for d in docs]}, sort_keys=True) + "\n")
    accepted = [ok for s, ok in pairs if s >= threshold]
    return FallbackFit(examples=len(examples), threshold=round(threshold, 3), held_out_answered=len(accepted),
                       held_out_right=sum(accepted), path=str(path))


if __name__ == "__main__":
    print(json.dumps(train().to_json()))
