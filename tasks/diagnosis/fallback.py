"""The learned fallback of the diagnosis (issue 29): for a log no rule explains, the nearest labelled log by TF-IDF
cosine over its kept error lines, answered only when that similarity clears a threshold calibrated on held-out
projects; below it the answer stays `unknown` (a person must look).

No dependency: a few hundred sparse vectors, pure Python. The model is `fallback_model.json` next to this file,
trained on the real-log benchmark's tune half (never its test half) and two generated logs of each rule type;
`frenzy diagnose --retrain-fallback` (or `python -m tasks.diagnosis.fallback`) rebuilds it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

MODEL = Path(__file__).with_name("fallback_model.json")
_TOKEN = re.compile(r"[a-z][a-z_]{2,}")
_NOISE = re.compile(r"(?:/|\\)[^\s'\"]+|0x[0-9a-f]+|\d+")  # paths, addresses and numbers say nothing of the cause
TARGET_PRECISION = 0.9


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


class Fallback:
    def __init__(self, idf: dict[str, float], docs: list[Neighbour], threshold: float) -> None:
        self.idf, self.docs, self.threshold = idf, docs, threshold

    @classmethod
    def load(cls, path: Path = MODEL) -> Fallback | None:
        try:
            d = json.loads(path.read_text())
            return cls(d["idf"], [Neighbour(**n) for n in d["docs"]], float(d["threshold"]))
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

    def predict(self, lines: list[tuple[int, str]]) -> Verdict | None:
        """The verdict for a log's kept error lines ((line number, text)), or None below the threshold."""
        score, doc = self.nearest("\n".join(t for _, t in lines))
        if doc is None or score < self.threshold:
            return None
        # the cause's line: the kept line that shares the most weight with the neighbour
        best = max(lines, key=lambda lt: _cos(_vector(Counter(tokens(lt[1])), self.idf), doc.vec), default=None)
        return Verdict(doc.category, doc.type, doc.restartable, round(score, 3),
                       best[1].strip() if best else None, best[0] if best else None, doc.id)


def fit(examples: list[Example], ids: list[str]) -> Fallback:
    """The model of `examples` (labelled `ids`), its threshold left at 0 (`calibrate` sets it)."""
    df: Counter = Counter()
    counts = [Counter(tokens(e.text)) for e in examples]
    for c in counts:
        df.update(c.keys())
    n = len(examples)
    idf = {t: math.log((1 + n) / (1 + k)) + 1 for t, k in df.items() if k < n}
    docs = [Neighbour(i, e.category, e.type, e.restartable, _vector(c, idf))
            for i, e, c in zip(ids, examples, counts, strict=True)]
    return Fallback(idf, docs, 0.0)


def calibrate(examples: list[Example], ids: list[str]) -> tuple[float, list[tuple[float, bool]]]:
    """Leave one project out: the similarity of each example to its nearest other-project neighbour and whether
    that neighbour's category is right; the threshold is the lowest similarity above which the answers reach
    TARGET_PRECISION."""
    pairs = []
    for g in sorted({e.group for e in examples}):
        train = [(e, i) for e, i in zip(examples, ids, strict=True) if e.group != g]
        model = fit([e for e, _ in train], [i for _, i in train])
        for e in examples:
            if e.group == g:
                s, d = model.nearest(e.text)
                pairs.append((s, d is not None and d.category == e.category))
    pairs.sort(reverse=True)
    threshold, right = 1.0, 0
    for k, (s, ok) in enumerate(pairs, 1):
        right += ok
        if right / k >= TARGET_PRECISION:
            threshold = s
    return threshold, pairs


def training_examples() -> tuple[list[Example], list[str]]:
    """The tune half of the real-log benchmark (kept error lines) and two generated logs per rule type."""
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
    path.write_text(json.dumps({"threshold": threshold, "idf": {t: round(x, 4) for t, x in model.idf.items()},
                                "docs": [asdict(d) for d in docs]}, sort_keys=True) + "\n")
    accepted = [ok for s, ok in pairs if s >= threshold]
    return FallbackFit(examples=len(examples), threshold=round(threshold, 3), held_out_answered=len(accepted),
                       held_out_right=sum(accepted), path=str(path))


if __name__ == "__main__":
    print(json.dumps(train().to_json()))
