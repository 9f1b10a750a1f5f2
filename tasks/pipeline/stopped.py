"""Where an interrupted `submit` stopped: one record for every front-end. The CLI prints its line when Ctrl-C or
SIGTERM ends `frenzy submit`/`demo`; a Python caller of the `submit` flow (a notebook cell interrupted) gets the same
record in `SubmitInterrupted`, a KeyboardInterrupt whose message is that line (a notebook shows it under the
cell). No Prefect here."""

from __future__ import annotations

from pydantic import BaseModel

from tasks.training import checkpoint as ck
from tasks.training.storage import Storage


class Stopped(BaseModel):
    """The newest step committed under the run's checkpoint root when it was interrupted (None: none yet)."""

    checkpoint_uri: str
    step: int | None = None

    def line(self, who: str, again: str = "rerun the same command to resume") -> str:
        where = (f"stopped at step {self.step}, committed under {self.checkpoint_uri}" if self.step is not None
                 else "stopped before the first checkpoint was committed")
        return f"{who}: {where}; {again}"


def stopped_at(checkpoint_uri: str) -> Stopped:
    """Read the root once the trainer has committed the step it was at; whatever the storage says, a record."""
    try:
        newest = ck.committed(Storage(checkpoint_uri))
    except Exception:  # noqa: BLE001 - the line must be given whatever the storage says
        newest = []
    return Stopped(checkpoint_uri=checkpoint_uri, step=newest[0].step if newest else None)


class SubmitInterrupted(KeyboardInterrupt):
    """A `submit` called from Python was interrupted: `stopped` says where, `str()` is the one line."""

    def __init__(self, stopped: Stopped) -> None:
        self.stopped = stopped
        super().__init__(stopped.line("submit", "call submit again with the same request to resume"))
