"""Where an interrupted `submit` stopped: one record for every front-end. The CLI prints its line when Ctrl-C or
SIGTERM ends `frenzy submit`/`demo`; a Python caller of the `submit` flow (a notebook cell interrupted) gets the same
record in `SubmitInterrupted`, a KeyboardInterrupt whose message is that line (a notebook shows it under the
cell). No Prefect here."""

from __future__ import annotations

import threading
from pathlib import Path

from pydantic import BaseModel

from tasks.training import checkpoint as ck
from tasks.training.storage import Storage

PHASES = ("planning", "queued", "training", "evaluating")
"""Where a run of this process is (`reached`): planning (reading the job, MARP; nothing asked of the ledger yet),
queued (waiting for GPUs in the ledger's queue: no trainer, no GPUs), training, evaluating (training over, GPUs back)."""


class Stopped(BaseModel):
    """The newest step committed under the run's checkpoint root when it was interrupted (None: none yet), and where
    the run was (a PHASES word; "" when this process did not say, as for a caller that never ran the flow)."""

    checkpoint_uri: str
    step: int | None = None
    trained: bool = False
    """Training had ended and its GPUs were released: only the wait for the evaluations (or the report) was cut."""
    phase: str = ""

    def line(self, who: str, again: str = "rerun the same command to resume") -> str:
        newest = f" (its newest committed step is {self.step}, under {self.checkpoint_uri})" if self.step is not None else ""
        start = again if self.step is not None else again.replace("to resume", "to start it")
        if self.phase == "planning":
            return f"{who}: stopped while planning, before it asked for GPUs: nothing was queued or trained{newest}; {start}"
        if self.phase == "queued":
            return (f"{who}: stopped while queued for GPUs: no trainer had started and no GPUs were held, and its place "
                    f"in the queue is given up{newest}; {start}")
        if self.trained or self.phase == "evaluating":
            return (f"{who}: training had finished (step {self.step}, committed under {self.checkpoint_uri}; its GPUs "
                    "were released); only the wait for the evaluations and the report was cut: the evaluation runs already started go "
                    "on, and a step left without a score is scored by the scheduled `evaluate-pending` run (now: "
                    "`prefect deployment run evaluate-pending/evaluate-pending`); "
                    f"{again.replace('to resume', 'to wait for the scores and write the report')}")
        if self.step is not None:
            return f"{who}: stopped at step {self.step}, committed under {self.checkpoint_uri}; {again}"
        if self.phase == "training":
            return f"{who}: stopped while training, before its first checkpoint was committed; {start}"
        return f"{who}: stopped before the first checkpoint was committed; {again}"


AFTER_TRAINING = ("released", "evaluated")
"""The stages (tasks/pipeline/run.py) of a run whose training has ended and whose GPUs are back."""


_phase: dict[str, str] = {}
"""The phase each job of this process reached last (`reached`)."""

_trainer_ended: dict[str, str] = {}
"""Jobs whose trainer finished in this process, with the id of the allocation it trained on: while the in-flow
evaluations of the last checkpoints run the run's record still says `training`, although training is over."""
_ended_lock = threading.Lock()


def reached(job: str, phase: str) -> None:
    """`job`'s run in this process is now in `phase` (one of PHASES)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
    with _ended_lock:
        _phase[job] = phase


def any_reached() -> bool:
    """Whether a run of this process said where it was (a stop after it, while its result is printed, was no stop of
    the run)."""
    with _ended_lock:
        return bool(_phase)


def phase_of(job: str) -> str:
    """The phase `job`'s run in this process reached last; "" when none was said."""
    with _ended_lock:
        return _phase.get(job, "")


def trainer_ended(job: str, allocation_id: str | None) -> None:
    """The trainer of `job` returned its result (None: a new attempt starts; what an earlier one ended is forgotten)."""
    with _ended_lock:
        if allocation_id is None:
            _trainer_ended.pop(job, None)
        else:
            _trainer_ended[job] = allocation_id


def stopped_at(checkpoint_uri: str, ledger: str | None = None, job: str = "") -> Stopped:
    """Read the root once the trainer has committed the step it was at; whatever the storage says, a record. With the
    run's `ledger` and `job` name, a run stopped after its training ended says so: its record's stage, or (while
    in-flow evaluations run) its trainer having finished here and the ledger having released its allocation."""
    try:
        newest = ck.committed(Storage(checkpoint_uri))
    except Exception:  # noqa: BLE001 - the line must be given whatever the storage says
        newest = []
    phase = phase_of(job) if job else ""
    trained = bool(job) and phase not in ("planning", "queued") and (
        _stage(ledger, job, checkpoint_uri) in AFTER_TRAINING or _ended_here(ledger, job))
    return Stopped(checkpoint_uri=checkpoint_uri, step=newest[0].step if newest else None, trained=trained, phase=phase)


def _ended_here(ledger: str | None, job: str) -> bool:
    """Whether `job`'s trainer finished in this process and the ledger records its allocation as released."""
    with _ended_lock:
        allocation_id = _trainer_ended.get(job)
    if allocation_id is None or _no_file(ledger):
        return False
    from cluster.ledger import Ledger

    try:
        return Ledger(ledger).allocation(allocation_id).state == "released"
    except Exception:  # noqa: BLE001 - the line must be given whatever the ledger says
        return False


def _no_file(ledger: str | None) -> bool:
    """A SQLite ledger whose file is not there (opening it would make one)."""
    from cluster.ledger import ledger_url

    url = ledger_url(ledger)
    return url.startswith("sqlite:///") and not Path(url.split(":///", 1)[1]).expanduser().is_file()


def _stage(ledger: str | None, job: str, checkpoint_uri: str) -> str:
    """The ledger's stage of the run of `job` at `checkpoint_uri`; "" when it cannot be read (never made here)."""
    from cluster.ledger import Ledger
    from tasks.pipeline.summary import this_run

    if _no_file(ledger):
        return ""
    try:
        rec = this_run(Ledger(ledger).runs(job), checkpoint_uri or None)
    except Exception:  # noqa: BLE001 - the line must be given whatever the ledger says
        return ""
    return rec.stage if rec is not None else ""


class SubmitInterrupted(KeyboardInterrupt):
    """A `submit` called from Python was interrupted: `stopped` says where, `str()` is the one line."""

    def __init__(self, stopped: Stopped) -> None:
        self.stopped = stopped
        super().__init__(stopped.line("submit", "call submit again with the same request to resume"))
