"""The code-execution sandbox against malicious samples: secrets, files, network, hangs, memory, fork bombs and
attempts to kill the evaluator. Each attack runs for real; the evaluator (this test process) checks the damage."""

import os
import socket
import subprocess
import sys
import time

import pytest

from tasks.evaluation.sandbox import run_python

SECRET = "s3cr3t-AKIA-frenzy-test"


@pytest.fixture(scope="module")
def isolated():
    r = run_python("print('ok')")
    layers = set(r.isolation)
    if not {"netns", "pidns"} <= layers or not any(x.startswith("landlock") for x in layers):
        pytest.skip(f"this kernel offers only {sorted(layers)}; the full sandbox needs user namespaces and Landlock")
    return r


def test_a_correct_program_passes_and_a_failing_one_fails(isolated):
    assert run_python("assert sum(range(4)) == 6").status == "passed"
    bad = run_python("assert 1 == 2, 'nope'")
    assert bad.status == "failed" and "nope" in bad.stderr


def test_it_cannot_read_the_evaluators_secrets_or_files(isolated, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    secret_file = tmp_path / "credentials"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)  # world-readable: only the sandbox stands between it and the sample
    code = f"""
import os, glob
found = []
found.append(repr(dict(os.environ)))
for path in [{str(secret_file)!r}, "/proc/{os.getpid()}/environ", "/proc/1/environ", os.path.expanduser("~/.aws/credentials")]:
    try:
        found.append(open(path, errors="replace").read())
    except OSError as e:
        found.append("denied " + path + " " + type(e).__name__)
try:
    found.append(" ".join(os.listdir({str(tmp_path)!r})))
except OSError as e:
    found.append("denied listdir " + type(e).__name__)
print("\\n".join(found))
"""
    r = run_python(code)
    assert r.status == "passed", r.stderr
    assert SECRET not in r.stdout
    assert f"denied {secret_file}" in r.stdout and "denied listdir" in r.stdout


def test_it_cannot_write_outside_its_directory(isolated, tmp_path):
    target = tmp_path / "planted.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')")
    assert r.status == "failed" and not target.exists()
    assert run_python("open('mine.txt', 'w').write('ok'); print(open('mine.txt').read())").stdout.strip() == "ok"


def test_it_cannot_reach_the_network(isolated):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    r = run_python(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')")
    # A connection the sample made is in the listen queue once it has ended (the kernel completes the handshake
    # without an accept, and keeps it after the sample closes it), so one look now sees it: no accept left waiting
    # out a timeout beside the run (it waited 6 s whenever the sandbox held).
    srv.setblocking(False)
    try:
        hits = [srv.accept()]
    except BlockingIOError:
        hits = []
    srv.close()
    assert r.status == "failed" and "connected" not in r.stdout and not hits


def test_it_cannot_hang(isolated):
    t0 = time.monotonic()
    assert run_python("while True: pass", timeout_s=1.0).status == "timeout"
    r = run_python("import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(3600)", timeout_s=1.0)
    assert r.status == "timeout"
    assert time.monotonic() - t0 < 15


def test_it_cannot_exhaust_memory(isolated):
    r = run_python("x = bytearray(8 << 30)\nprint('allocated')", memory_mb=512)
    assert r.status == "failed" and "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_a_fork_bomb_is_contained(isolated):
    t0 = time.monotonic()
    r = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", timeout_s=2.0)
    # the process limit makes every fork past it fail, so the bomb spins until the wall clock ends it: a timeout,
    # not a crash of the sandbox or the host
    assert r.status == "timeout" and ("cgroup-pids" in r.isolation or "rlimit-nproc" in r.isolation)
    assert time.monotonic() - t0 < 20
    assert run_python("print('still works')").stdout.strip() == "still works"


def test_it_cannot_kill_the_evaluator_or_its_processes(isolated):
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = (
            f"import os, signal\nfor pid in ({os.getpid()}, {sentinel.pid}, {os.getppid()}):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print('refused', pid)\n"
            "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
        )
        r = run_python(code)
        time.sleep(0.2)
        assert sentinel.poll() is None, "the sandbox killed a process outside it"
        assert r.status in ("passed", "killed")  # kill(-1) may take the sample's own namespace down
    finally:
        sentinel.kill()
        sentinel.wait()


def test_results_report_the_isolation_layers(isolated):
    layers = isolated.isolation
    for layer in ("process", "scrubbed-env", "private-tmp", "rlimits", "userns", "pidns", "netns", "mntns", "disk-quota-64m"):
        assert layer in layers


def test_the_total_written_is_capped_not_only_each_file(isolated):
    """One 3-second program wrote 0.9 GB in files under the per-file limit; now its directory is a quota tmpfs."""
    code = """
import os
written = 0
try:
    for i in range(40):
        with open(f"f{i}.bin", "wb") as f:
            for _ in range(8):
                f.write(b"x" * (1 << 20))
                written += 1 << 20
except OSError as e:
    print("stopped", written >> 20, e.errno)
"""
    r = run_python(code, timeout_s=20, file_mb=16, disk_mb=32)
    assert r.stdout.startswith("stopped"), (r.status, r.stdout, r.stderr[-500:])
    mb, errno_ = int(r.stdout.split()[1]), int(r.stdout.split()[2])
    assert mb <= 32 and errno_ == 28  # ENOSPC at the quota, far below the 320 MB it tried


def test_the_work_directory_outside_its_home_is_not_writable(isolated):
    r = run_python("open('../program.py', 'a').write('# tampered')")
    assert r.status == "failed" and "Permission" in r.stderr


def test_the_program_dies_with_its_evaluator_and_its_state_is_swept():
    """A killed evaluator takes its sandboxed programs with it (no orphan runs on to its timeout), and the next
    sandbox run on the host removes the directory it could not clean up."""
    import glob
    import tempfile

    from tasks.evaluation import sandbox

    code = (
        "import sys\nsys.path.insert(0, '.')\nfrom tasks.evaluation.sandbox import run_python\n"
        "run_python('import time\\nprint(1, flush=True)\\ntime.sleep(120)', timeout_s=120)\n"
    )
    evaluator = subprocess.Popen([sys.executable, "-c", code])
    mine = os.path.join(tempfile.gettempdir(), f"frenzy-sbx-{evaluator.pid}-*")
    deadline = time.monotonic() + 60
    while not any(open(f).read().strip() == "1" for f in glob.glob(os.path.join(mine, ".stdout"))):
        assert time.monotonic() < deadline, "the sandboxed program never started"
        time.sleep(0.05)
    tree = [
        int(p) for p in subprocess.run(["pgrep", "-f", f"frenzy-sbx-{evaluator.pid}-"], capture_output=True, text=True).stdout.split()
    ]
    assert len(tree) >= 2  # the supervisor and the program (its path names the evaluator)
    evaluator.kill()
    evaluator.wait()
    deadline = time.monotonic() + 10
    while any(_running(p) for p in tree):
        assert time.monotonic() < deadline, "the sandboxed program outlived its evaluator"
        time.sleep(0.05)
    assert glob.glob(mine)  # the evaluator died before its cleanup
    assert any(r.startswith(mine[:-1]) for r in sandbox.sweep_stale()) and not glob.glob(mine)


def _running(pid: int) -> bool:
    from tasks.procs import alive

    return alive(pid)


def test_state_left_by_a_killed_evaluator_is_swept(tmp_path, monkeypatch):
    import tempfile

    from tasks.evaluation import sandbox

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"frenzy-sbx-{dead.pid}-1-abc"  # its owner has exited
    live = tmp_path / f"{sandbox._owner_prefix()}def"  # ours: running
    legacy = tmp_path / "frenzy-sbx-q1w2e3"  # no owner recorded: left alone
    for d in (stale, live, legacy):
        (d / "home").mkdir(parents=True)
    removed = sandbox.sweep_stale()
    assert str(stale) in removed and not stale.exists()
    assert live.exists() and legacy.exists()


@pytest.mark.parametrize("cheat", ["import sys\n    sys.exit(0)", "import os\n    os._exit(0)", "raise SystemExit(0)"])
def test_a_completion_that_exits_early_does_not_pass(isolated, cheat):
    """pass@1 comes from the harness finishing, not from exit status 0 (a wrong completion that exits 0 scored
    20/20 before)."""
    from tasks.evaluation.datasets import HumanEval

    he = HumanEval()
    ex = he.example(0)
    wrong = f"    {cheat}\n"
    assert he.score(ex, {"text": wrong})["pass@1"] == 0.0
    right = he.score(ex, {"text": ex["reference"]})
    assert right["pass@1"] == 1.0 and right["isolated"] == 1.0


def test_without_isolation_generated_code_is_refused_unless_allowed(monkeypatch):
    """A host without namespaces/Landlock (forced here by making the isolation layers fail to set up) refuses to
    run untrusted code, naming the opt-out; with the opt-out it runs and says it was not isolated."""
    from tasks.evaluation import datasets
    from tasks.evaluation.datasets import DatasetError, exec_score
    from tasks.evaluation.sandbox import SandboxResult

    def no_isolation(code, require_isolation=False, **kw):  # noqa: ANN001, ANN003, ANN202
        if require_isolation:
            return SandboxResult(
                status="error",
                returncode=97,
                duration_s=0.0,
                stdout="",
                stderr="sandbox setup: user namespaces unavailable",
                isolation=["process"],
            )
        return run_python(code, **kw)

    monkeypatch.setattr(datasets, "run_python", no_isolation)
    program = "def f():\n    return 1\n\nassert f() == 1\n"
    with pytest.raises(DatasetError, match="allow_unisolated"):
        exec_score(program, 3.0)
    allowed = exec_score(program, 3.0, allow_unisolated=True)
    assert allowed["pass@1"] == 1.0
