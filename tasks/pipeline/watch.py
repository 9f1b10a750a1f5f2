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
    lost_cause: Callable[[], str] | None = None
    """Why the allocation is gone (released, or lapsed), as the ledger records it; asked once it is lost."""
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
                cause = c.lost_cause() if c.lost_cause is not None else (
                    "the allocation's lease lapsed while training: neither this process nor its trainer renewed it in "
                    "time (both were stopped, e.g. Ctrl-Z, or could not reach the ledger), so the ledger may have "
                    "given its GPUs to another job")
                raise LeaseLost(f"{job}: {cause}; training was stopped after committing its step")
            turn_s = 0.0
            if c.on_poll is not None:
                t = clock()
                c.on_poll()
                turn_s = clock() - t
            # a turn as long as a poll or longer (an evaluation): the next look is now, a step may have committed since
            handle.wait(0.0 if turn_s >= poll_s else poll_s)
    except BaseException:  # Ctrl-C, a cancellation, an evaluator's crash: commit first, then let it go on
        stop_and_wait(handle, c, clock)
        raise


KILL_WAIT_S = 60.0
"""How long a trainer that was killed (it did not stop when asked) is given to be gone."""

SAME_STOP_S = 5.0
"""A second interrupt this soon after the first is the same stop signalled twice (`timeout` signals the process and
then its process group; a terminal's Ctrl-C reaches the group): the trainer is still given its commit."""


def stop_and_wait(handle: Handle, c: Controls, clock: Callable[[], float] = time.monotonic) -> None:
    """Ask the trainer to commit its step and stop, and return only when it has ended: its GPUs are released after
    this, never while it still writes on them (red team 41g S08b). Every step here survives a further interrupt: a
    SIGTERM that arrives twice (`timeout` signals the process, then its group) used to land while the stop was being
    asked and left the trainer training. An interrupt later than SAME_STOP_S after the first (someone insisting), or a
    trainer still running after STOP_GRACE_S, kills it; it keeps what it committed."""
    t0, asked = clock(), False
    why = f"asked to stop, still running after {STOP_GRACE_S:.0f} s"
    while clock() - t0 < STOP_GRACE_S:
        try:
            if handle.done():
                return
            if not asked:
                c.stop()
                asked = True
            handle.wait(min(2.0, STOP_GRACE_S - (clock() - t0)))
        except BaseException:  # noqa: BLE001 - the first interrupt goes on after this; this one is said as the reason
            if asked and clock() - t0 >= SAME_STOP_S:
                why = "interrupted again while it committed its step"
                break
    killed, deadline = False, clock() + KILL_WAIT_S
    while clock() < deadline:
        with contextlib.suppress(BaseException):  # noqa: BLE001 - it is being killed: a further signal waits for that
            if handle.done():
                return
            if not killed:
                c.kill(why)
                killed = True
            handle.wait(2.0)
