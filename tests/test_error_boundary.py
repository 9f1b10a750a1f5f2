"""The CLI's one error boundary (cli/output.py): a user's error exits 2 with its message; a bug exits 1, says it is a
bug and leaves its traceback in a file; errors of the machine are named as what they are; a closed pipe ends
quietly. Real errors throughout: /dev/full, a tmpfs that fills up, a read-only mount, a pipe whose reader is gone."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.output import run
from tasks.errors import FrenzyError, environment_problem, retry_cannot_fix

ROOT = Path(__file__).resolve().parents[1]


def _cmd(fn, json: bool = False) -> argparse.Namespace:
    return argparse.Namespace(fn=fn, command="probe", json=json)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FRENZY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_user_error_exits_2_with_its_message(capsys):
    def fn(args):
        raise FrenzyError("job.yaml: training.lr: give a positive number")

    assert run(_cmd(fn)) == 2
    assert capsys.readouterr().err == "frenzy probe: error: job.yaml: training.lr: give a positive number\n"


@pytest.mark.parametrize("exc", [ValueError("max() arg is an empty sequence"), RuntimeError("boom"), KeyError("x"),
                                 ZeroDivisionError("division by zero")])
def test_any_other_exception_is_a_bug_exit_1_with_the_traceback_in_a_file(exc, capsys, home):
    def fn(args):
        raise exc

    assert run(_cmd(fn)) == 1
    err = capsys.readouterr().err
    assert "a bug in Frenzy" in err and type(exc).__name__ in err and "Traceback" not in err
    crashes = list((home / "crash").iterdir())
    assert len(crashes) == 1 and str(crashes[0]) in err
    text = crashes[0].read_text()
    assert "Traceback (most recent call last)" in text and "in fn" in text


def test_a_bug_under_json_prints_only_the_error_document_on_stdout(capsys, home):
    def fn(args):
        print("chatter")
        raise AttributeError("'NoneType' object has no attribute 'x'")

    assert run(_cmd(fn, json=True)) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["error"]["kind"] == "bug" and "a bug in Frenzy" in out.err  # the chatter: not there


def test_the_crash_file_falls_back_to_stderr_when_it_cannot_be_written(capsys, monkeypatch, tmp_path):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("FRENZY_HOME", str(tmp_path / "afile"))  # a file: no crash/ directory can be made in it

    def fn(args):
        raise TypeError("unsupported operand")

    assert run(_cmd(fn)) == 1
    err = capsys.readouterr().err
    assert "a bug in Frenzy" in err and "Traceback (most recent call last)" in err


def test_a_full_disk_is_named_exit_2(capsys):
    def fn(args):
        with open("/dev/full", "w") as f:  # the kernel answers every write with ENOSPC
            f.write("x" * 10000)
            f.flush()

    assert run(_cmd(fn)) == 2
    err = capsys.readouterr().err
    assert "no space left on the device (the disk is full)" in err and "Traceback" not in err


@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "disk is full"), (errno.EROFS, "read-only file system"),
                                             (errno.EACCES, "permission denied"), (errno.ELOOP, "symlink loop"),
                                             (errno.EDQUOT, "quota")])
def test_environment_problems_are_named_and_not_retried(code, words):
    err = OSError(code, os.strerror(code), "/data/run/x.bin")
    assert words in environment_problem(err) and environment_problem(err).startswith("/data/run/x.bin: ")
    assert retry_cannot_fix(err)
    wrapped = RuntimeError("store failed")
    wrapped.__cause__ = err
    assert retry_cannot_fix(wrapped)


def test_transient_errors_stay_retryable():
    assert not retry_cannot_fix(OSError(errno.ECONNRESET, "reset"))
    assert not retry_cannot_fix(TimeoutError("slow"))
    assert environment_problem(ValueError("x")) is None


def test_a_pydantic_validation_error_names_the_field(capsys):
    from pydantic import BaseModel, Field

    class Request(BaseModel):
        max_wait_s: float = Field(gt=0)

    def fn(args):
        Request(max_wait_s=-1)

    assert run(_cmd(fn)) == 2
    err = capsys.readouterr().err
    assert "max_wait_s" in err and "greater than 0" in err and "Traceback" not in err


def test_ctrl_c_exits_130(capsys):
    def fn(args):
        raise KeyboardInterrupt

    assert run(_cmd(fn)) == 130
    assert "interrupted" in capsys.readouterr().err


def _frenzy(*argv: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "cli.main", *argv], cwd=ROOT, env=env, stderr=subprocess.PIPE,
                            **kw)


@pytest.mark.parametrize("argv", [["presets"], ["gpus", "--json"]])
def test_output_piped_into_a_closed_reader_ends_quietly(argv):
    """`frenzy presets | head -0`: the reader is gone before frenzy writes; no traceback, no 'Exception ignored'."""
    p = _frenzy(*argv, stdout=subprocess.PIPE)
    p.stdout.close()  # the reader goes away at once: every write is EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert err == ""


def test_output_piped_into_head_ends_quietly():
    r, w = os.pipe()
    p = _frenzy("eval-plan", "--suite", "acme63", "--nodes", "8", stdout=w)
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        first = reader.readline()  # `head -1`: one line, then the reader is gone
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) in (0, 141), err
    assert first.startswith(b"suite acme63") and "Traceback" not in err and "Exception ignored" not in err


def test_storage_does_not_retry_a_full_disk(tmp_path, caplog):
    """A shard whose path leads to /dev/full: the kernel answers ENOSPC; one attempt, a StorageError that says the
    disk is full (the old loop retried it eight times with backoff, for minutes)."""
    from tasks.training.storage import Storage, StorageError

    (tmp_path / "step_00000002").mkdir()
    (tmp_path / "step_00000002" / "rank00000.bin").symlink_to("/dev/full")
    s = Storage(str(tmp_path), attempts=8, backoff_s=30.0)
    caplog.set_level(logging.WARNING, logger="frenzy.storage")
    with pytest.raises(StorageError, match="disk is full") as info:
        s.write_stream("step_00000002/rank00000.bin", lambda: [memoryview(b"x" * 65536)] * 4)
    assert "not retried" in str(info.value) and isinstance(info.value, FrenzyError)
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


def _unshare() -> list[str]:
    """`unshare` into a private mount namespace (as root, or as an unprivileged user mapped to root), or skip."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    cmd = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    if subprocess.run([*cmd, "true"], capture_output=True).returncode != 0:
        pytest.skip("this kernel allows no private mount namespace")
    return cmd


def _in_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRENZY_HOME": str(tmp_path / "home"), "PY": sys.executable}
    return subprocess.run([*_unshare(), "sh", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_data_prepare_onto_a_full_disk_is_named_and_leaves_no_partial_output(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 20000)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = _in_namespace(f"mount -t tmpfs -o size=128k tmpfs {mnt}\n"
                      f"$PY -m cli.main data prepare {corpus} --out {mnt}/shards --shard-tokens 1024; echo rc=$?\n"
                      f"ls -A {mnt}", tmp_path)
    assert "rc=2" in r.stdout, r.stderr
    assert "no space left on the device" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout.split("rc=2", 1)[1].split() == []  # no half-written output, and no lock file left
    assert f"writing {mnt}/shards" in r.stderr


def test_a_ledger_on_a_read_only_file_system_is_named(tmp_path):
    ledger = tmp_path / "ro" / "ledger.db"
    ledger.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    init = subprocess.run([sys.executable, "-m", "cli.main", "cluster", "init", "--cluster", "phoebe", "--ledger",
                           str(ledger)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    r = _in_namespace(f"mount --bind -o ro {ledger.parent} {ledger.parent}\n"
                      f"$PY -m cli.main cluster cordon ampere-0 --ledger {ledger}; echo rc=$?", tmp_path)
    assert "rc=2" in r.stdout, r.stderr
    assert "read-only" in r.stderr and "Traceback" not in r.stderr and "OperationalError" not in r.stderr


def test_a_ledger_on_a_full_disk_is_named_as_a_full_disk_with_its_path_and_the_fix(tmp_path):
    """Red team 41e S15b: "disk I/O error". A new ledger on a full tmpfs, and a ledger whose disk fills after it was
    made: both name the full disk, the directory and what to do."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = _in_namespace(f"mount -t tmpfs -o size=1m tmpfs {mnt}\n"
                      f"$PY -m cli.main cluster init --cluster phoebe --ledger {mnt}/kept.db; echo rc=$?\n"
                      f"head -c 2M /dev/zero > {mnt}/fill 2>/dev/null\n"
                      f"$PY -m cli.main cluster init --cluster phoebe --ledger {mnt}/new.db; echo rc=$?\n"
                      f"$PY -m cli.main cluster cordon ampere-0 --ledger {mnt}/kept.db; echo rc=$?", tmp_path)
    assert [w for w in r.stdout.split() if w.startswith("rc=")] == ["rc=0", "rc=2", "rc=2"], (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2, r.stderr
    for line in lines:  # SQLite says SQLITE_FULL, or SQLITE_IOERR_SHMSIZE ("disk I/O error") when its -shm cannot grow
        assert "the ledger at sqlite:///" in line and f"the disk holding {mnt} is full" in line, line
        assert "free space there" in line and "disk I/O error" not in line and "Traceback" not in line, line


def test_an_evaluation_onto_a_full_history_disk_names_the_directory_and_its_disk_and_leaves_no_empty_steps(tmp_path):
    """Red team 41h N8: `--history-dir` on a disk that filled: each step failed with a bare `OSError: [Errno 28]`
    (the lock beside the step's directory could not be written) and left an empty step directory on the full disk."""
    import torch

    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    c = ck.AsyncCheckpointer(Storage(f"file://{tmp_path}/ck"), 0, 1, run="t", keep=5)
    c.save(10, [("model.w", torch.zeros(4))], {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {},
                                               "fingerprint": {}})
    c.close()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = ("from tasks.evaluation.record import evaluate_and_record; from tasks.evaluation.suite import load_suite; "
            "from tasks.evaluation.runner import EvalOptions\n"
            "try:\n"
            f"    evaluate_and_record('{tmp_path}/ck/step_00000010', load_suite('quick'), EvalOptions(device='cpu'), "
            f"history_dir='{mnt}/hist', reevaluate=False)\n"
            "except Exception as err:\n"
            "    print(type(err).__name__, err)\n")
    (tmp_path / "ev.py").write_text(code)
    r = _in_namespace(f"mount -t tmpfs -o size=64k tmpfs {mnt}\nhead -c 1M /dev/zero > {mnt}/fill 2>/dev/null\n"
                      f"$PY {tmp_path}/ev.py; find {mnt} | sort", tmp_path)
    out = r.stdout.strip().splitlines()
    assert out[0].startswith("EnvironmentProblem "), (r.stdout, r.stderr[-2000:])
    assert f"writing {mnt}/hist/t/step_00000010/quick (the file system mounted at {mnt})" in out[0], out[0]
    assert "disk is full" in out[0] and "free space there" in out[0], out[0]
    assert out[1:] == [str(mnt), f"{mnt}/fill"], out  # no empty hist/t/step_N directories, no lock file


def test_a_closed_stdout_is_named_before_any_work():
    """`frenzy gpus --json >&-`: the answer has nowhere to go; say so (exit 2) rather than drop it or crash."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cli.main", "gpus", "--json"], cwd=ROOT, env=env, capture_output=False,
                       stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert p.returncode == 2, p.stderr
    assert "stdout is closed" in p.stderr and "Traceback" not in p.stderr


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound and closed at once: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_prefect_api_is_a_configuration_error_exit_2_naming_the_url(capsys, home, monkeypatch):
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    url = f"http://127.0.0.1:{_closed_port()}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)

    def fn(args):  # a real request of the Prefect client to a port nothing listens on
        from prefect import get_client

        with temporary_settings({PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: 0}):
            with get_client(sync_client=True) as client:
                client.read_deployment_by_name("evaluate-checkpoint/evaluate-on-checkpoint")

    assert run(_cmd(fn)) == 2
    err = capsys.readouterr().err
    assert f"cannot reach the Prefect API at {url}" in err and "Connection refused" in err
    assert "prefect server start" in err and "unset PREFECT_API_URL" in err and "a bug" not in err
    assert not (home / "crash").exists()


def test_submit_with_a_wrong_prefect_api_url_exits_2_without_a_crash_file(tmp_path, home):
    url = f"http://127.0.0.1:{_closed_port()}/api/"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": url, "PREFECT_CLIENT_MAX_RETRIES": "0",
           "FRENZY_HOME": str(home)}
    ledger = str(tmp_path / "ledger.db")
    subprocess.run([sys.executable, "-m", "cli", "cluster", "init", "--ledger", ledger, "--cluster", "local"], env=env,
                   cwd=tmp_path, check=True, capture_output=True)
    p = subprocess.run([sys.executable, "-m", "cli", "submit", str(ROOT / "examples/jobs/tiny.yaml"), "--device", "cpu",
                        "--ledger", ledger], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"cannot reach the Prefect API at {url}" in p.stderr and "prefect server start" in p.stderr
    assert not (home / "crash").exists()


def test_a_persist_that_fills_the_disk_leaves_no_half_shard_and_names_the_newest_commit(tmp_path):
    """Red team 41f S18: a checkpoint root on a tmpfs that filled mid-run kept a 1.1 MB half-written shard, and the
    final error did not say which step a rerun resumes from."""
    import torch

    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    st = Storage(f"file://{tmp_path}/ck")
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    c = ck.AsyncCheckpointer(st, 0, 1, run="full", keep=5)
    c.save(1, [("w", torch.zeros(4096))], fields)
    c.wait()
    (tmp_path / "ck" / "step_00000002").mkdir()
    (tmp_path / "ck" / "step_00000002" / "rank00000.bin").symlink_to("/dev/full")  # the kernel answers ENOSPC
    c.save(2, [("w", torch.ones(4096))], fields)
    with pytest.raises(ck.CheckpointError, match="disk is full") as info:
        c.close()
    assert "step 1 is the newest this run committed (a rerun resumes from it)" in str(info.value)
    assert not (tmp_path / "ck" / "step_00000002").exists()  # the part-written shard and its directory are gone
    assert [m.step for m in ck.committed(st)] == [1]


def test_a_checkpoint_disk_that_fills_while_training_stops_the_trainer_naming_the_disk_not_a_lease_loss(tmp_path):
    """Red team 41i N13: the checkpoint root's tmpfs filled after the first commit; every later persist failed, the
    writer lease could not be renewed, and the trainer ended "lost the writer lease ... another trainer took it over"
    (no other trainer existed). It must stop on the first checkpoint the full disk refused, say so with the root's
    file system, and name the newest committed step and how to resume. A 3 s lease: a trainer that went on training
    would lose it within the run, as the red team's did."""
    mnt, run = tmp_path / "mnt", tmp_path / "run"
    mnt.mkdir()
    t = {"seq_len": 64, "global_batch": 8, "precision": "fp32", "steps": 3000, "lr": 1e-3, "log_every_steps": 1,
         "checkpoint": {"every_steps": 2, "keep": 5, "uri": f"file://{mnt}/ck"}}
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "full", "model": {"preset": "gpt-tiny"}, "training": t}))
    r = _in_namespace(
        f"mount -t tmpfs -o size=8m tmpfs {mnt}\n"
        f"FRENZY_WRITER_LEASE_S=3 $PY -m cli train {tmp_path}/job.yaml --run-dir {run} --device cpu --threads 1 "
        f"2> {tmp_path}/err &\n"
        # the first commit is there: fill the disk under the running trainer (a poll: the event is another process's)
        f"while [ ! -e {mnt}/ck/step_00000002/manifest.json ] && kill -0 $!; do sleep 0.1; done\n"
        f"head -c 64M /dev/zero > {mnt}/fill 2>/dev/null\nwait $!; echo rc=$?", tmp_path)
    err = (tmp_path / "err").read_text()
    assert "rc=2" in r.stdout, (r.stdout, r.stderr, err[-3000:])
    line = [ln for ln in err.splitlines() if ln.startswith("frenzy train:")][-1]
    assert f"the checkpoint root file://{mnt}/ck (the file system mounted at {mnt}) cannot be written" in line, line
    assert "no space left on the device (the disk is full)" in line and "Training stopped at step" in line, line
    m = re.search(r"Training stopped at step (\d+), .*; step (\d+) is the newest committed step; once that is fixed, "
                  r"rerun the same command with --resume: it resumes from step \2$", line)
    assert m is not None and int(m[2]) >= 2 and int(m[2]) % 2 == 0 and int(m[1]) > int(m[2]), line
    committed = [int(x) for x in re.findall(r"checkpoint step (\d+) committed", err)]
    assert committed and max(committed) == int(m[2]), (committed, line)  # the step named is the newest commit
    # the full disk may refuse the lease's renewal (a write in the root) before a checkpoint's: the line may say so,
    # but never that the lease was lost to another trainer
    assert "lost the writer lease" not in line and "another trainer" not in line and "Traceback" not in err, line


class _Api404:
    """A web server on loopback that is not Prefect's API where PREFECT_API_URL points: 404 Not Found everywhere, except
    (with `api_below`) Prefect's version endpoint under `/api`, as a Prefect server answers a URL without its `/api`."""

    def __init__(self, api_below: bool) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                ok = api_below and self.path == "/api/admin/version"
                body = b'"3.8.8"' if ok else b'{"detail":"Not Found"}'
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("api_below", [True, False])
def test_a_prefect_api_url_without_api_is_said_as_a_404_with_the_url_that_answers(api_below: bool):
    """Red team 41g V1: PREFECT_API_URL without `/api` was reported as "nothing answers there", the cause cut mid-URL,
    after 22 s. A server answering 404 is said as such, with the whole URL tried and the fix, from one probe."""
    from cli.console import ApiNotThere, check_prefect_api

    srv = _Api404(api_below)
    try:
        with pytest.raises(ApiNotThere) as e:
            check_prefect_api(srv.url)
        msg = str(e.value)
        assert f"a server answered 404 Not Found at {srv.url}/admin/version" in msg and "nothing answers" not in msg
        if api_below:
            assert f"set PREFECT_API_URL={srv.url}/api (that URL answers)" in msg
        else:
            assert "the URL probably lacks `/api`" in msg and f"PREFECT_API_URL={srv.url}/api" in msg
        if api_below:  # the control: the URL with `/api` passes the probe
            check_prefect_api(f"{srv.url}/api")
            check_prefect_api(f"{srv.url}/api/")
    finally:
        srv.close()


def test_the_probe_of_a_closed_port_says_nothing_answers_with_the_whole_cause():
    from cli.console import ApiNotThere, check_prefect_api

    url = f"http://127.0.0.1:{_closed_port()}/api"
    with pytest.raises(ApiNotThere) as e:
        check_prefect_api(url)
    assert f"cannot reach the Prefect API at {url} (PREFECT_API_URL): nothing answers there (ConnectError: " in str(e.value)
    assert "Connection refused)" in str(e.value) and "prefect server start" in str(e.value)


def test_a_prefect_clients_404_is_named_as_a_404_not_as_nothing_answering(capsys, monkeypatch):
    """The same 404 met by Prefect's own client (a notebook, a flow calling the API): exit 2, the whole URL."""
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    srv = _Api404(api_below=False)
    monkeypatch.setenv("PREFECT_API_URL", srv.url)
    try:
        def fn(args):
            from prefect import get_client

            with temporary_settings({PREFECT_API_URL: srv.url, PREFECT_CLIENT_MAX_RETRIES: 0}):
                with get_client(sync_client=True) as client:
                    client.read_deployment_by_name("evaluate-checkpoint/evaluate-on-checkpoint")

        assert run(_cmd(fn)) == 2
    finally:
        srv.close()
    err = capsys.readouterr().err
    assert f"the Prefect API is not at {srv.url} (PREFECT_API_URL): a server answered 404 Not Found at {srv.url}/" in err
    assert "the URL probably lacks `/api`" in err and "a bug" not in err


def test_submit_against_a_url_without_api_exits_2_naming_the_404(tmp_path, home):
    srv = _Api404(api_below=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": srv.url, "FRENZY_HOME": str(home)}
    try:
        ledger = str(tmp_path / "ledger.db")
        subprocess.run([sys.executable, "-m", "cli", "cluster", "init", "--ledger", ledger, "--cluster", "local"],
                       env=env, cwd=tmp_path, check=True, capture_output=True)
        p = subprocess.run([sys.executable, "-m", "cli", "submit", str(ROOT / "examples/jobs/tiny.yaml"), "--device",
                            "cpu", "--ledger", ledger], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        srv.close()
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"a server answered 404 Not Found at {srv.url}/admin/version: set PREFECT_API_URL={srv.url}/api" in p.stderr
    assert not (home / "crash").exists()


def test_a_404_of_another_request_is_an_object_not_found_not_a_missing_api(monkeypatch):
    """The control: under a URL that is the API, a 404 (a deployment that does not exist) is not said as a wrong URL."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from tasks.errors import unreachable_api

    srv = _Api404(api_below=True)
    url = f"{srv.url}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    try:
        with temporary_settings({PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: 0}):
            with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound) as e:
                client.read_deployment_by_name("evaluate-checkpoint/evaluate-on-checkpoint")
    finally:
        srv.close()
    assert unreachable_api(e.value) is None


def test_a_server_slow_to_answer_is_left_to_prefect_not_called_unreachable():
    """Found on a loaded machine: the probe's 5 s ran out on a test server that was up but slow, and submit said
    "nothing answers there". A connection made is a server there: only a refused (or unmade) connection is said."""
    import socket

    from cli.console import check_prefect_api

    with socket.socket() as s:  # accepts connections (the kernel's backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        check_prefect_api(f"http://127.0.0.1:{s.getsockname()[1]}/api", timeout_s=0.5)


def _address_space(limit_kib: int | None):
    def set_limit() -> None:
        import resource

        if limit_kib is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_kib * 1024, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return set_limit


def test_a_memory_limit_that_stops_the_imports_is_named_with_the_limit_and_the_fix(tmp_path):
    """Red team 41i N10: under a tight `ulimit -v` torch cannot map its library: a 25-line traceback, exit 1
    (`checkpoints`: "a bug in Frenzy"). Now one line, exit 2, naming the limit and the fix; `--help` needs no torch
    and works under the same limit, and without the limit (the negative control) the same imports load. 500,000 KiB:
    torch's library does not map under it on x86_64 (2026-11-26: `import torch` loads under 800,000); a trainer that
    glibc aborts there (thread-local data) is named from its log, and an earlier run's error in that log is not."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRENZY_HOME": str(tmp_path / "home")}
    shutil.copy(ROOT / "examples" / "jobs" / "tiny.yaml", tmp_path / "job.yaml")
    ledger = str(tmp_path / "ledger.db")  # a real ledger: a missing one is refused first, before any heavy import
    made = subprocess.run([sys.executable, "-m", "cli", "cluster", "init", "--cluster", "phoebe", "--ledger", ledger],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    args = ["submit", "job.yaml", "--evaluation", "off", "--ledger", ledger]
    r = subprocess.run([sys.executable, "-m", "cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300, preexec_fn=_address_space(500_000))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("frenzy submit: error: out of memory under this process's address-space limit "
                           "(`ulimit -v` = 500,000 KiB)"), line
    assert "raise the limit (`ulimit -v unlimited`" in line and "a bug" not in line, line
    # the negative control: without the limit the same imports (the flow's and the trainer's) load here
    ok = subprocess.run([sys.executable, "-c", "import flows.submit, tasks.training.trainer"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    # the trainer process meets the same limit at its own imports: the same line, from `frenzy train`
    trained = subprocess.run([sys.executable, "-m", "cli", "train", "job.yaml", "--steps", "2"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300, preexec_fn=_address_space(500_000))
    assert trained.returncode == 2 and trained.stderr.strip().startswith(
        "frenzy train: error: out of memory under this process's address-space limit"), trained.stderr[-2000:]
    assert "Traceback" not in trained.stderr, trained.stderr[-2000:]
    helped = subprocess.run([sys.executable, "-m", "cli", "submit", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120, preexec_fn=_address_space(500_000))
    assert helped.returncode == 0 and "usage: frenzy submit" in helped.stdout, helped.stderr[-2000:]


def test_memory_problems_are_named_and_other_import_errors_are_not():
    from tasks.errors import memory_problem

    assert memory_problem(MemoryError()) is not None
    assert memory_problem(OSError(errno.ENOMEM, "Cannot allocate memory")) is not None
    wrapped = RuntimeError("loading failed")
    wrapped.__cause__ = ImportError("libtorch_cpu.so: failed to map segment from shared object")
    assert "out of memory" in (memory_problem(wrapped) or "")
    assert memory_problem(ImportError("No module named 'nope'")) is None  # a missing module is not a memory limit
    assert memory_problem(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) is None
    assert run_fails_with(MemoryError()) == 2


def run_fails_with(err: BaseException) -> int:
    def boom(_: argparse.Namespace) -> int:
        raise err
    return run(argparse.Namespace(command="x", fn=boom, json=False))


@pytest.mark.parametrize("json_flag", [True, False], ids=["json", "table"])
def test_an_answer_that_stdout_refuses_names_standard_output_not_a_disk(tmp_path, json_flag):
    """Red team 41i N12: `frenzy submit ... > /dev/full` ended "no space left on the device (the disk is full): free
    space there", naming nothing, after a run that had finished. The answer's destination is named: standard output
    (/dev/full); negative control: the same command to /dev/null exits 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRENZY_HOME": str(tmp_path / "home")}
    args = [sys.executable, "-m", "cli", "presets", *(["--json"] if json_flag else [])]
    with open("/dev/full", "w") as full:
        r = subprocess.run(args, cwd=tmp_path, env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("frenzy presets: error: ") and "answer could not be written to standard output " in r.stderr
    assert "standard output (/dev/full): no space left on the device" in r.stderr and "Traceback" not in r.stderr
    with open(os.devnull, "w") as null:
        assert subprocess.run(args, cwd=tmp_path, env=env, stdout=null, timeout=120).returncode == 0


def test_a_home_that_does_not_exist_is_named_not_called_a_slow_server(tmp_path):
    """Found trying `frenzy demo` with HOME set to a directory not made yet: Prefect could not make ~/.prefect for its
    embedded API's database, and the wait ended in "did not start within 120 s (a loaded machine)". Now said at once,
    with the directory and the fix; with a HOME that exists (the negative control) the check passes and makes it."""
    shutil.copy(ROOT / "examples" / "jobs" / "tiny.yaml", tmp_path / "job.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PYTHONPATH": str(ROOT), "FRENZY_HOME": str(tmp_path / "fh"), "HOME": str(tmp_path / "missing")}
    r = subprocess.run([sys.executable, "-m", "cli", "submit", "job.yaml", "--evaluation", "off"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith(
        f"frenzy submit: error: Prefect's home directory {tmp_path}/missing/.prefect cannot be made: {tmp_path}/missing "
        "does not exist"), r.stderr[-2000:]
    assert "did not start within" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    (tmp_path / "home").mkdir()
    ok = subprocess.run([sys.executable, "-c", "from cli.console import check_prefect_home; check_prefect_home()"],
                        cwd=tmp_path, env=env | {"HOME": str(tmp_path / "home")}, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and (tmp_path / "home" / ".prefect").is_dir(), ok.stderr[-2000:]


def test_a_trainer_failure_is_read_from_its_own_launch_not_an_earlier_run(tmp_path):
    """Found under `ulimit -v`: a trainer aborted by glibc (no marked line) was reported with the marked error of the
    run before it, appended to the same train.log. The failure reads only this launch's part of the log."""
    from tasks.training.launch import _ERROR_MARK, _failure

    log = tmp_path / "train.log"
    log.write_text(f"{_ERROR_MARK}an earlier run's error\n")
    start = log.stat().st_size
    with open(log, "a") as f:
        f.write("Fatal Python error: Segmentation fault\n")
    failed = _failure(-11, log, start)
    assert "earlier" not in str(failed) and failed.returncode == -11, str(failed)
    assert "signal 11 (SIGSEGV)" in failed.log_tail
    assert _failure(1, log, 0).returncode == 2  # the whole log: the marked line is found (the control)
    with open(log, "a") as f:
        f.write("cannot allocate memory for thread-local data: ABORT\n")
    starved = _failure(127, log, start)
    assert starved.returncode == 2 and str(starved).startswith("out of memory"), str(starved)
