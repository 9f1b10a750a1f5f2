"""One writer per checkpoint root: a lease object `writer.json` at the root, held by rank 0 of the training run.

Two trainers on one root (an orphan beside a `--resume`, or two jobs given the same `checkpoint.uri`) delete and
overwrite each other's steps. The lease names its holder (host, pid, process start time, run) and an expiry that a
heartbeat thread moves forward every `ttl_s / 3`. Acquiring:
- no lease, or an expired one: take it (a fresh lease is created only-if-absent, so two starters cannot both win);
- a live lease of another process: refuse, naming it; on the same host a holder whose process is gone (dead, a
  zombie, or a reused pid) is stale and is taken over at once, so a restart after a crash need not wait the TTL.
- a live lease whose holder is an orphan (same host, its launcher recorded in the lease is dead) that is committing
  its last step: a `--resume` waits for it to exit (bounded by the orphan grace, a progress line every few
  seconds), then takes over. A live holder whose launcher lives is refused at once.
Fencing: before each commit the checkpointer asks `holds()`; a writer that lost its lease (it stalled past the
TTL and someone took over) commits nothing more, and the trainer stops.
Works on every `Storage` (local disk and S3).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from tasks.errors import FrenzyError, environment_problem
from tasks.procs import alive, start_ticks
from tasks.training.storage import AlreadyExists, Storage

log = logging.getLogger(__name__)

LEASE_KEY = "writer.json"
DEFAULT_TTL_S = 60.0


class WriterLeaseError(FrenzyError, RuntimeError):
    """The checkpoint root is held by another live writer, or this writer lost its lease."""


@dataclass(frozen=True)
class Holder:
    owner: str
    host: str
    pid: int
    started: int | None
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from the holder."""
    run: str
    expires: float
    launcher_pid: int | None = None
    """The `frenzy train`/flow process that started the holder (`FRENZY_LAUNCHER_PID`); None: started directly."""
    launcher_started: int | None = None

    def describe(self) -> str:
        until = datetime.fromtimestamp(self.expires, UTC).strftime("%H:%M:%S UTC")
        return f"pid {self.pid} on {self.host} (run {self.run}; lease until {until})"


def _exited(pid: int, started: int | None, timeout: float) -> bool:
    """Wait up to `timeout` s for `pid` to exit: an event on its pidfd where Linux has one, else a poll."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # gone already, or no pidfd: poll
        deadline = time.monotonic() + timeout
        while alive(pid, started) and time.monotonic() < deadline:
            time.sleep(0.2)
        return not alive(pid, started)
    try:
        if not alive(pid, started):  # the pid was reused, or exited before the pidfd opened
            return True
        select.select([fd], [], [], timeout)
        return not alive(pid, started)
    finally:
        os.close(fd)


#: A lease is renewed every ttl/3 for ttl seconds; one expiring further ahead than this was not written by a trainer
#: (a hand edit, a clock years off) and would block the root for ever, so it protects nobody and is ignored.
_MAX_AHEAD_S = 24 * 3600.0


def _valid(h: Holder, now: float, ttl_s: float) -> Holder:
    """The holder, its fields type-checked (ValueError/TypeError when not: `current` treats that as unheld)."""
    if not isinstance(h.expires, int | float) or isinstance(h.expires, bool) or not math.isfinite(h.expires):
        raise ValueError(f"expires is {h.expires!r}, not a finite time")
    if not isinstance(h.pid, int) or isinstance(h.pid, bool) or h.pid <= 0:
        raise ValueError(f"pid is {h.pid!r}")
    if not all(isinstance(x, str) for x in (h.owner, h.host, h.run)):
        raise TypeError("owner, host and run must be strings")
    if h.expires > now + max(ttl_s, _MAX_AHEAD_S):
        raise ValueError(f"it expires {h.expires - now:.3g} s from now, beyond any lease a trainer writes")
    return h


class WriterLease:
    """The writer lease of `storage`'s root for `run` (module docstring). Use as a context manager."""

    def __init__(self, storage: Storage, run: str, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.time, orphan_wait_s: float = 0.0,
                 on_wait: Callable[[str], None] | None = None) -> None:
        """`orphan_wait_s` > 0: wait that long for a holder that is an orphan of a dead launcher (a `--resume` right
        after the launcher was killed) instead of refusing; `on_wait(line)` reports the wait."""
        self.storage, self.run, self.ttl_s, self.clock = storage, run, ttl_s, clock
        self.orphan_wait_s, self.on_wait = orphan_wait_s, on_wait
        pid = os.getpid()
        launcher = int(os.environ["FRENZY_LAUNCHER_PID"]) if os.environ.get("FRENZY_LAUNCHER_PID") else None
        self.me = Holder(owner=uuid.uuid4().hex, host=socket.gethostname(), pid=pid, started=start_ticks(pid),
                         run=run, expires=0.0, launcher_pid=launcher,
                         launcher_started=start_ticks(launcher) if launcher else None)
        self.lost = threading.Event()
        self.renew_error: BaseException | None = None
        """The newest renewal's error (None once one succeeds): why an own lease lapsed, when it did."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the lease object -------------------------------------------------------------------------------
    def current(self) -> Holder | None:
        """The lease as stored; None when there is none (an unreadable one counts as none: it protects nobody)."""
        try:
            d = json.loads(self.storage.read(LEASE_KEY))
            optional = ("launcher_pid", "launcher_started")  # absent from leases of older versions
            holder = Holder(**{k: d.get(k) if k in optional else d[k] for k in Holder.__dataclass_fields__})
            return _valid(holder, self.clock(), self.ttl_s)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as err:
            log.warning("%s is unreadable (%s); treating the root as unheld", self.storage.url(LEASE_KEY), err)
            return None

    def _mine(self) -> Holder:
        return Holder(**{**asdict(self.me), "expires": self.clock() + self.ttl_s})

    def _stale(self, h: Holder) -> bool:
        if h.expires <= self.clock():
            return True
        return h.host == self.me.host and h.owner != self.me.owner and not alive(h.pid, h.started)

    def acquire(self) -> None:
        """Take the lease or raise `WriterLeaseError` naming the live holder and the fix."""
        cur = self.current()
        if cur is not None and cur.owner != self.me.owner and not self._stale(cur):
            if self.orphan_wait_s > 0 and self._orphan(cur) and self._wait_for_exit(cur):
                return self.acquire()  # the orphan committed and exited (or released): judge the root again
            wait = max(0.0, cur.expires - self.clock())
            raise WriterLeaseError(
                f"{self.storage.uri} is being written by {cur.describe()}; two writers on one checkpoint root "
                f"corrupt each other's checkpoints. Stop that trainer (or wait: its lease lapses {wait:.0f} s after "
                f"its last heartbeat), or give this job another checkpoint.uri")
        data = json.dumps(asdict(self._mine())).encode()
        if cur is None:
            try:
                self.storage.create(LEASE_KEY, data)  # only-if-absent: of two starters, one wins
            except AlreadyExists:
                if self.current() is not None:
                    return self.acquire()  # someone was faster: judge their lease
                # the object is there but unreadable (damaged, hand-edited): it protects nobody, so it is replaced
                # (retrying the create would recurse for ever); of two such starters `holds` below keeps one
                self.storage.put(LEASE_KEY, data)
        else:
            if cur.owner != self.me.owner:
                log.warning("taking over the writer lease of %s from %s (%s)", self.storage.uri, cur.describe(),
                            "expired" if cur.expires <= self.clock() else "its process is gone")
            self.storage.put(LEASE_KEY, data)
        if not self.holds():
            raise WriterLeaseError(f"{self.storage.uri}: another writer took the lease at the same moment; "
                                   "stop one of the two trainers")

    def _orphan(self, h: Holder) -> bool:
        """A live holder on this host whose launcher is gone: it was told to commit its step and exit."""
        return (h.host == self.me.host and h.launcher_pid is not None and alive(h.pid, h.started)
                and not alive(h.launcher_pid, h.launcher_started))

    def _wait_for_exit(self, h: Holder) -> bool:
        """Wait (at most `orphan_wait_s`) until the orphan exits or gives up the lease; True when it did."""
        say = self.on_wait or (lambda line: log.warning("%s", line))
        say(f"{self.storage.uri} is held by {h.describe()}, an orphan of launcher {h.launcher_pid} (dead) committing "
            f"its last step; waiting up to {self.orphan_wait_s:.0f} s for it to exit")
        t0 = time.monotonic()
        while True:
            left = self.orphan_wait_s - (time.monotonic() - t0)
            if _exited(h.pid, h.started, min(5.0, max(left, 0.0))):
                say(f"the orphan pid {h.pid} exited after {time.monotonic() - t0:.1f} s; taking over")
                return True
            cur = self.current()
            if cur is None or cur.owner != h.owner:
                return True
            if left <= 0:
                return False
            say(f"still waiting for orphan pid {h.pid} ({time.monotonic() - t0:.0f} s of {self.orphan_wait_s:.0f})")

    def holds(self) -> bool:
        """Does this writer still hold a live lease? (The fence before every commit.)"""
        cur = self.current()
        ok = cur is not None and cur.owner == self.me.owner and cur.expires > self.clock()
        if not ok:
            self.lost.set()
        return ok

    def renew(self) -> bool:
        if not self.holds():
            return False
        self.storage.put(LEASE_KEY, json.dumps(asdict(self._mine())).encode())
        return True

    def loss_cause(self) -> str:
        """Why `lost` is set, as it happened: another trainer holds the root, or this writer's own lease lapsed
        (its renewals failed, or its heartbeat did not run: the process was stopped or starved)."""
        with contextlib.suppress(Exception):
            cur = self.current()
            if cur is not None and cur.owner != self.me.owner:
                return f"another trainer took it over ({cur.describe()})"
        if self.renew_error is not None:
            said = environment_problem(self.renew_error) or str(self.renew_error)
            return f"its renewals failed for {self.ttl_s:.0f} s and it lapsed ({said})"
        return (f"it lapsed: this process renewed it for none of its {self.ttl_s:.0f} s (the process was stopped or "
                "starved), and no other trainer holds it")

    def release(self) -> None:
        with contextlib.suppress(Exception):
            cur = self.current()
            if cur is not None and cur.owner == self.me.owner:
                self.storage.delete(LEASE_KEY)

    # -- heartbeat ------------------------------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self.renew():
                    log.error("lost the writer lease of %s: %s", self.storage.uri, self.loss_cause())
                    return
                self.renew_error = None
            except Exception as err:  # a storage hiccup: the lease has slack for two more beats
                self.renew_error = err
                log.warning("could not renew the writer lease of %s: %s", self.storage.uri, err)

    def __enter__(self) -> WriterLease:
        self.acquire()
        self._thread = threading.Thread(target=self._beat, name="frenzy-writer-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self.lost.is_set():
            self.release()


ORPHAN_GRACE_S = 60.0
"""How long an orphaned rank may take to commit its step after its launcher died (`FRENZY_ORPHAN_GRACE_S`)."""


def trainer_lease(storage: Storage, run: str, resume: bool, progress: Path) -> WriterLease:
    """Rank 0's lease: TTL from `FRENZY_WRITER_LEASE_S`; a `--resume` waits for an orphan of a dead launcher (up to
    the orphan grace `FRENZY_ORPHAN_GRACE_S` plus 5 s: by then the orphan has exited hard), reporting the wait as
    `lease_wait` records of `progress` (the lines `frenzy train` prints)."""
    def on_wait(line: str) -> None:
        log.warning("%s", line)
        progress.parent.mkdir(parents=True, exist_ok=True)
        with open(progress, "a") as f:
            f.write(json.dumps({"event": "lease_wait", "time": time.time(), "message": line}) + "\n")

    grace = float(os.environ.get("FRENZY_ORPHAN_GRACE_S", ORPHAN_GRACE_S)) + 5.0
    return WriterLease(storage, run, float(os.environ.get("FRENZY_WRITER_LEASE_S", DEFAULT_TTL_S)),
                       orphan_wait_s=grace if resume else 0.0, on_wait=on_wait)
