"""Where an interrupted `submit` stopped: one record for every front-end. The CLI prints its line when Ctrl-C or
SIGTERM ends `frenzy submit`/`demo`; a Python caller of the `submit` flow (a notebook cell interrupted) gets the same
record in `SubmitInterrupted`, a KeyboardInterrupt whose message is that line (a notebook shows it under the
cell). No Prefect here."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from tasks.training import checkpoint as ck
from tasks.training.storage import Storage


class Stopped(BaseModel):
    """The newest step committed under the run's checkpoint root when it was interrupted (None: none yet)."""

    checkpoint_uri: str
    step: int | None = None
    trained: bool = False
    """Training had ended and its GPUs were released: only the wait for the evaluations (or the report) was cut."""

    def line(self, who: str, again: str = "rerun the same command to resume") -> str:
        if self.trained:
            return (f"{who}: training had finished (step {self.step}, committed under {self.checkpoint_uri}; its GPUs "
                    "were released); only the wait for the evaluations and the report was cut: the evaluation runs already started go "
                    "on, and a step left without a score is scored by the scheduled `evaluate-pending` run (now: "
                    "`prefect deployment run evaluate-pending/evaluate-pending`); "
                    f"{again.replace('to resume', 'to wait for the scores and write the report')}")
        where = (f"stopped at step {self.step}, committed under {self.checkpoint_uri}" if self.step is not None
                 else "stopped before the first checkpoint was committed")
        return f"{who}: {where}; {again}"


AFTER_TRAINING = ("released", "evaluated")
"""The stages (tasks/pipeline/run.py) of a run whose training has ended and whose GPUs are back."""


def stopped_at(checkpoint_uri: str, ledger: str | None = None, job: str = "") -> Stopped:
    """Read the root once the trainer has committed the step it was at; whatever the storage says, a record. With the
    run's `ledger` and `job` name, a run stopped after its training ended says so (its record's stage)."""
    try:
        newest = ck.committed(Storage(checkpoint_uri))
    except Exception:  # noqa: BLE001 - the line must be given whatever the storage says
        newest = []
    return Stopped(checkpoint_uri=checkpoint_uri, step=newest[0].step if newest else None,
                   trained=bool(job) and _stage(ledger, job, checkpoint_uri) in AFTER_TRAINING)


def _stage(ledger: str | None, job: str, checkpoint_uri: str) -> str:
    """The ledger's stage of the run of `job` at `checkpoint_uri`; "" when it cannot be read (never made here)."""
    from cluster.ledger import Ledger, ledger_url
    from tasks.pipeline.summary import this_run

    url = ledger_url(ledger)
    if url.startswith("sqlite:///") and not Path(url.split(":///", 1)[1]).expanduser().is_file():
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
