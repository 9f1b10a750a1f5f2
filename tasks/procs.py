"""Is a process (recorded by pid and start time) still running on this host? Used to recognise state left by a
process that died: a checkpoint writer lease, sandbox directories and cgroups. And how a process ended, in words."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass


def exit_words(rc: int, senders: Callable[[str], str] | None = None) -> str:
    """How a process that returned `rc` ended (negative: killed by signal -rc, as `subprocess` and Prefect report it):
    `exit status 3`, `killed by SIGTERM`, `killed by signal 42` (a number with no name here). `senders(name)` says who
    usually sends a signal (e.g. the out-of-memory killer for SIGKILL); when it says something: `killed (SIGKILL:
    <senders>)`. The one wording of the trial, metric and evaluation-run errors."""
    if rc >= 0:
        return f"exit status {rc}"
    try:
        sig = signal.Signals(-rc).name
    except ValueError:
        return f"killed by signal {-rc}"
    who = senders(sig) if senders is not None else ""
    return f"killed ({sig}: {who})" if who else f"killed by {sig}"


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux `/proc/PID/stat` field 22); None elsewhere."""
    rest = _stat(pid)
    return int(rest[19]) if rest is not None and len(rest) > 19 else None


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()  # fields from 3 (state) on; the name may hold spaces and parens


def alive(pid: int, started: int | None = None) -> bool:
    """True while `pid` runs and is the process that started at `started` (not a zombie, not a reused pid)."""
    if os.path.exists("/proc/self/stat"):
        rest = _stat(pid)
        if not rest or rest[0] in ("Z", "X"):
            return False
        return started is None or len(rest) <= 19 or int(rest[19]) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


PARENT_ENV = "FRENZY_DIE_WITH"
"""The environment variable through which a process started in a session of its own learns whose death ends it."""


def die_with_parent() -> bool:
    """End this process and its process group when the process named by `$FRENZY_DIE_WITH` (its parent) ends, however
    it ends (SIGKILL included): a process started in a session of its own (`start_new_session`) no longer shares its
    parent's process group, so a Ctrl-C or a kill of the group does not reach it. Watches the parent through a pidfd
    (any thread of the parent may have started this process: PR_SET_PDEATHSIG would fire when that thread ends);
    where pidfds are not offered, PR_SET_PDEATHSIG. True when armed; a parent already gone ends this process now."""
    import signal

    parent = int(os.environ.pop(PARENT_ENV, "0") or 0)
    if parent <= 0:
        return False
    try:
        fd: int | None = os.pidfd_open(parent)
    except (AttributeError, OSError):
        fd = None
    if fd is None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the watch began
        os.killpg(0, signal.SIGKILL)
    if fd is not None:
        import select
        import threading

        def watch() -> None:
            select.select([fd], [], [])  # a pidfd reads ready when its process has ended
            os.killpg(0, signal.SIGKILL)

        threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
    return True


@dataclass(frozen=True)
class ServerOnHome:
    """A `prefect server start` process whose database is the default one of a given PREFECT_HOME."""

    pid: int
    api_url: str


def _words(path: str) -> list[str]:
    with open(path, "rb") as f:
        return [w.decode(errors="replace") for w in f.read().split(b"\0") if w]


def prefect_server_on(home: str) -> ServerOnHome | None:
    """A running `prefect server start` (any process this user may read) that keeps its database in `home`'s default
    `prefect.db`: its PREFECT_HOME (default ~/.prefect of its HOME) is `home` and it names no database URL of its own.
    An embedded API started with that PREFECT_HOME (and no database URL either) would open the same file."""
    want = os.path.realpath(os.path.expanduser(home))
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            argv = _words(f"/proc/{pid}/cmdline")
            if not _is_prefect_server(argv):
                continue
            env = dict(w.partition("=")[::2] for w in _words(f"/proc/{pid}/environ"))
        except OSError:  # gone, or another user's
            continue
        theirs = env.get("PREFECT_HOME") or os.path.join(env.get("HOME", "~"), ".prefect")
        if _own_database(env) or os.path.realpath(os.path.expanduser(theirs)) != want:
            continue
        host = _option(argv, env, "--host", "PREFECT_SERVER_API_HOST", "127.0.0.1")
        return ServerOnHome(pid, f"http://{host}:{_option(argv, env, '--port', 'PREFECT_SERVER_API_PORT', '4200')}/api")
    return None


def _option(argv: list[str], env: dict[str, str], name: str, var: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv[:-1] else env.get(var, default)


def _is_prefect_server(argv: list[str]) -> bool:
    """`prefect server start ...` (run as `prefect` or `python .../prefect`)."""
    at = next((i for i, a in enumerate(argv[:3]) if os.path.basename(a) == "prefect"), None)
    return at is not None and argv[at + 1:at + 3] == ["server", "start"]


def _own_database(env: dict[str, str]) -> bool:
    return any(env.get(k) for k in ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL"))
