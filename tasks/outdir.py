"""Outputs that are written whole or not at all, by one writer at a time: the directories of `frenzy data prepare`
and `frenzy export`, and the files of `frenzy tokenizer train`, `stragglers generate|analyze` and `cluster simulate`.

The content goes to a hidden temp directory beside the target and is renamed over it only when complete, so a
SIGKILL leaves the target as it was (and a `.NAME.tmp-PID` directory the next run removes). An advisory lock
(`.NAME.lock`, flock) beside the target makes a second writer fail at once instead of interleaving files. A target
that already holds files is refused unless the caller passes `overwrite`; a checkpoint root, a `step_*` directory
or anything inside one is never a target, whatever the flag: writing there corrupts training state.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.errors import FrenzyError, as_frenzy_error, environment_problem


class OutputError(FrenzyError, ValueError):
    """An output target Frenzy will not write; the message names the fix."""


def _checkpoint_dir(p: Path) -> Path | None:
    """`p` or its nearest ancestor that is a checkpoint root or a step directory, else None."""
    for q in (p, *p.parents):
        if re.fullmatch(r"step_\d+", q.name) or (q / "writer.json").is_file():
            return q
        if q.is_dir() and any(re.fullmatch(r"step_\d+", c.name) for c in q.iterdir() if c.is_dir()):
            return q
    return None


def refuse_protected(out: Path, what: str) -> None:
    """Refuse a checkpoint root, a step directory or a path inside one as `what`'s output."""
    ck = _checkpoint_dir(out.expanduser().absolute())
    if ck is not None:
        raise OutputError(f"{out} is {'inside ' if ck != out.absolute() else ''}a checkpoint directory ({ck}); "
                          f"{what} never writes there (it would corrupt the checkpoints): give another directory")


@contextmanager
def _lock(out: Path, what: str) -> Iterator[None]:
    lock = out.parent / f".{out.name}.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(f"another {what} is writing {out} right now; wait for it or give another "
                              "directory") from None
        yield
    finally:
        os.close(fd)  # closing drops the flock; the lock file stays (removing it would race a waiting writer)


@contextmanager
def machine_errors(what: str, out: Path) -> Iterator[None]:
    """An OSError of the machine (disk full, read-only, permission) while `what` writes `out`, as a FrenzyError
    naming both; other errors pass unchanged."""
    try:
        yield
    except OSError as err:
        if environment_problem(err) is None:
            raise
        raise as_frenzy_error(err, f"{what} writing {out}") from err


@contextmanager
def atomic_dir(out: str | Path, what: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp directory to fill; on success it replaces `out` in one rename (module docstring)."""
    out = Path(out).expanduser().absolute()
    with machine_errors(what, out), _atomic_dir(out, what, overwrite) as tmp:
        yield tmp


@contextmanager
def _atomic_dir(out: Path, what: str, overwrite: bool) -> Iterator[Path]:
    refuse_protected(out, what)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory; give a directory for {what}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out, what):
        if out.is_dir() and any(out.iterdir()) and not overwrite:
            raise OutputError(f"{out} is not empty; {what} replaces a directory only with --overwrite "
                              "(or give a new one)")
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a killed writer (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)


def _same_as_input(dest: Path, inputs: tuple[str | Path, ...]) -> Path | None:
    """The input `dest` would overwrite: the same file, or a trace/meta file of an input directory."""
    for i in inputs:
        q = Path(i).expanduser()
        if not q.exists():
            continue
        if dest.exists() and os.path.samefile(dest, q):
            return q
        if q.is_dir() and dest.parent.exists() and os.path.samefile(dest.parent, q) and \
                dest.suffix in (".parquet", ".yaml", ".yml"):
            return q
    return None


def check_file_target(dest: str | Path, what: str, inputs: tuple[str | Path, ...] = ()) -> Path:
    """Refuse, before any work, a file output that is a directory, inside a checkpoint or one of `inputs`."""
    dest = Path(dest).expanduser().absolute()
    if dest.is_dir():
        raise OutputError(f"{dest} is a directory; give a file path for {what}")
    refuse_protected(dest.parent, what)
    same = _same_as_input(dest, tuple(i for i in inputs if i))
    if same is not None:
        raise OutputError(f"{dest} is {what}'s own input ({same}); writing it would destroy what is being read: "
                          "give another path")
    return dest


@contextmanager
def atomic_path(dest: str | Path, what: str, *, overwrite: bool = True,
                inputs: tuple[str | Path, ...] = ()) -> Iterator[Path]:
    """Yield a temp path beside `dest` for a writer that takes a path (savefig, to_parquet, gzip.open); it is
    renamed over `dest` only when the writer returns, so a SIGKILL leaves `dest` as it was. `dest` may not be one
    of `inputs` (an output pointed at the file being read would destroy it) nor inside a checkpoint directory."""
    dest = check_file_target(dest, what, inputs)
    with machine_errors(what, dest), _atomic_path(dest, what, overwrite) as tmp:
        yield tmp


@contextmanager
def _atomic_path(dest: Path, what: str, overwrite: bool) -> Iterator[Path]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _lock(dest, what):
        if dest.exists() and not overwrite:
            raise OutputError(f"{dest} exists; {what} replaces it only with --overwrite (or give a new path)")
        for stale in dest.parent.glob(f".{dest.name}.tmp-*"):  # left by a killed writer (we hold the lock)
            stale.unlink(missing_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}{dest.suffix}")  # savefig infers its format
        try:
            yield tmp
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, dest)


def atomic_file(dest: Path, data: bytes, what: str, overwrite: bool = False) -> None:
    """Write one file by temp + rename under the same lock and overwrite rules as `atomic_dir`."""
    with atomic_path(dest, what, overwrite=overwrite) as tmp:
        tmp.write_bytes(data)


_HELD: dict[Path, int] = {}
"""Run directories this process holds (the lock is re-entrant within a process: flock is not)."""


@contextmanager
def run_dir_lock(run_dir: Path, what: str = "frenzy train") -> Iterator[None]:
    """Hold `run_dir` for one trainer: a second process launching into it (its job.json, progress.jsonl, stop and
    kill files) would make the first train the second's job and read its progress. Fails at once, naming the
    holder's pid and the fix."""
    run_dir = run_dir.absolute()
    if run_dir in _HELD:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / ".run.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise OutputError(f"run directory {run_dir} is in use by another trainer (pid {holder}); wait for it, "
                              "stop it, or give this run another --run-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _HELD[run_dir] = fd
        try:
            yield
        finally:
            del _HELD[run_dir]
    finally:
        os.close(fd)
