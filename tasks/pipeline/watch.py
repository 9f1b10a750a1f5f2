"""The watch over a running trainer: a hang (no progress record for `hang_s`) kills it, a lost lease stops it after
it commits, and each poll gives the in-flow evaluator its turn. Whatever ends the watch early (Ctrl-C, a
cancellation), the trainer is asked to commit its step and stop before the error goes on. No Prefect here: the
trainer is behind `Handle`, the clock is injected."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cluster.ledger import LeaseLost


class Handle(Protocol):
    """A running trainer."""

    def done(self) -> bool: ...

    def wait(self, timeout_s: float | None) -> None:
        """Return when the trainer is done or `timeout_s` passed."""


@dataclass
class Controls:
    """How the watch talks to the trainer and what it watches."""

    progress_size: Callable[[], int]
    """Bytes of the trainer's progress records so far (a growing file)."""
    kill: Callable[[str], None]
    """Kill a hung trainer (it cannot commit); the reason goes to its log for the diagnosis."""
    stop: Callable[[], None]
    """Ask the trainer to commit its current step and exit."""
    lease_lost: Callable[[], bool]
    on_poll: Callable[[], None] | None = None
    """The in-flow evaluator's turn (evaluate what committed since the last poll)."""


STARTUP_S = 300.0
"""Before its first progress record a trainer is starting (imports, building the model, reading a checkpoint,
which can take minutes on a loaded or slow node): it counts as hung only after max(hang_s, STARTUP_S)."""

STOP_GRACE_S = 120.0
"""How long a trainer asked to stop is given to commit its step, when the watch itself is being ended."""


def watch(handle: Handle, c: Controls, job: str, hang_s: float, clock: Callable[[], float] = time.monotonic,
          poll_s: float = 2.0) -> None:
    """Watch `handle` until the trainer is done. Raises LeaseLost (after the trainer stopped) when the lease is."""
    first_size, last_change = c.progress_size(), clock()  # a resume appends to the last attempt's records
    last_size, started = first_size, False
    try:
        while not handle.done():
            size = c.progress_size()
            limit = hang_s if started else max(hang_s, STARTUP_S)
            if size != last_size:
                last_size, last_change, started = size, clock(), True
            elif clock() - last_change > limit:
                c.kill(f"no progress record for {limit:.0f} s" + ("" if started else " since it started"))
                last_change = clock()
            if c.lease_lost():
                c.stop()
                handle.wait(None)
                raise LeaseLost(f"{job}: the allocation's lease was lost while training; training was stopped after "
                                "committing its step")
            if c.on_poll is not None:
                c.on_poll()
            handle.wait(poll_s)
    except BaseException:
        if not handle.done():  # Ctrl-C, a cancellation, an evaluator's crash: commit first, then let it go on
            c.stop()
            with contextlib.suppress(Exception):
                handle.wait(STOP_GRACE_S)
        raise
