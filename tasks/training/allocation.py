"""The trainer's own hold on its ledger allocation (red team 41i N21).

The submitter renews the allocation's lease (cluster/ledger.LeaseKeeper); a submitter stopped by Ctrl-Z (SIGSTOP)
renews nothing, so after `--lease` seconds the ledger freed the GPUs and placed another job on them while this
trainer, in its own session, kept training. So rank 0 renews the lease too, every `lease_s / 3`: the allocation
lives exactly as long as the process that uses its GPUs (after the trainer exits, the submitter's heartbeat alone
holds it, as before). When a renewal finds the allocation gone (released by hand, or lapsed because this process
too was stopped or could not reach the ledger), `lost` is set with the cause: the trainer stops at the next step
boundary, commits that step and exits naming it (`AllocationLost`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import UTC, datetime

from tasks.errors import FrenzyError
from tasks.training.request import AllocationHold

log = logging.getLogger(__name__)

ENV = "FRENZY_ALLOCATION"
"""The allocation a launcher hands its trainer (an `AllocationHold` as JSON)."""


def _missing_file(ledger: str) -> str | None:
    """The path of a SQLite ledger that does not exist here; None for one that does, or a database server."""
    from pathlib import Path

    from cluster.ledger import ledger_url

    url = ledger_url(ledger)
    if not url.startswith("sqlite") or ":///" not in url or url.endswith(":memory:"):
        return None
    path = Path(url.split(":///", 1)[1]).expanduser()
    return None if path.exists() else str(path)


def lost_cause(ledger: object, url: str, allocation_id: str, lease_s: float, other: str) -> str:
    """Why allocation `allocation_id` is gone, as the ledger records it: released by hand, by its holder, released by
    hand and then lapsed, or lapsed (renewed in time by neither the submitting process nor `other`, its other
    holder)."""
    where = f"allocation {allocation_id} in the ledger {url}"
    try:
        a = ledger.allocation(allocation_id)  # type: ignore[attr-defined]
        how = ledger.how_ended(allocation_id)  # type: ignore[attr-defined]
    except Exception as err:  # noqa: BLE001 - the cause is said either way
        return f"{where} is gone ({err}); the ledger may have placed another job on its GPUs"
    if a.state == "releasing" or (a.state == "released" and released_by_hand(allocation_id)):  # red team 41p S12a
        return (f"{where} was released by hand while its trainer ran; no other job is placed on its GPUs before "
                "the trainer has stopped (or its lease lapses)")
    nobody = (f"renewed for {lease_s:.0f} s by neither the submitting process nor {other} (both were stopped, or "
              "could not reach the ledger)")
    if a.state == "released" and how.endswith("lease lapsed"):  # no one may renew it once released by hand: not
        # the submitter's fault (red team 41r: the line blamed a stopped submitter); its trainer never gave it back
        return (f"{where} was released by hand while its trainer ran, then freed as its lease lapsed: the trainer, "
                "which gives a released allocation back as it stops, never did (its processes were stopped, e.g. "
                "SIGSTOP, or could not reach the ledger), and a released allocation is renewed by no one; the ledger "
                "may have placed another job on its GPUs")
    if a.state == "released":
        return f"{where} was {how} while its trainer ran; the ledger may have placed another job on its GPUs"
    until = datetime.fromtimestamp(a.lease_expiry, UTC).strftime("%H:%M:%S UTC")
    return (f"{where} lapsed: its lease ran out at {until}, {nobody}; the ledger may have placed another job on its "
            "GPUs")


def ledger_says(ledger: str, allocation_id: str) -> str:
    """How the ledger at `ledger` records that allocation `allocation_id` ended ("" while it is held, or when the
    ledger cannot say: its file is not here, or it cannot be read)."""
    if _missing_file(ledger) is not None:
        return ""
    from cluster.ledger import Ledger

    try:
        return Ledger(ledger).how_ended(allocation_id)
    except Exception:  # noqa: BLE001 - said as unknown
        return ""


_released_at_end: dict[str, str] = {}
"""Allocations this process released as their trainer ended: the state each was in (`releasing`: by hand before)."""
_released_lock = threading.Lock()


def release_at_end(hold: AllocationHold) -> list[str]:
    """Release `hold`'s allocation now that its trainer has ended, without waiting for anything else (red team 41n
    B3: the submit flow's release came after the train task's end, which waits for the Prefect API). Noted first, so
    that the submitter's heartbeat, finding the allocation gone, knows it was this release and not a lost lease
    (`released_at_end`). The jobs the release started from the queue; [] when the ledger file is gone (opening it
    would make an empty ledger at its path) or cannot be reached: the submit flow releases it again, or its lease
    runs out."""
    from cluster.ledger import Ledger

    if _missing_file(hold.ledger) is not None:
        return []
    with _released_lock:
        _released_at_end[hold.allocation_id] = "active"
    try:
        ledger = Ledger(hold.ledger)
        was = ledger.allocation(hold.allocation_id).state
        with _released_lock:
            _released_at_end[hold.allocation_id] = was
        if was in ("released", "expired"):  # freed before the trainer ended: nothing of this process to release
            return []
        return [a.job for a in ledger.release(hold.allocation_id, by_holder=True)]
    except Exception as err:  # noqa: BLE001 - the flow's own release comes next, and the lease has its expiry
        with _released_lock:
            _released_at_end.pop(hold.allocation_id, None)
        log.warning("could not release allocation %s in %s as its trainer ended: %s", hold.allocation_id,
                    hold.ledger, err)
        return []


def released_at_end(allocation_id: str) -> bool:
    """Whether this process released `allocation_id` as its trainer ended (`release_at_end`)."""
    with _released_lock:
        return allocation_id in _released_at_end


def freed_before_end(allocation_id: str) -> bool:
    """Whether `allocation_id` had already been freed by the ledger (released, or lapsed) when `release_at_end` came
    to release it: this process released nothing."""
    with _released_lock:
        return _released_at_end.get(allocation_id) in ("released", "expired")


def released_by_hand(allocation_id: str) -> bool:
    """Whether `allocation_id`, released here as its trainer ended, had been released by hand while it ran."""
    with _released_lock:
        return _released_at_end.get(allocation_id) == "releasing"


class AllocationLost(FrenzyError, RuntimeError):
    """The trainer's allocation was released or lapsed under it; it committed its step and stopped."""


class AllocationKeeper:
    """Renews `hold`'s lease from the trainer; `lost` is set (and `cause` says why) once the allocation is gone."""

    def __init__(self, hold: AllocationHold) -> None:
        self.hold = hold
        self.lost = threading.Event()
        self.cause = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="frenzy-allocation", daemon=True)
        self.holder = f"trainer pid {os.getpid()} on {socket.gethostname()}"
        """Recorded by its renewals: a release by hand then keeps the GPUs held until this trainer stops."""
        self.clock = time.monotonic
        self.renewed_at = self.clock()
        """When the newest renewal that succeeded was asked for (this process's clock; at first: when it started)."""
        self.fencing = True
        """False where this process cannot renew (the ledger file is not on its node): the submitter's lease holds."""

    @classmethod
    def from_env(cls) -> AllocationKeeper | None:
        raw = os.environ.get(ENV)
        return cls(AllocationHold.model_validate_json(raw)) if raw else None

    def _run(self) -> None:
        from cluster.ledger import Ledger

        h = self.hold
        if (missing := _missing_file(h.ledger)) is not None:  # a Ray node that does not see the submitter's file
            log.warning("the ledger file %s is not on this node: the submitting process alone renews allocation %s",
                        missing, h.allocation_id)  # (opening it would make an empty ledger that knows no allocation)
            self.fencing = False
            return
        ledger = Ledger(h.ledger)
        while True:
            try:
                asked = self.clock()
                if not ledger.renew(h.allocation_id, h.lease_s, holder=self.holder):
                    self.cause = self._why(ledger)
                    log.error("%s", self.cause)
                    self.lost.set()
                    return
                self.renewed_at = max(self.renewed_at, asked)
            except Exception as err:  # a busy or unreachable ledger: the lease has slack for two more beats
                log.warning("could not renew allocation %s in %s: %s", h.allocation_id, h.ledger, err)
            if self._stop.wait(h.lease_s / 3):
                return

    def _why(self, ledger: object) -> str:
        return lost_cause(ledger, self.hold.ledger, self.hold.allocation_id, self.hold.lease_s, "this trainer")

    def fence(self, step: int, newest: int | None) -> None:
        """Before a step or a commit: raise `AllocationLost` once this process's own clock says its newest successful
        renewal is older than the lease (the whole process tree was stopped past it, or the ledger unreachable): the
        ledger may have given the GPUs to another job, so not one more step or commit is made on them."""
        age = self.clock() - self.renewed_at
        if not self.fencing or age <= self.hold.lease_s:
            return
        h = self.hold
        how = ledger_says(h.ledger, h.allocation_id)
        said = (f"the ledger records it {how}" if how else
                "the ledger may free its GPUs for another job at any moment")
        again = (f"resume from step {newest}" if newest is not None else "start it again (no step was committed)")
        raise AllocationLost(
            f"allocation {h.allocation_id} in the ledger {h.ledger} lapsed: this trainer's newest renewal was "
            f"{age:.1f} s ago, longer than its {h.lease_s:g} s lease (its processes were stopped, or could not reach "
            f"the ledger); {said}. Training stopped at step {step} without another step or commit, so as not to use "
            f"GPUs it no longer holds; rerun the same command to place the job again and {again}")

    def message(self, step: int) -> str:
        """The trainer's last line once `lost`: the cause, the step it committed and how to go on."""
        return (f"{self.cause}. Training stopped at step {step} after committing it, so as not to share the GPUs; "
                f"rerun the same command to place the job again and resume from step {step}")

    def __enter__(self) -> AllocationKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
