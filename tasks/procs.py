"""Is a process (recorded by pid and start time) still running on this host? Used to recognise state left by a
process that died: a checkpoint writer lease, sandbox directories and cgroups."""

from __future__ import annotations

import os


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
