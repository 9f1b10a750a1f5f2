"""One writer per checkpoint root: a lease object `writer.json` at the root, held by rank 0 of the training run.

Two trainers on one root (an orphan beside a `--resume`, or two jobs given the same `checkpoint.uri`) delete and
overwrite each other's steps. The lease names its holder (host, pid, process start time, run) and an expiry that a
heartbeat thread moves forward every `ttl_s / 3`. Acquiring:
- no lease, or an expired one: take it (a fresh lease is created only-if-absent, so two starters cannot both win);
- a live lease of another process: refuse, naming it; on the same host a holder whose process is gone (dead, a
  zombie, or a reused pid) is stale and is taken over at once, so a restart after a crash need not wait the TTL.
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
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from tasks.procs import alive, start_ticks
from tasks.training.storage import AlreadyExists, Storage

log = logging.getLogger(__name__)

LEASE_KEY = "writer.json"
DEFAULT_TTL_S = 60.0


class WriterLeaseError(RuntimeError):
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

    def describe(self) -> str:
        until = datetime.fromtimestamp(self.expires, UTC).strftime("%H:%M:%S UTC")
        return f"pid {self.pid} on {self.host} (run {self.run}; lease until {until})"


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
                 clock: Callable[[], float] = time.time) -> None:
        self.storage, self.run, self.ttl_s, self.clock = storage, run, ttl_s, clock
        pid = os.getpid()
        self.me = Holder(owner=uuid.uuid4().hex, host=socket.gethostname(), pid=pid, started=start_ticks(pid),
                         run=run, expires=0.0)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the lease object -------------------------------------------------------------------------------
    def current(self) -> Holder | None:
        """The lease as stored; None when there is none (an unreadable one counts as none: it protects nobody)."""
        try:
            d = json.loads(self.storage.read(LEASE_KEY))
            return _valid(Holder(**{k: d[k] for k in Holder.__dataclass_fields__}), self.clock(), self.ttl_s)
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
                    log.error("lost the writer lease of %s to %s", self.storage.uri,
                              (h.describe() if (h := self.current()) else "nobody (it was removed)"))
                    return
            except Exception as err:  # a storage hiccup: the lease has slack for two more beats
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
