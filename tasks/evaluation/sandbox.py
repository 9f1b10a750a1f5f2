"""Run untrusted generated code (HumanEval completions) in a sandbox and report what happened.

Each program runs in its own process tree with, in layers (each used where the kernel offers it, and reported in
`SandboxResult.isolation`):

- a scrubbed environment (no credentials, no PYTHONPATH), a private temporary directory as cwd and HOME, and an
  isolated interpreter (`python -I -S`: stdlib only, no site-packages);
- resource limits: address space, CPU seconds, file size, open files, no core dumps; a wall-clock timeout after
  which the whole tree is killed;
- new user, PID, network, IPC and UTS namespaces: no network interface but a downed loopback, no view of (and no
  signals to) processes outside, no capabilities outside;
- Landlock: the filesystem is read-only for the interpreter's own files and invisible elsewhere (no reading of the
  evaluator's files or secrets, writes only below the private directory), TCP bind/connect denied, signals to
  processes outside the sandbox denied;
- a pids cgroup (where writable) or RLIMIT_NPROC against fork bombs;
- a disk quota: in a private mount namespace the program's only writable directory (its HOME, TMPDIR and cwd) is
  a tmpfs of `disk_mb` (64 MiB by default), so a program cannot fill the disk with many files under the per-file
  limit;
- it dies with its evaluator (PR_SET_PDEATHSIG, for the supervisor and the namespace's init), and what a killed
  evaluator leaves behind (its `frenzy-sbx-PID-...` directories and cgroups, named after their owner process) is
  removed by the next sandbox run on the host once that owner is gone.

The bootstrap that applies these runs in the child before the program and uses only the stdlib (ctypes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pydantic import BaseModel

from tasks.procs import alive, start_ticks

_STATUS = {0: "passed", 1: "failed"}
_SETUP_FAILED = 97
_OUTPUT_TAIL = 4096


class SandboxResult(BaseModel):
    """How one program ended."""

    status: str
    """passed (exit 0), failed (non-zero exit), timeout, killed (a signal, e.g. out of memory), or error."""
    returncode: int
    duration_s: float
    stdout: str
    stderr: str
    isolation: list[str]
    """The layers that were in force."""


# The bootstrap: argv[1] is a JSON config. It must not import anything outside the stdlib.
_BOOT = r'''
import ctypes, json, os, resource, signal, struct, sys
cfg = json.loads(sys.argv[1])
layers = []
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def fail(msg):
    sys.stderr.write("sandbox setup: " + msg + "\n"); os._exit(97)
libc.prctl(1, 9)                                    # PR_SET_PDEATHSIG: SIGKILL when the evaluator dies
if os.getppid() != cfg["parent"]:
    fail("the evaluator died before the sandbox started")
if cfg["cgroup"]:
    try:
        with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        layers.append("cgroup-pids")
    except OSError as e:
        fail("cannot join cgroup %s: %s" % (cfg["cgroup"], e))
uid, gid = os.getuid(), os.getgid()
NS = 0x10000000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x00020000  # USER PID NET IPC UTS NS
child = 0
if cfg["namespaces"] and libc.unshare(NS) == 0:
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
    layers += ["userns", "pidns", "netns", "ipcns", "mntns"]
    if cfg["disk_mb"]:
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        opts = ("size=%dm,mode=0700" % cfg["disk_mb"]).encode()
        if (libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None) == 0            # MS_REC | MS_PRIVATE
                and libc.mount(b"tmpfs", cfg["home"].encode(), b"tmpfs", 2 | 4, opts) == 0):  # MS_NOSUID | MS_NODEV
            layers.append("disk-quota-%dm" % cfg["disk_mb"])
        elif cfg["require"]:
            fail("cannot mount the quota tmpfs: errno %d" % ctypes.get_errno())
    child = os.fork()
    if child:
        # supervisor, outside the new PID namespace: enforce the wall clock; killing the namespace's init kills all
        deadline = cfg["timeout_s"]
        import time
        t0 = time.monotonic()
        while True:
            pid, st = os.waitpid(child, os.WNOHANG)
            if pid:
                os._exit(os.WEXITSTATUS(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st))
            if time.monotonic() - t0 > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                os._exit(124)
            time.sleep(0.01)
elif cfg["namespaces"] and cfg["require"]:
    fail("unshare(user|pid|net) failed: errno %d" % ctypes.get_errno())
if child == 0 and "pidns" in layers:
    libc.prctl(1, 9)                                # the namespace's init dies with its supervisor
mem = cfg["memory_mb"] << 20
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] << 20, cfg["file_mb"] << 20))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if uid != 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    layers.append("rlimit-nproc")
layers.append("rlimits")
iso = os.open(os.path.join(cfg["workdir"], ".isolation"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
if cfg["landlock"]:
    abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        if cfg["require"]:
            fail("Landlock is not available (errno %d)" % ctypes.get_errno())
    else:
        fs_all = (1 << 13) - 1                      # ABI 1: execute .. make_sym
        if abi >= 2: fs_all |= 1 << 13              # refer
        if abi >= 3: fs_all |= 1 << 14              # truncate
        if abi >= 5: fs_all |= 1 << 15              # ioctl_dev
        net = 0b11 if abi >= 4 else 0               # bind_tcp, connect_tcp
        scoped = 0b11 if abi >= 6 else 0            # abstract unix sockets, signals
        attr = struct.pack("QQQ", fs_all, net, scoped)
        size = 24 if abi >= 6 else 16
        buf = ctypes.create_string_buffer(attr[:size], size)
        fd = libc.syscall(444, buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
        if fd < 0:
            fail("landlock_create_ruleset: errno %d" % ctypes.get_errno())
        ro = 1 | (1 << 2) | (1 << 3)                # execute, read_file, read_dir
        def allow(path, access):
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            if not os.path.isdir(path):
                access &= 1 | (1 << 1) | (1 << 2) | ((1 << 14) if abi >= 3 else 0)
            rule = ctypes.create_string_buffer(struct.pack("=Qi", access, pfd), 12)
            if libc.syscall(445, ctypes.c_int(fd), ctypes.c_int(1), rule, ctypes.c_uint32(0)) != 0:
                fail("landlock_add_rule %s: errno %d" % (path, ctypes.get_errno()))
            os.close(pfd)
        for p in cfg["read_only"]:
            allow(p, ro)
        allow(cfg["program"], ro)
        allow("/dev/null", 1 << 1 | 1 << 2)
        allow(cfg["home"], fs_all)                  # the only writable place (the quota tmpfs where available)
        if libc.prctl(38, 1, 0, 0, 0) != 0:         # PR_SET_NO_NEW_PRIVS
            fail("no_new_privs: errno %d" % ctypes.get_errno())
        if libc.syscall(446, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            fail("landlock_restrict_self: errno %d" % ctypes.get_errno())
        layers.append("landlock-abi%d" % abi)
os.write(iso, " ".join(layers).encode())
os.close(iso)
os.chdir(cfg["home"])
os.execve(cfg["python"], [cfg["python"], "-I", "-S", "-B", cfg["program"]], cfg["env"])
'''


def _python_paths() -> tuple[str, list[str]]:
    """The base interpreter and the directories it needs to start (read-only inside the sandbox)."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    base = Path(sys.base_prefix)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    ro = {exe, str(base / "lib" / ver), "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache",
          "/etc/localtime", "/usr/share/zoneinfo"}
    for lib in (base / "lib").glob("libpython*"):
        ro.add(str(lib))
    return exe, sorted(ro)


def _pids_cgroup(limit: int) -> Path | None:
    """A fresh pids cgroup (v2, or v1's pids hierarchy) that this process may create, else None."""
    roots = []
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists() and "pids" in v2.read_text().split():
        roots.append(v2.parent)
    roots.append(Path("/sys/fs/cgroup/pids"))
    for root in roots:
        if not (root / "cgroup.procs").exists():
            continue
        d = root / f"{_owner_prefix()}{uuid.uuid4().hex[:12]}"
        try:
            d.mkdir()
            (d / "pids.max").write_text(str(limit))
            return d
        except OSError:
            _rmdir_quiet(d)
    return None


def _rmdir_quiet(d: Path) -> None:
    try:
        d.rmdir()
    except OSError:
        pass


_OWNED = re.compile(r"frenzy-sbx-(\d+)-(\d+|x)-")
_swept = False


def _owner_prefix() -> str:
    """`frenzy-sbx-PID-STARTTICKS-`: who made a sandbox directory or cgroup, so a sweep can tell a dead owner."""
    return f"frenzy-sbx-{os.getpid()}-{start_ticks(os.getpid()) or 'x'}-"


def _owner_gone(name: str) -> bool:
    m = _OWNED.match(name)
    return m is not None and not alive(int(m.group(1)), None if m.group(2) == "x" else int(m.group(2)))


def sweep_stale() -> list[str]:
    """Remove the sandbox directories and cgroups whose owning evaluator is no longer running (it was killed
    before its cleanup ran); returns what was removed. Runs once per process, before its first program."""
    removed = []
    tmp = Path(tempfile.gettempdir())
    for d in tmp.glob("frenzy-sbx-*"):
        if d.is_dir() and _owner_gone(d.name):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/pids")):
        for cg in root.glob("frenzy-sbx-*") if root.is_dir() else []:
            if _owner_gone(cg.name):
                _kill_cgroup(cg)
                removed.append(str(cg))
    return removed


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 1024, cpu_s: int | None = None,
               nproc: int = 16, file_mb: int = 16, disk_mb: int = 64, require_isolation: bool = False
               ) -> SandboxResult:
    """Run `code` as a Python program in the sandbox; never raises for anything the program does.

    `file_mb` limits each file, `disk_mb` everything the program writes (where a mount namespace is available).
    `require_isolation`: fail (status error) instead of running with fewer layers when namespaces or Landlock
    are unavailable.
    """
    global _swept
    if not _swept:
        _swept = True
        sweep_stale()
    exe, ro = _python_paths()
    work = Path(tempfile.mkdtemp(prefix=_owner_prefix()))
    os.chmod(work, 0o700)
    home = work / "home"
    home.mkdir(mode=0o700)
    cg = _pids_cgroup(nproc)
    prog = work / "program.py"
    prog.write_text(code)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    cfg = {"python": exe, "program": str(prog), "workdir": str(work), "home": str(home), "env": env,
           "read_only": ro, "timeout_s": timeout_s, "memory_mb": memory_mb,
           "cpu_s": int(cpu_s or max(1, int(timeout_s) + 1)), "file_mb": file_mb, "disk_mb": disk_mb,
           "nproc": nproc, "cgroup": str(cg) if cg else "", "namespaces": True, "landlock": True,
           "require": require_isolation, "parent": os.getpid()}
    t0 = time.perf_counter()
    try:
        with open(work / ".stdout", "wb") as out, open(work / ".stderr", "wb") as err:
            proc = subprocess.Popen([exe, "-I", "-S", "-c", _BOOT, json.dumps(cfg)], cwd=work, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                    close_fds=True)
            try:
                rc = proc.wait(timeout=timeout_s + 5.0)  # the supervisor enforces timeout_s; this is the backstop
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
                rc = 124
        dur = time.perf_counter() - t0
        stdout = _tail(work / ".stdout")
        stderr = _tail(work / ".stderr")
        iso_file = work / ".isolation"
        layers = ["process", "scrubbed-env", "private-tmp"] + (iso_file.read_text().split() if iso_file.exists()
                                                                 else [])
    finally:
        _kill_cgroup(cg)
        shutil.rmtree(work, ignore_errors=True)
    return SandboxResult(status=_status(rc, stderr), returncode=rc, duration_s=dur, stdout=stdout, stderr=stderr,
                         isolation=layers)


def _status(rc: int, stderr: str) -> str:
    """What the supervisor's exit code says happened to the program."""
    if rc == _SETUP_FAILED and "sandbox setup:" in stderr:
        return "error"
    if rc == 124 or rc == 128 + signal.SIGXCPU or rc == -signal.SIGXCPU:
        return "timeout"
    if rc in _STATUS:
        return _STATUS[rc]
    return "killed" if rc > 128 or rc < 0 else "failed"


def _kill_cgroup(cg: Path | None) -> None:
    """Kill anything left in the cgroup and remove it."""
    if cg is None:
        return
    for _ in range(50):
        try:
            pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
    _rmdir_quiet(cg)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _OUTPUT_TAIL))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
