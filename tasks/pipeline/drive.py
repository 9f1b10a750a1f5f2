"""The driver of a run: one transition per step, each stage's work done by a collaborator (`Stages`), the GPUs
released on every exit path. `flows/submit.py` passes Prefect tasks as the collaborator; tests pass fakes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from cluster.ledger import Allocation
from tasks.diagnosis.diagnose import Diagnosis
from tasks.diagnosis.recovery import decide
from tasks.evaluation.summary import EvalSummary
from tasks.pipeline.evaluations import EvalFailure
from tasks.pipeline.request import Recovery
from tasks.pipeline.run import TERMINAL, Run, Stage, TrainFailure, TrainOutcome, placed_on, planned, recovered, trained
from tasks.planning.plans import ResourcePlan
from tasks.stragglers.request import StragglerReport


class Stages(Protocol):
    """What the driver needs done; each method is one stage's work (a Prefect task in the flow)."""

    def plan(self, run: Run) -> tuple[list[ResourcePlan], str]:
        """MARP's runnable plans, best first, and the cluster's name."""

    def place(self, run: Run) -> Allocation:
        """Wait in the queue until HAS places one of `run.candidates`."""

    def log_size(self, run: Run) -> int:
        """The size of the run's train.log now (where the next attempt's part of it starts)."""

    def train(self, run: Run) -> TrainOutcome:
        """Train on the attempt's allocation under its lease; checkpoints evaluated in-flow as they commit."""

    def release(self, run: Run) -> None:
        """Give the attempt's GPUs back to the ledger."""

    def diagnose(self, run: Run, failure: TrainFailure) -> Diagnosis:
        """The failed attempt's part of the log, diagnosed."""

    def announce(self, run: Run, recovery: Recovery) -> None:
        """Make the recovery visible (artifact, event, log)."""

    def check_nodes(self, run: Run) -> None:
        """The two-round node check of the attempt's nodes; faulty ones cordoned."""

    def replan(self, run: Run, diagnosis: Diagnosis) -> list[ResourcePlan]:
        """After an out-of-memory: record it for MARP and plan again (the runnable plans; empty if none fits)."""

    def evaluations(self, run: Run) -> tuple[list[EvalSummary], list[EvalFailure]]:
        """Every committed step's evaluation (in-flow: what training left to do; deployment: the triggered runs),
        and the steps whose evaluation failed."""

    def analyse(self, run: Run) -> StragglerReport | None:
        """The straggler analysis of the run's op trace (None when there is none, or it cannot be used)."""

    def report(self, run: Run) -> str:
        """Write the run report; its path."""

    def record(self, run: Run) -> None:
        """The run reached a new stage (persist it, emit an event); called after every transition."""


def _timed(run: Run, key: str, clock: Callable[[], float], t0: float) -> None:
    run.timings_s[key] = run.timings_s.get(key, 0.0) + clock() - t0


def _recover(run: Run, s: Stages, at: Callable[[], float]) -> Run:
    """Release the failed attempt's GPUs, diagnose its log, decide, act on the decision."""
    failure = run.pending_failure or TrainFailure(message="", returncode=1)
    d = s.diagnose(run, failure)
    rec = Recovery(diagnosis=d, action=decide(d, len(run.recoveries), run.request.max_restarts))
    s.announce(run, rec)
    if rec.action.kind == "stop":
        return recovered(run, rec, None, at())
    if rec.action.node_check:
        s.check_nodes(run)
    replanned = s.replan(run, d) if rec.action.kind == "replan" else None
    return recovered(run, rec, replanned, at())


def advance(run: Run, s: Stages, clock: Callable[[], float], t0: float) -> Run:
    """One transition of `run`."""
    def at() -> float:
        return clock() - t0

    t = clock()
    match run.stage:
        case Stage.SUBMITTED:
            plans, cluster = s.plan(run)
            run = planned(run, plans, cluster, at())
            _timed(run, "plan", clock, t)
        case Stage.PLANNED:
            offset = s.log_size(run)
            run = placed_on(run, s.place(run), offset, at())
            _timed(run, "queue", clock, t)
        case Stage.PLACED:
            run = run.to(Stage.TRAINING, at())
        case Stage.TRAINING:
            run = trained(run, s.train(run), at())
            _timed(run, "train+evaluate", clock, t)
        case Stage.RECOVERING:
            _release(run, s)
            run = _recover(run, s, at)
        case Stage.TRAINED:
            _release(run, s)
            run = run.to(Stage.RELEASED, at())
        case Stage.RELEASED:
            summaries, failures = s.evaluations(run)
            run = run.to(Stage.EVALUATED, at(), evaluations=summaries, evaluation_failures=failures)
            _timed(run, "evaluate", clock, t)
        case Stage.EVALUATED:
            strag = s.analyse(run)
            _timed(run, "stragglers", clock, t)
            run = run.model_copy(update={"stragglers": strag})
            run.timings_s["total"] = at()
            run = run.to(Stage.REPORTED, at(), report=s.report(run))
    return run


def _release(run: Run, s: Stages) -> None:
    if run.held:
        s.release(run)
        run.held = False


def drive(run: Run, s: Stages, clock: Callable[[], float] = time.monotonic) -> Run:
    """Advance `run` until it is reported or failed, recording each stage. Whatever ends the loop (a stage's error,
    a cancellation, Ctrl-C), an allocation still held is released first."""
    t0 = clock()
    try:
        while run.stage not in TERMINAL:
            run = advance(run, s, clock, t0)
            s.record(run)
    finally:
        _release(run, s)
    return run
