"""A claim on a checkpoint being evaluated, so that two `evaluate-pending` runs at once (the hourly one and one
brought forward, two workers) evaluate each step once: the first claims the step, the second skips it and says who
holds it (red team 41e S12: every step was evaluated twice).

A claim is a file `<history_dir>/.claims/<key>.claim` (the key: a hash of the step's place and the suite), made
whole in one `link` that fails when it exists, holding who claimed it (pid, host, time). It is removed when the
evaluation ends, failed or not; a holder that died is taken over: at once when it ran on this host and its process
is gone, else once the claim is older than `stale_s` (`FRENZY_EVAL_CLAIM_S`, default 6 h: longer than any evaluation
should take). A take-over happens under an flock on the claims directory, so two runs never both take one over.
No Prefect here."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError

from tasks.paths import place_key

STALE_VAR = "FRENZY_EVAL_CLAIM_S"
DEFAULT_STALE_S = 6 * 3600.0


class Claim(BaseModel):
    """Who is evaluating a step, since when (seconds since the epoch)."""

    pid: int
    host: str
    since: float
    by: str = ""

    def describe(self, now: float) -> str:
        return f"{self.by or 'an evaluation'} (pid {self.pid} on {self.host}, for {max(0.0, now - self.since):.0f} s)"


def claim_path(history_dir: str | Path, uri: str, suite: str) -> Path:
    key = hashlib.sha256(f"{place_key(uri)}\0{suite}".encode()).hexdigest()[:24]
    return Path(history_dir).expanduser().absolute() / ".claims" / f"{key}.claim"


def stale_after() -> float:
    return float(os.environ.get(STALE_VAR) or DEFAULT_STALE_S)


@contextlib.contextmanager
def claimed(history_dir: str | Path, uri: str, suite: str, by: str, stale_s: float | None = None,
            now: Callable[[], float] = time.time) -> Iterator[Claim | None]:
    """Claim the evaluation of `uri` on `suite`: yields None when this process holds it (removed when the block
    ends, by an exception too), or the live claim of another holder (the caller skips the step)."""
    path = claim_path(history_dir, uri, suite)
    mine = Claim(pid=os.getpid(), host=socket.gethostname(), since=now(), by=by)
    holder = _create(path, mine)
    if holder is not None and _stale(holder, stale_after() if stale_s is None else stale_s, now()):
        holder = _take_over(path, holder, mine)
    if holder is not None:
        yield holder
        return
    try:
        yield None
    finally:
        _release(path, mine)


def _create(path: Path, mine: Claim) -> Claim | None:
    """Make the claim file whole or not at all; None when made, else the claim already there."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    for _ in range(100):  # another run's release removes the claims directory once it is empty
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            tmp.write_text(mine.model_dump_json())
            break
    try:
        os.link(tmp, path)
        return None
    except FileExistsError:
        return _read(path) or _create(path, mine)  # removed between the two calls: try again
    finally:
        tmp.unlink()


def _read(path: Path) -> Claim | None:
    try:
        text, mtime = path.read_text(), path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        return Claim.model_validate_json(text)
    except ValidationError:  # not a claim of ours (a file someone edited): as old as its mtime, holder unknown
        return Claim(pid=0, host="?", since=mtime, by="an unreadable claim")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _stale(c: Claim, stale_s: float, now: float) -> bool:
    return (c.host == socket.gethostname() and not _alive(c.pid)) or now - c.since > stale_s


def _take_over(path: Path, stale: Claim, mine: Claim) -> Claim | None:
    """Replace the stale claim `stale` by `mine`, under the claims directory's flock; None when it is now ours, else
    the claim that holds it (another run took it over first)."""
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except FileNotFoundError:  # the holder's claim and its directory are gone meanwhile
        return _create(path, mine)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _read(path) == stale:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return _create(path, mine)
    finally:
        os.close(fd)


def _release(path: Path, mine: Claim) -> None:
    """Remove the claim if it is still ours (a take-over after a stall leaves the new holder's alone), then the
    claims directory once empty."""
    if _read(path) == mine:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()
