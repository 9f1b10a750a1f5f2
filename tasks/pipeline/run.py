"""The run of one submitted job as a record with an explicit stage, and the pure transitions between stages.

A transition takes the run and what a stage produced (an allocation, how training ended, a diagnosis) and returns the
run at its next stage; it decides, it does not act. What acts (the queue, the trainer, the node check) is a
collaborator of the driver (drive.py), so each decision here is testable in microseconds.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from cluster.ledger import Allocation
from tasks.evaluation.summary import EvalSummary
from tasks.pipeline.evaluations import EvalFailure
from tasks.pipeline.request import Recovery, SubmitRequest
from tasks.planning.plans import ResourcePlan
from tasks.stragglers.request import StragglerReport
from tasks.training.elastic import Placed, placed, relayout
from tasks.training.request import TrainResult


class Stage(StrEnum):
    SUBMITTED = "submitted"
    PLANNED = "planned"
    """Plans to place are known (the first time, MARP's; after a recovery, what the recovery chose)."""
    PLACED = "placed"
    """An allocation is held under a lease."""
    TRAINING = "training"
    RECOVERING = "recovering"
    """Training failed; the allocation is given back and the failure diagnosed."""
    TRAINED = "trained"
    RELEASED = "released"
    EVALUATED = "evaluated"
    REPORTED = "reported"
    FAILED = "failed"


TERMINAL = frozenset({Stage.REPORTED, Stage.FAILED})

NEXT: dict[Stage, frozenset[Stage]] = {
    Stage.SUBMITTED: frozenset({Stage.PLANNED}),
    Stage.PLANNED: frozenset({Stage.PLACED}),
    Stage.PLACED: frozenset({Stage.TRAINING}),
    Stage.TRAINING: frozenset({Stage.TRAINED, Stage.RECOVERING}),
    Stage.RECOVERING: frozenset({Stage.PLANNED}),
    Stage.TRAINED: frozenset({Stage.RELEASED}),
    Stage.RELEASED: frozenset({Stage.EVALUATED}),
    Stage.EVALUATED: frozenset({Stage.REPORTED}),
}
"""The transitions a run may take (any stage may also end in FAILED)."""


class TransitionError(RuntimeError):
    """A transition the state machine does not have: a bug in the driver, never a user error."""


class TrainFailure(BaseModel):
    """How a training attempt failed: the launcher's message, exit code and the tail of its log."""

    message: str
    returncode: int
    log_tail: str = ""


class TrainOutcome(BaseModel):
    """How a training attempt ended: its result, or its failure; and the checkpoints evaluated while it ran."""

    result: TrainResult | None = None
    failure: TrainFailure | None = None
    evaluations: list[EvalSummary] = []
    evaluation_failures: list[EvalFailure] = []
    """Committed steps whose in-flow evaluation failed, with the cause."""


class Attempt(BaseModel):
    """One placement of the job: where, on which plan, and where its part of the training log starts."""

    allocation: Allocation
    plan: ResourcePlan
    placed: Placed
    log_offset: int = 0
    """Size of train.log when the attempt started: its diagnosis reads only what this attempt wrote."""


class Visit(BaseModel):
    stage: Stage
    at_s: float
    """Seconds since the run was submitted."""


class Run(BaseModel):
    """One submitted job on its way through the pipeline."""

    request: SubmitRequest
    stage: Stage = Stage.SUBMITTED
    run_dir: str
    """Absolute: progress, train.log, traces, report."""
    suite: str = ""
    """The suite's own name ("" when evaluation is off)."""
    mode: str = "in-flow"
    """Where checkpoints are evaluated: in-flow, deployment or off."""
    cluster: str = ""
    plans: list[ResourcePlan] = []
    """Every runnable plan, best first (the report's table)."""
    candidates: list[ResourcePlan] = []
    """What the next placement tries, best first."""
    attempt: Attempt | None = None
    held: bool = False
    """The attempt's allocation is held (not yet released)."""
    recoveries: list[Recovery] = []
    pending_failure: TrainFailure | None = None
    result: TrainResult | None = None
    evaluations: list[EvalSummary] = []
    evaluation_failures: list[EvalFailure] = []
    stragglers: StragglerReport | None = None
    report: str | None = None
    error: str | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    visits: list[Visit] = []

    @property
    def job(self) -> str:
        return self.request.job.name

    def to(self, stage: Stage, at_s: float, **changes: object) -> Run:
        """The run at `stage`, with `changes`; a transition the machine does not have raises TransitionError."""
        if stage != Stage.FAILED and stage not in NEXT.get(self.stage, frozenset()):
            raise TransitionError(f"{self.job}: no transition {self.stage} -> {stage}")
        return self.model_copy(update={"stage": stage, "visits": [*self.visits, Visit(stage=stage, at_s=at_s)],
                                       **changes})


def planned(run: Run, plans: list[ResourcePlan], cluster: str, at_s: float) -> Run:
    """MARP's runnable plans are the first candidates."""
    return run.to(Stage.PLANNED, at_s, plans=plans, candidates=plans, cluster=cluster)


def placed_on(run: Run, alloc: Allocation, log_offset: int, at_s: float) -> Run:
    """The queue placed the job on `alloc` (on candidate `alloc.plan_index`). After a recovery, the newest recovery
    records where the job went and why (the relayout)."""
    plan = run.candidates[alloc.plan_index]
    job = run.request.job
    now = placed(plan, alloc, job.training.global_batch, job.training.micro_batch)
    recoveries = run.recoveries
    if recoveries and run.attempt is not None and recoveries[-1].relayout is None:
        last = recoveries[-1]
        why = f"{last.diagnosis.type} on {', '.join(run.attempt.placed.nodes)}"
        recoveries = [*recoveries[:-1], last.model_copy(update={
            "relayout": relayout(run.attempt.placed, now, why, last.action.kind)})]
    return run.to(Stage.PLACED, at_s, attempt=Attempt(allocation=alloc, plan=plan, placed=now, log_offset=log_offset),
                  held=True, recoveries=recoveries)


def trained(run: Run, outcome: TrainOutcome, at_s: float) -> Run:
    """Training ended: with a result the run is trained; with a failure it goes to recovery."""
    if outcome.failure is not None:
        return run.to(Stage.RECOVERING, at_s, pending_failure=outcome.failure, **_evaluated(run, outcome))
    if outcome.result is None:
        raise TransitionError(f"{run.job}: training ended with neither a result nor a failure")
    return run.to(Stage.TRAINED, at_s, result=outcome.result, pending_failure=None, **_evaluated(run, outcome))


def _evaluated(run: Run, outcome: TrainOutcome) -> dict[str, list]:
    """The run's in-flow evaluations after an attempt: scores merged by step; a failure only for a step that no
    attempt scored (a resumed attempt may score a step an earlier one could not)."""
    evals = _merge(run.evaluations, outcome.evaluations)
    ok = {e.step for e in evals}
    failed = {f.step: f for f in run.evaluation_failures} | {f.step: f for f in outcome.evaluation_failures}
    return {"evaluations": evals, "evaluation_failures": [failed[s] for s in sorted(failed) if s not in ok]}


def _merge(old: list[EvalSummary], new: list[EvalSummary]) -> list[EvalSummary]:
    """Evaluations by step, the newer one of a step kept, oldest step first."""
    by_step = {e.step: e for e in old} | {e.step: e for e in new}
    return [by_step[s] for s in sorted(by_step)]


def failure_message(job: str, failure: TrainFailure, root_cause_line: str | None, reason: str, log: str) -> str:
    """Why training stopped, in one paragraph, the cause first: the trainer's own message when it named the problem
    (a missing data.path, storage it cannot reach: a restart fails the same way), else the root-cause line the
    diagnosis found in the log; then the action decided and where the log is. The tracebacks stay in the log."""
    said = failure.message.splitlines()[0].strip() if failure.message else ""
    if said and not said.startswith(("trainer exited with code", "trainer killed")):
        return f"{job}: {said} (the trainer stopped on it; fix it and rerun; log {log})"
    cause = (root_cause_line or "").strip() or said or "the trainer failed without an error line"
    return f"{job}: training failed: {cause}. {reason}; log {log}"


def recovered(run: Run, recovery: Recovery, replanned: list[ResourcePlan] | None, at_s: float) -> Run:
    """The recovery's decision applied: `stop` fails the run with the cause; `replan` places next on the plans MARP
    gave after the out-of-memory (none: the run fails naming the fixes); `resume` places the same candidates again
    (what the node check cordoned is no longer free)."""
    failure = run.pending_failure or TrainFailure(message="", returncode=1)
    recoveries = [*run.recoveries, recovery]
    log = str(_log_path(run))
    if recovery.action.kind == "stop":
        msg = failure_message(run.job, failure, recovery.diagnosis.root_cause_line, recovery.action.reason, log)
        return run.to(Stage.FAILED, at_s, recoveries=recoveries, error=msg)
    candidates = run.candidates
    if recovery.action.kind == "replan":
        if not replanned:
            plan = run.attempt.plan if run.attempt else None
            where = f" on {plan.gpu_type} ({plan.layout.label()})" if plan else ""
            return run.to(Stage.FAILED, at_s, recoveries=recoveries, error=(
                f"{run.job}: out of memory{where}, and no plan has more memory per GPU on this cluster; lower "
                "micro_batch, enable recompute or zero_stage 3, or add GPUs with more memory"))
        candidates = replanned
    plans = run.plans if all(c in run.plans for c in candidates) else candidates
    return run.to(Stage.PLANNED, at_s, recoveries=recoveries, candidates=candidates, plans=plans,
                  pending_failure=None)


def _log_path(run: Run) -> str:
    return f"{run.run_dir.rstrip('/')}/train.log"
