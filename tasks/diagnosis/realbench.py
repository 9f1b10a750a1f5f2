"""The real-log benchmark of issue 29: failure logs posted in public issue threads, labelled from their threads
(`tests/data/diagnosis/real/manifest.jsonl`, provenance in its PROVENANCE.md), split by project into a tune half
and a test half, and the scores of a diagnosis on either half.

The split is fixed by a hash of the project (the GitHub repository), decided before any result was looked at: a
project is in the test half when sha256(owner/name, lower-case) is odd. Rules and the learned fallback are tuned
on the tune half only; figures are reported on the test half. No Prefect here.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REAL = Path(__file__).resolve().parents[2] / "tests" / "data" / "diagnosis" / "real"
CATEGORIES = ("infrastructure", "framework", "script")
FAMILIES = ("chain", "divergence", "network", "environment")
"""The four families of issue 45's misses, each defined from the label and the log's text, never from the rules:
`chain`: the log holds a wrapper and a cause (a chain marker below); `divergence`: labelled NumericalError or
LossScaleError; `network`: labelled an infrastructure network fault (NETWORK); `environment`: labelled script (the
user's code, configuration and installed software)."""
NETWORK = frozenset({"NetworkError", "NCCLRemoteError", "ConnectionError", "NCCLTimeoutError"})
DIVERGENCE = frozenset({"NumericalError", "LossScaleError"})
CHAIN_MARKER = re.compile(r"Last error:|direct cause of the following exception|Original Traceback|terminated with the "
                          r"following error|because of the following error|Caused by:|what\(\):|Original reason for "
                          r"failure was|RemoteTraceback|RayTaskError")
"""Text that shows a wrapper and its cause in one log (NCCL, Python, torch's worker re-raise, C++, Ray)."""


@dataclass(frozen=True)
class RealLog:
    id: str
    project: str
    url: str
    type: str
    category: str
    restartable: bool
    root_line: str
    label_source: str
    trim: str

    @property
    def path(self) -> Path:
        return REAL / f"{self.id}.log"

    @property
    def half(self) -> str:
        return half_of(self.project)


def half_of(project: str) -> str:
    """`test` or `tune`: the fixed split by project."""
    return "test" if int(hashlib.sha256(project.lower().encode()).hexdigest(), 16) % 2 else "tune"


def load(half: str | None = None, root: Path = REAL) -> list[RealLog]:
    """The labelled logs of one half (`tune`, `test`) or all of them."""
    rows = [RealLog(**json.loads(ln)) for ln in (root / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    return [r for r in rows if half is None or r.half == half]


@dataclass
class Outcome:
    log: RealLog
    category: str
    type: str
    root_cause_line: str | None
    restartable: bool
    source: str
    via: str = "line"
    seconds: float = 0.0

    @property
    def right(self) -> bool:
        return self.category_ok and self.root_ok

    @property
    def category_ok(self) -> bool:
        return self.category == self.log.category

    @property
    def root_ok(self) -> bool:
        return bool(self.root_cause_line) and self.log.root_line.strip() in self.root_cause_line

    @property
    def unknown(self) -> bool:
        return self.category == "unknown"


@dataclass
class Score:
    n: int
    category_accuracy: float
    root_line_accuracy: float
    unknown_rate: float
    restart_accuracy: float
    precision: dict[str, float]
    recall: dict[str, float]
    by_project: dict[str, tuple[int, int]] = field(default_factory=dict)
    """project -> (logs, category right)"""
    by_type: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """labelled type -> (logs, category right, root line right)"""
    families: dict[str, FamilyScore] = field(default_factory=dict)
    seconds_per_log: float = 0.0
    """Mean time of one diagnosis (compression included, imports not), in this process."""
    seconds_p95: float = 0.0


@dataclass
class FamilyScore:
    """One family (FAMILIES): `logs` in it by label and text, `said` answered as it by the diagnosis; a right answer
    has the category and the root-cause line right. Precision: right among `said`; recall: right among `logs`."""

    logs: int
    said: int
    precision: float
    recall: float


def in_family(lg: RealLog, family: str) -> bool:
    """Whether a labelled log belongs to a family (FAMILIES), from its label and text."""
    if family == "chain":
        return bool(CHAIN_MARKER.search(lg.path.read_text(errors="replace")))
    if family == "divergence":
        return lg.type in DIVERGENCE
    if family == "network":
        return lg.category == "infrastructure" and lg.type in NETWORK
    return lg.category == "script"


def said_family(o: Outcome, family: str) -> bool:
    """Whether the diagnosis answered a log as a member of a family."""
    if family == "chain":
        return o.via == "chain"
    if family == "divergence":
        return o.type in DIVERGENCE
    if family == "network":
        return o.category == "infrastructure" and o.type in NETWORK
    return o.category == "script"


def family_scores(outcomes: list[Outcome]) -> dict[str, FamilyScore]:
    out = {}
    for fam in FAMILIES:
        truth = [o for o in outcomes if in_family(o.log, fam)]
        said = [o for o in outcomes if said_family(o, fam)]
        out[fam] = FamilyScore(len(truth), len(said),
                               sum(o.right and in_family(o.log, fam) for o in said) / len(said) if said else 1.0,
                               sum(o.right for o in truth) / len(truth) if truth else 1.0)
    return out


def score(outcomes: list[Outcome]) -> Score:
    n = max(1, len(outcomes))
    precision, recall = {}, {}
    for c in CATEGORIES:
        said = [o for o in outcomes if o.category == c]
        truth = [o for o in outcomes if o.log.category == c]
        precision[c] = sum(o.category_ok for o in said) / len(said) if said else 1.0
        recall[c] = sum(o.category_ok for o in truth) / len(truth) if truth else 1.0
    times = sorted(o.seconds for o in outcomes)
    proj: Counter = Counter()
    proj_ok: Counter = Counter()
    types: dict[str, list[int]] = {}
    for o in outcomes:
        proj[o.log.project] += 1
        proj_ok[o.log.project] += o.category_ok
        t = types.setdefault(o.log.type, [0, 0, 0])
        t[0] += 1
        t[1] += o.category_ok
        t[2] += o.root_ok
    return Score(n=len(outcomes), category_accuracy=sum(o.category_ok for o in outcomes) / n,
                 root_line_accuracy=sum(o.root_ok for o in outcomes) / n,
                 unknown_rate=sum(o.unknown for o in outcomes) / n,
                 restart_accuracy=sum(o.restartable == o.log.restartable for o in outcomes if not o.unknown) / n,
                 precision=precision, recall=recall, by_project={p: (proj[p], proj_ok[p]) for p in sorted(proj)},
                 by_type={t: tuple(v) for t, v in sorted(types.items())}, families=family_scores(outcomes),
                 seconds_per_log=sum(times) / n, seconds_p95=times[int(0.95 * (len(times) - 1))] if times else 0.0)


def run(logs: list[RealLog], diagnose_fn: Callable) -> list[Outcome]:
    """Diagnose every log with `diagnose_fn` (`tasks.diagnosis.diagnose.diagnose`, or a variant of it: passed in, as
    the diagnosis itself reads this corpus to vet learned rules and this module stays below it)."""
    out = []
    for lg in logs:
        t0 = time.perf_counter()
        d = diagnose_fn(lg.path)
        out.append(Outcome(lg, d.category, d.type, d.root_cause_line, d.restartable, d.source,
                           getattr(d, "via", "line"), time.perf_counter() - t0))
    return out
