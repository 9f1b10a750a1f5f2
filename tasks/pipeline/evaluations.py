"""The run's evaluations: in-flow (each checkpoint evaluated in the run as it commits, oldest first) and the scores
that other runs (the commit-triggered deployment) wrote to the history. No Prefect here: the evaluation itself is
a callable."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tasks.evaluation import history
from tasks.evaluation.record import EvalSummary
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage


def step_uri(root: str, step: int) -> str:
    return f"{root.rstrip('/')}/{ck.step_dir(step)}"


def scored(history_dir: str, run: str, suite: str) -> dict[int, EvalSummary]:
    """The steps of `run` the history already scores on `suite` (evaluated earlier, or by another run)."""
    out = {}
    for e in history.read(history_dir, run, suite):
        res = Path(history_dir) / run / ck.step_dir(e["step"]) / suite / "result.json"
        out[e["step"]] = EvalSummary(uri=e["uri"], run=run, step=e["step"], suite=suite, scores=e["scores"],
                                     makespan_s=0.0, predicted_makespan_s=0.0, result=str(res), history_plot=None)
    return out


class InFlowEvaluator:
    """Evaluates each newly committed checkpoint under `root`, oldest first, when asked (`catch_up`); steps the
    history already has (a resumed job) are not evaluated again, and one that cannot be evaluated is reported once
    and skipped: it does not fail the job."""

    def __init__(self, root: str, history_dir: str, run: str, suite: str, evaluate: Callable[[str], EvalSummary],
                 warn: Callable[[str], None]) -> None:
        self.root, self.evaluate, self.warn = root, evaluate, warn
        self.done: dict[int, EvalSummary] = scored(history_dir, run, suite)
        self.missed: set[int] = set()

    def catch_up(self) -> None:
        todo = sorted(m.step for m in ck.committed(Storage(self.root)) if m.step not in self.done and m.step not in self.missed)
        for step in todo:
            try:
                self.done[step] = self.evaluate(step_uri(self.root, step))
            except Exception as err:  # noqa: BLE001 - one checkpoint that cannot be evaluated does not fail the job
                self.missed.add(step)
                self.warn(f"evaluation of step {step} failed: {err} (retention may have removed it: raise "
                          "training.checkpoint.keep to evaluate every checkpoint)")

    def summaries(self) -> list[EvalSummary]:
        return [self.done[s] for s in sorted(self.done)]


def collect_scores(read: Callable[[], dict[int, EvalSummary]], steps: list[int], timeout_s: float,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> dict[int, EvalSummary]:
    """deployment mode: the scores the event-triggered evaluations wrote to the history, waiting (at most
    `timeout_s`) until every committed step in `steps` has one. The runs finish in any order: the final step's
    score can land before an earlier step's."""
    deadline = clock() + timeout_s
    while True:
        found = read()
        if set(steps) <= set(found) or clock() > deadline:
            return found
        sleep(2.0)
