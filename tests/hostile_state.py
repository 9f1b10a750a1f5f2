"""Hostile state files (issue 32's OOM observations / writer lease row) and hostile programs in the evaluation
sandbox (its sandbox row): a damaged lease or observation never crashes or blocks a run, a sample never escapes."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from tests.hostile_kit import Case, Run, lib

L, OOM, X = "lease", "oom", "sandbox"


def _lease(content: bytes | Callable[[], bytes]) -> Callable[[Path], Run]:
    """A second trainer starts on a root whose writer.json holds `content`."""
    def act(root: Path) -> Run:
        from tasks.training.storage import Storage
        from tasks.training.writer import WriterLease

        (root / "writer.json").write_bytes(content() if callable(content) else content)
        lease = WriterLease(Storage(f"file://{root}"), "r")

        def go() -> bool:
            lease.acquire()
            return lease.holds()
        return lib(go)
    return act


def _holder(**kv: object) -> bytes:
    d = {"owner": "other", "host": "elsewhere", "pid": 4242, "started": None, "run": "r", "expires": time.time() + 60}
    return json.dumps({**d, **kv}).encode()


def _live_holder() -> bytes:
    from tasks.procs import start_ticks

    return _holder(host=socket.gethostname(), pid=os.getpid(), started=start_ticks(os.getpid()))


def _held(root: Path, run: Run) -> bool:
    return run.value is True


def _oom(lines: Callable[[str], list[bytes]]) -> Callable[[Path], Run]:
    """Plans for a job after the observations file holds `lines` (given the job's model key)."""
    def act(root: Path) -> Run:
        from tasks.planning.calibration import calibrate, load_observations, model_key
        from tests.trainer_util import tiny_job

        job = tiny_job(f"file://{root}/ck")
        path = root / "oom.jsonl"
        path.write_bytes(b"\n".join(lines(model_key(job))) + b"\n")
        return lib(lambda: calibrate(job, load_observations(path)))
    return act


def _obs(key: str, predicted: float | str, memory: float = 80.0) -> bytes:
    return json.dumps({"model_key": key, "model": "m", "seq_len": 64, "gpu_type": "A100", "gpu_memory_gib": memory,
                       "layout": "dp1", "predicted_device_gib": predicted}).encode()


def _factor(want: float) -> Callable[[Path, Run], bool]:
    return lambda root, run: math.isclose(run.value.factor, want)  # type: ignore[attr-defined]


def _sandbox(code: str, **kw: object) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        from tasks.evaluation.sandbox import run_python

        r = run_python(code.replace("ROOT", str(root)), **kw)  # type: ignore[arg-type]
        return Run(0, out=r.stdout[-300:] + r.stderr[-300:], value=r)  # the sample's traceback is no Frenzy one
    return act


def _status(*ok: str, absent: str = "", lacks: str = "") -> Callable[[Path, Run], bool]:
    def check(root: Path, run: Run) -> bool:
        r = run.value
        return r.status in ok and not (absent and (root / absent).exists()) and not (  # type: ignore[attr-defined]
            lacks and lacks in r.stdout)  # type: ignore[attr-defined]
    return check


CASES = [
    Case(L, "expires 'soon'", _lease(_holder(expires="soon")), _held),
    Case(L, "expires 1e300", _lease(_holder(expires=1e300)), _held),
    Case(L, "expires in 2286", _lease(_holder(expires=9.9e9)), _held),
    Case(L, "expires NaN", _lease(b'{"owner": "o", "host": "h", "pid": 1, "started": null, "run": "r", '
                                  b'"expires": NaN}'), _held),
    Case(L, "lease not JSON", _lease(b"{oops"), _held),
    Case(L, "lease a JSON list", _lease(b"[1, 2]"), _held),
    Case(L, "lease not UTF-8", _lease(b"\xff\xfe"), _held),
    Case(L, "lease pid a string", _lease(_holder(pid="12")), _held),
    Case(L, "a live holder is refused by name", _lease(_live_holder), ("being written by", "checkpoint.uri")),
    Case(OOM, "a valid observation raises the factor", _oom(lambda k: [_obs(k, 40.0)]), _factor(2.0)),
    Case(OOM, "predicted 0 GiB", _oom(lambda k: [_obs(k, 0.0), _obs(k, 40.0)]), _factor(2.0)),
    Case(OOM, "predicted NaN", _oom(lambda k: [_obs(k, 40.0).replace(b"40.0", b"NaN"), _obs(k, 40.0)]), _factor(2.0)),
    Case(OOM, "predicted negative", _oom(lambda k: [_obs(k, -5.0)]), _factor(1.0)),
    Case(OOM, "gpu memory 0", _oom(lambda k: [_obs(k, 40.0, memory=0.0)]), _factor(1.0)),
    Case(OOM, "a line not UTF-8", _oom(lambda k: [b"\xff\xfe garbage", _obs(k, 40.0)]), _factor(2.0)),
    Case(OOM, "a torn last line", _oom(lambda k: [_obs(k, 40.0), _obs(k, 20.0)[:30]]), _factor(2.0)),
    Case(X, "a correct program passes", _sandbox("assert sum(range(4)) == 6"), _status("passed")),
    Case(X, "a syntax error fails", _sandbox("def f(:"), _status("failed")),
    Case(X, "a NUL byte in the code fails", _sandbox("print(1)\x00"), _status("failed", "error")),
    Case(X, "an endless loop times out", _sandbox("while True: pass", timeout_s=1.0), _status("timeout")),
    Case(X, "SIGALRM ignored still times out", _sandbox(
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(3600)", timeout_s=1.0),
        _status("timeout")),
    Case(X, "8 GiB allocation fails", _sandbox("x = bytearray(8 << 30)\nprint('allocated')", memory_mb=512),
         _status("failed", "killed", lacks="allocated")),
    Case(X, "a fork bomb is contained", _sandbox(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", timeout_s=2.0),
        _status("timeout", "killed")),
    Case(X, "writing outside its directory fails", _sandbox("open('ROOT/planted.txt', 'w').write('x')"),
         _status("failed", absent="planted.txt")),
    Case(X, "100 MB on stdout is cut", _sandbox("import sys\nsys.stdout.write('x' * (100 << 20))"),
         lambda root, run: len(run.value.stdout) < (100 << 20)),  # type: ignore[attr-defined]
    Case(X, "a 1 GB file is refused", _sandbox("open('big', 'wb').write(b'x' * (1 << 30))", file_mb=16),
         _status("failed", "killed")),
    Case(X, "non-UTF-8 output is read", _sandbox("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok')"),
         _status("passed")),
]


def _forbidding(root: Path) -> Run:
    """Observations that exclude the only layouts a small cluster offers: the refusal must say they are why."""
    from cluster.inventory import load_cluster
    from tasks.jobspec import parse_job
    from tasks.planning.calibration import load_observations, model_key
    from tasks.planning.plans import plan_resources

    job = parse_job({"name": "j", "model": {"preset": "gpt2-350m"}, "training": {"seq_len": 1024, "global_batch": 32}})
    cluster = load_cluster("phoebe")
    path = root / "oom.jsonl"
    lines = [_obs(model_key(job), 0.5, memory=500.0).replace(b'"seq_len": 64', b'"seq_len": 1024')]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return lib(lambda: plan_resources(job, cluster, observations=load_observations(path)))


CASES.append(Case(OOM, "observations that forbid every layout name themselves", _forbidding,
                  ("recorded out-of-memory", "delete their lines")))
