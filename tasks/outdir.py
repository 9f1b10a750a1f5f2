"""Outputs that are written whole or not at all, by one writer at a time: the directories of `frenzy data prepare`
and `frenzy export`, and the files of `frenzy tokenizer train`, `stragglers generate|analyze` and `cluster simulate`.

The content goes to a hidden temp directory beside the target and is renamed over it only when complete, so a
SIGKILL leaves the target as it was (and a `.NAME.tmp-PID` directory the next run removes). An advisory lock
(`.NAME.lock`, flock) beside the target makes a second writer fail at once instead of interleaving files; the
holder removes it when done, so no lock file is left. A target
that already holds files is refused unless the caller passes `overwrite`; a checkpoint root, a `step_*` directory
or anything inside one is never a target, whatever the flag: writing there corrupts training state.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.errors import EnvironmentProblem, FrenzyError, as_frenzy_error, environment_problem


class OutputError(FrenzyError, ValueError):
    """An output target Frenzy will not write; the message names the fix."""


class BusyError(OutputError):
    """Another writer holds the output's lock right now (`held` without `wait`)."""


def _is_step(q: Path, by_content: bool) -> bool:
    if not re.fullmatch(r"step_\d+", q.name):
        return False
    if not by_content:
        return True
    try:  # a step a trainer wrote: its manifest, or the shard files of one not yet committed
        return q.is_dir() and any(c.name == "manifest.json" or re.fullmatch(r"rank\d+\.(bin|json)", c.name)
                                  for c in q.iterdir())
    except OSError:
        return False


def _checkpoint_dir(p: Path, by_content: bool = False) -> Path | None:
    """`p` or its nearest ancestor that is a checkpoint root or a step directory, else None. By name (a `step_N`
    directory, or a directory holding one) unless `by_content`: then only what holds a trainer's files counts (an
    evaluation's own `step_N/` directories do not)."""
    for q in (p, *p.parents):
        if _is_step(q, by_content) or (q / "writer.json").is_file():
            return q
        try:  # the name first: an ancestor such as /tmp holds thousands of entries, and a stat of each took 16 ms
            if q.is_dir() and any(_is_step(c, by_content) and c.is_dir() for c in q.iterdir()):
                return q
        except OSError:  # an unreadable ancestor holds nothing we could recognise
            continue
    return None


def refuse_protected(out: Path, what: str, by_content: bool = False) -> None:
    """Refuse a checkpoint root, a step directory or a path inside one as `what`'s output (`_checkpoint_dir`)."""
    ck = _checkpoint_dir(out.expanduser().absolute(), by_content)
    if ck is not None:
        raise OutputError(f"{out} is {'inside ' if ck != out.absolute() else ''}a checkpoint directory ({ck}); "
                          f"{what} never writes there (it would corrupt the checkpoints): give another directory")


BEATS = 6
"""A holder given `stale_s` renews its lock file's time this many times per `stale_s`."""


class Hold:
    """The lock `held` holds. `taken()` says why it is this process's no longer: a waiter found it with no heartbeat
    for `stale_s` (this process stopped, say by SIGSTOP) and took it over; publish nothing then."""

    def __init__(self, lock: Path, fd: int) -> None:
        self.lock, self.fd = lock, fd

    def taken(self) -> str | None:
        try:
            if _same_file(self.fd, self.lock):
                return None
            by = f" (now held by {_holder_line(self.lock)})"
        except FileNotFoundError:  # the process that took it over has finished and removed it
            by = ""
        return (f"its lock {self.lock} is no longer this process's{by}: another process took it over while this one "
                "made no progress (stopped or frozen past the lock's stale time)")


@contextmanager
def held(out: Path, what: str, wait: bool = False, note: str = "", stale_s: float | None = None,
         said: Callable[[str], None] | None = None) -> Iterator[Hold]:
    """The one-writer lock of output `out`: an flock on `.NAME.lock` beside it, which names its holder (its first
    line) and, on the lines after, the holder's `note` (`lock_note` reads it). A second writer waits for it (`wait`)
    or is refused at once, naming the first (`BusyError`). With `stale_s`, the holder renews the lock file's time
    (BEATS times per `stale_s`, from a thread: a process stopped by SIGSTOP renews nothing), and a waiter takes over
    a lock not renewed for `stale_s`, saying so through `said`: the old holder, should it continue, finds its lock
    taken (`Hold.taken`) and must publish nothing."""
    lock = lock_path(out)
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    try:
        with machine_errors(what, out):  # a full disk names the output and its disk (red team 41h N8)
            out.parent.mkdir(parents=True, exist_ok=True)
            fd = _lock_file(lock, out, what, wait, stale_s, said)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{what} (pid {os.getpid()} on {socket.gethostname()})\n{note}".encode(), 0)
            except BaseException:
                _unlock(lock, fd)
                raise
        stop = threading.Event()
        if stale_s is not None:
            threading.Thread(target=_renew, args=(fd, stale_s / BEATS, stop), daemon=True,
                             name=f"lock-heartbeat {out.name}").start()
        try:
            yield Hold(lock, fd)
        finally:
            stop.set()
            _unlock(lock, fd)
    except BaseException:
        for d in made:  # the directories made for it and left empty (it failed): none is left behind, deepest first
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _renew(fd: int, every_s: float, stop: threading.Event) -> None:
    """The holder's heartbeat: the lock file's time, renewed every `every_s` until `stop`."""
    while not stop.wait(every_s):
        with contextlib.suppress(OSError):  # closed at the end, or a file system that refuses: the next try
            os.utime(fd)


def lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


def lock_note(out: Path) -> str:
    """The note the writer holding (or last holding: a killed one's file stays) `out`'s lock gave `held`; "" when
    there is no lock file or no note yet (read without locking: a probe would make a writer's own try fail)."""
    try:
        return lock_path(out).read_text(errors="replace").partition("\n")[2].strip()
    except OSError:
        return ""


def _holder_line(lock: Path) -> str:
    try:
        return lock.read_text(errors="replace").partition("\n")[0].strip() or "another process"
    except OSError:
        return "another process"


def _unlock(lock: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        if _same_file(fd, lock):  # not a lock a waiter took over from this process (`held`'s stale_s)
            os.unlink(lock)  # removed while still locked: no lock file is left behind ...
    os.close(fd)  # ... and a writer waiting on this inode sees it is gone (`_lock_file`) and locks a new one


def _same_file(fd: int, path: Path) -> bool:
    st, now = os.fstat(fd), os.stat(path)
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


def _lock_file(lock: Path, out: Path, what: str, wait: bool, stale_s: float | None = None,
               said: Callable[[str], None] | None = None) -> int:
    """An open descriptor of `lock`, flock-ed: the file at the path when the lock was taken (a previous holder may
    have removed the one this process opened and waited on, or a stale one was taken over: then the new one is
    opened and locked)."""
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        except FileNotFoundError:  # its directory removed by a writer that failed (`held`): made again
            if lock.parent.is_dir():
                raise
            lock.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            if not _flock(fd, wait, stale_s, said, lock, out):
                os.close(fd)
                continue
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").partition("\n")[0].strip() or "another process"
            os.close(fd)
            raise BusyError(f"another {what} is writing {out} right now ({holder}); wait for it to finish, or "
                              "give another directory") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            if _same_file(fd, lock):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _flock(fd: int, wait: bool, stale_s: float | None, said: Callable[[str], None] | None, lock: Path,
           out: Path) -> bool:
    """Lock `fd` (BlockingIOError: busy, and not `wait`). Waiting with `stale_s`: poll, and once the holder has not
    renewed the file for `stale_s`, remove it from the path (the holder keeps an unlinked file) and return False to
    have the caller lock a new one."""
    if not wait or stale_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return True
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        age = time.time() - os.fstat(fd).st_mtime
        if age >= stale_s:
            holder = os.pread(fd, 200, 0).decode(errors="replace").partition("\n")[0].strip() or "another process"
            took = False
            with contextlib.suppress(FileNotFoundError):
                if _same_file(fd, lock):  # not when another waiter took it over first: then that one's is waited on
                    os.unlink(lock)
                    took = True
            if took and said is not None:
                said(f"{holder} has held {out} with no heartbeat for {age:.0f} s (its process is stopped or frozen; "
                     f"the stale time is {stale_s:g} s): taking its lock over; should it continue, it publishes "
                     "nothing of its attempt")
            return False
        time.sleep(min(1.0, stale_s / BEATS))  # a poll of another process's lock, not a synchronisation of ours


@contextmanager
def machine_errors(what: str, out: Path) -> Iterator[None]:
    """An OSError of the machine (disk full, read-only, permission) while `what` writes `out`, as a FrenzyError
    naming both; other errors pass unchanged."""
    try:
        yield
    except OSError as err:
        if environment_problem(err) is None:
            raise
        disk = f" (the file system mounted at {mount_of(out)})" if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise as_frenzy_error(err, f"{what} writing {out}{disk}") from err


def mount_of(path: Path) -> Path:
    """The mount point of the file system that holds `path` (or its nearest existing ancestor): the full disk's name."""
    p = next((q for q in (path, *path.parents) if q.exists()), Path("/"))
    with contextlib.suppress(OSError):
        dev = p.stat().st_dev
        while p != p.parent and p.parent.stat().st_dev == dev:
            p = p.parent
    return p


@contextmanager
def atomic_dir(out: str | Path, what: str, overwrite: bool = False, *, wait: bool = False) -> Iterator[Path]:
    """Yield a temp directory to fill; on success it replaces `out` in one rename (module docstring). A second
    writer of `out` is refused at once, naming the first (or waits for it, with `wait`)."""
    out = Path(out).expanduser().absolute()
    check_dir_target(out, what)
    with machine_errors(what, out), held(out, what, wait), fill_dir(out, what, overwrite) as tmp:
        yield tmp


def check_dir_target(out: Path, what: str, by_content: bool = False) -> None:
    """Refuse, before any work, a directory output that is a file or inside a checkpoint (`refuse_protected`)."""
    refuse_protected(out, what, by_content)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory; give a directory for {what}")


def _swap(a: Path, b: Path) -> bool:
    """Exchange two directory entries in one step (Linux renameat2 RENAME_EXCHANGE); False where not offered."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without it
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(a), None, str(b))


def _recover(out: Path) -> None:
    """Under the lock: put back the previous output a writer killed mid-replace left aside, then drop stale temps."""
    olds = sorted(out.parent.glob(f".{out.name}.old-*"))
    if not out.exists() and olds:
        os.replace(olds[-1], out)
        olds = olds[:-1]
    for stale in [*olds, *out.parent.glob(f".{out.name}.tmp-*")]:  # left by killed writers (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def fill_dir(out: Path, what: str, overwrite: bool, keep_failed: bool = False) -> Iterator[Path]:
    """With `held(out)` taken by the caller: refuse a non-empty `out` without `overwrite`, yield a fresh temp
    directory beside it and, when the body returns, put it in place of `out` in one step (the old content is then
    removed; a SIGKILL at any point leaves either the old or the new directory at `out`). `keep_failed`: a body
    that raises leaves what it wrote (its logs) at `failed_dir(out)`, the one of an earlier failure replaced, and
    the exception's message names that place instead of the temp directory, which is gone (red team 41l C1: the
    error named `.NAME.tmp-PID/...`, which the next writer removed, and such temp directories piled up); a body that
    completes removes the earlier failure's logs. A directory of that name that `fill_dir` did not make (no
    `.frenzy-failed` mark inside) is never touched: the temp directory is then kept as it was."""
    _recover(out)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputError(f"{out} is not empty; {what} replaces a directory only with --overwrite "
                          "(or give a new one)")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException as err:
        if not keep_failed or _keep_failed(tmp, failed_dir(out), err):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_failed and _kept_here(failed_dir(out)):
        shutil.rmtree(failed_dir(out), ignore_errors=True)
    if out.exists() and _swap(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # holds the old content now
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def failed_dir(out: Path) -> Path:
    """Where `fill_dir` keeps what a failed writer of `out` wrote: `NAME.failed` beside it, one per target."""
    return out.with_name(f"{out.name}.failed")


def _kept_here(kept: Path) -> bool:
    """Whether `kept` is a directory `fill_dir` kept (its mark inside), not one of the user's that has the name."""
    return (kept / ".frenzy-failed").is_file()


def _keep_failed(tmp: Path, kept: Path, err: BaseException) -> bool:
    """Move `tmp` to `kept` (replacing an earlier failure's) and make `err`'s message name `kept`; False when it
    could not (`kept` is someone else's directory, or the move failed): `tmp` then stays, as the message says."""
    if os.path.lexists(kept) and not _kept_here(kept):
        return False
    try:
        shutil.rmtree(kept, ignore_errors=True)
        os.replace(tmp, kept)
    except OSError:
        return False
    with contextlib.suppress(OSError):  # without its mark it is only never removed by a later writer
        (kept / ".frenzy-failed").touch()
    err.args = tuple(a.replace(str(tmp), str(kept)) if isinstance(a, str) else a for a in err.args)
    if isinstance(err, OSError):  # its file names are not in its args (red team 41o S7: a full disk named the temp)
        err.filename, err.filename2 = (f.replace(str(tmp), str(kept)) if isinstance(f, str) else f
                                       for f in (err.filename, err.filename2))
    return True


def check_writable(target: str | Path, what: str) -> Path:
    """Refuse, before any work, an output path that cannot be written: a part of it is a file, or its nearest
    existing directory is on a read-only file system or not writable. Creates nothing."""
    p = Path(target).expanduser().absolute()
    q = p
    while not os.path.lexists(q) and q != q.parent:
        q = q.parent
    if q != p and not q.is_dir():
        raise OutputError(f"{what} {p}: {q} is a file, not a directory; give another path")
    d = q if q.is_dir() else q.parent
    if os.statvfs(d).f_flag & os.ST_RDONLY:
        raise EnvironmentProblem(f"{what} {p}: {d} is on a read-only file system; give a writable location")
    if not os.access(d, os.W_OK):
        raise EnvironmentProblem(f"{what} {p}: no permission to write in {d}; give a location you may write")
    return p


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


def check_parent(dest: Path, what: str) -> None:
    """Refuse a file output whose directory does not exist: a mistyped directory (`otu/jobs.csv`) is never created,
    as with the shell's `>`. Names the nearest missing directory and the fix."""
    if dest.parent.is_dir():
        return
    missing = dest.parent
    while not os.path.lexists(missing.parent) and missing.parent != missing:
        missing = missing.parent
    if os.path.lexists(missing):
        raise OutputError(f"{what} {dest}: {missing} is not a directory; give a path in an existing directory")
    raise OutputError(f"{what} {dest}: the directory {missing} does not exist (a mistyped directory is never "
                      f"created); create it first (mkdir -p {dest.parent}) or give a path in an existing directory")


def check_file_target(dest: str | Path, what: str, inputs: tuple[str | Path, ...] = (), overwrite: bool = True,
                      by_content: bool = False, make_parent: bool = False) -> Path:
    """Refuse, before any work, a file output that is a directory, whose directory does not exist (unless
    `make_parent`: a directory Frenzy itself keeps), inside a checkpoint (`refuse_protected`) or one of `inputs`, or
    (without `overwrite`) one that exists."""
    dest = Path(dest).expanduser().absolute()
    if dest.is_dir():
        raise OutputError(f"{dest} is a directory; give a file path for {what}")
    if not make_parent:
        check_parent(dest, what)
    refuse_protected(dest.parent, what, by_content)
    same = _same_as_input(dest, tuple(i for i in inputs if i))
    if same is not None:  # before the exists check: --overwrite would not help here
        raise OutputError(f"{dest} is {what}'s own input ({same}); writing it would destroy what is being read: "
                          "give another path")
    if not overwrite and os.path.lexists(dest):
        raise OutputError(f"{dest} exists; {what} replaces it only with --overwrite (or give a new path)")
    return dest


@contextmanager
def atomic_path(dest: str | Path, what: str, *, overwrite: bool = True, inputs: tuple[str | Path, ...] = (),
                by_content: bool = False, wait: bool = False, make_parent: bool = False) -> Iterator[Path]:
    """Yield a temp path beside `dest` for a writer that takes a path (savefig, to_parquet, gzip.open); it is
    renamed over `dest` only when the writer returns, so a SIGKILL leaves `dest` as it was. `dest` may not be one
    of `inputs` (an output pointed at the file being read would destroy it) nor inside a checkpoint directory. A
    second writer is refused at once, or waits its turn with `wait` (a plot every evaluation redraws). The directory
    of `dest` must exist, unless `make_parent` (a file in a directory Frenzy keeps, not one a user typed)."""
    dest = check_file_target(dest, what, inputs, True, by_content, make_parent)  # `overwrite` is checked again under the lock
    with machine_errors(what, dest), _atomic_path(dest, what, overwrite, wait, make_parent) as tmp:
        yield tmp


@contextmanager
def _atomic_path(dest: Path, what: str, overwrite: bool, wait: bool, make_parent: bool) -> Iterator[Path]:
    if make_parent:
        dest.parent.mkdir(parents=True, exist_ok=True)
    with held(dest, what, wait):
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


def atomic_file(dest: Path, data: bytes, what: str, overwrite: bool = False, *, by_content: bool = False,
                wait: bool = False, make_parent: bool = False) -> None:
    """Write one file by temp + rename under the same lock and overwrite rules as `atomic_path`."""
    with atomic_path(dest, what, overwrite=overwrite, by_content=by_content, wait=wait, make_parent=make_parent) as tmp:
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
