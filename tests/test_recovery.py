"""Automatic recovery in the submit flow (issue 19): each injected failure ends in the right action, with no
committed step lost. The faults are real: the trainer prints the real stack's error line and exits, hangs, or is
killed by a signal; the flow diagnoses its log and acts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster.ledger import Ledger
from tasks.diagnosis.diagnose import diagnose
from tasks.diagnosis.recovery import decide
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tests.test_submit import _job


def _submit(tmp: Path, env: dict[str, str], *extra: str, steps: int = 60, wait: bool = True,
            ) -> subprocess.Popen | tuple[int, dict | None, str]:
    from prefect.settings import PREFECT_API_URL

    (tmp / "job.yaml").write_text(yaml.safe_dump(_job(tmp, name="rec", steps=steps, every=10)))
    Ledger(str(tmp / "l.db"))  # `submit --ledger` takes an existing ledger (a mistyped path is refused)
    cmd = [sys.executable, "-m", "cli", "submit", "job.yaml", "--ledger", str(tmp / "l.db"), "--evaluation",
           "off", "--device", "cpu", "--run-dir", str(tmp / "run"), "--json", *extra]
    full_env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value() or "", "FRENZY_HOME": str(tmp / "home"), **env}
    p = subprocess.Popen(cmd, cwd=tmp, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=600)
    return p.returncode, json.loads(out) if p.returncode == 0 and out.strip() else None, err


def _no_step_lost(tmp: Path, res: dict) -> None:
    steps = [m.step for m in ck.committed(Storage(f"file://{tmp}/ckpt"))]
    assert res["train"]["final_step"] == max(steps)
    assert Ledger(str(tmp / "l.db")).allocations() == []


@pytest.mark.slow  # a whole submit flow each (about a minute)
def test_a_cuda_error_is_diagnosed_and_training_resumes(prefect_server, tmp_path):
    code, res, err = _submit(tmp_path, {"FRENZY_FAULT_RAISE": "25:RuntimeError: CUDA error: an illegal memory "
                                                               "access was encountered"})
    assert code == 0, err[-3000:]
    [rec] = res["recoveries"]
    assert rec["diagnosis"]["type"] == "CUDAError" and rec["action"]["kind"] == "resume"
    assert rec["action"]["node_check"] is True
    assert res["train"]["resumed_from_step"] == 20 and res["train"]["final_step"] == 60  # the commit before it
    _no_step_lost(tmp_path, res)


@pytest.mark.slow  # a whole submit flow each (about a minute)
def test_an_object_store_failure_is_diagnosed_and_training_resumes(prefect_server, tmp_path):
    # what s3fs raises when the endpoint is down past every retry (the trainer rides out shorter outages:
    # tests/test_s3_checkpoint.py)
    line = ("botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL: "
            '"http://127.0.0.1:9000/frenzy/rec/step_00000030/rank00000.bin"')
    code, res, err = _submit(tmp_path, {"FRENZY_FAULT_RAISE": f"33:{line}"})
    assert code == 0, err[-3000:]
    [rec] = res["recoveries"]
    assert rec["diagnosis"]["type"] == "S3StorageError" and rec["diagnosis"]["category"] == "infrastructure"
    assert rec["action"]["kind"] == "resume"
    assert res["train"]["resumed_from_step"] == 30 and res["train"]["final_step"] == 60
    _no_step_lost(tmp_path, res)


@pytest.mark.slow  # a whole submit flow each (about a minute)
def test_a_script_error_stops_at_once_with_the_diagnosis(prefect_server, tmp_path):
    code, _, err = _submit(tmp_path, {"FRENZY_FAULT_RAISE": "15:KeyError: 'optimizer'"})
    assert code == 2
    assert "KeyError (script)" in err and "not restartable" in err and "recovery" not in err.split("error:")[-1]
    assert Ledger(str(tmp_path / "l.db")).allocations() == []


@pytest.mark.slow  # a whole submit flow each (about a minute)
def test_out_of_memory_replans_with_marp_and_resumes_on_the_new_layout(prefect_server, tmp_path):
    code, res, err = _submit(tmp_path, {"FRENZY_FAULT_RAISE": "12:torch.OutOfMemoryError: CUDA out of memory. Tried "
                                                               "to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                                               "79.10 GiB of which 1.21 GiB is free."})
    assert code == 0, err[-3000:]
    obs = (tmp_path / "home" / "oom-observations.jsonl").read_text().splitlines()
    assert json.loads(obs[0])["gpu_type"] == "cpu"  # recorded for the memory model
    [rec] = res["recoveries"]
    assert rec["diagnosis"]["type"] == "OutOfMemoryError" and rec["action"]["kind"] == "replan"
    rl = rec["relayout"]  # MARP, calibrated by the OOM, no longer offers the layout that ran out: a smaller micro-batch
    assert rl["changed"] and rl["new"]["micro_batch"] < rl["old"]["micro_batch"]
    assert rl["new"]["grad_accumulation"] * rl["new"]["micro_batch"] == 8  # the same global batch
    assert res["plan"]["memory_calibration"] > 1
    assert res["train"]["resumed_from_step"] == 10 and res["train"]["final_step"] == 60  # the commit before it
    _no_step_lost(tmp_path, res)


@pytest.mark.slow  # a whole submit flow each (about a minute)
def test_a_hang_is_killed_and_resumed(prefect_server, tmp_path):
    t0 = time.monotonic()
    code, res, err = _submit(tmp_path, {"FRENZY_FAULT_HANG": "25"}, "--hang", "8")
    assert code == 0, err[-3000:]
    [rec] = res["recoveries"]
    assert rec["diagnosis"]["type"] == "Hang" and rec["action"]["kind"] == "resume"
    assert res["train"]["resumed_from_step"] == 20 and time.monotonic() - t0 < 300
    _no_step_lost(tmp_path, res)


@pytest.mark.slow  # a whole submit flow each (about a minute)
def test_a_rank_killed_by_a_signal_is_resumed(prefect_server, tmp_path):
    p = _submit(tmp_path, {}, steps=100000, wait=False)
    run = tmp_path / "run"
    deadline = time.monotonic() + 180
    while not any(m.step >= 20 for m in ck.committed(Storage(f"file://{tmp_path}/ckpt"))):
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-2000:] if p.poll() else "slow"
        time.sleep(0.2)
    pids = subprocess.run(["pgrep", "-f", "--", f"tasks.training.launch --job {run}"], capture_output=True,
                          text=True).stdout.split()
    assert len(pids) == 1
    os.kill(int(pids[0]), signal.SIGKILL)  # the rank dies (OOM killer, a lost node)
    deadline = time.monotonic() + 240
    while "resumed from step" not in (run / "train.log").read_text(errors="replace"):  # the second attempt runs
        assert p.poll() is None and time.monotonic() < deadline, "no resumed attempt"
        time.sleep(0.2)
    assert "trainer exited with signal 9 (SIGKILL)" in (run / "train.log").read_text()
    from tasks.training.launch import request_stop

    request_stop(run)  # the resumed run: commit and stop, so the flow completes
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out)
    [rec] = res["recoveries"]
    assert rec["diagnosis"]["type"] == "Killed" and rec["action"]["kind"] == "resume"  # SIGKILL, no error
    assert res["train"]["resumed_from_step"] >= 20
    _no_step_lost(tmp_path, res)


def test_restarts_are_bounded():
    d = diagnose(b"[rank0]: RuntimeError: CUDA error: unspecified launch failure\n")
    assert decide(d, 0, 2).kind == "resume" and decide(d, 2, 2).kind == "stop"
    assert "limit is 2" in decide(d, 2, 2).reason


@pytest.mark.parametrize(("line", "kind"), [
    (b"[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB", "replan"),
    (b"[rank0]: ModuleNotFoundError: No module named 'flash_attn'", "stop"),
    (b"something happened", "stop"),
    (b"[rank2]: RuntimeError: DataLoader worker (pid 9) is killed by signal: Killed.", "resume")])
def test_the_action_follows_the_category(line, kind):
    assert decide(diagnose(line), 0, 2).kind == kind


@pytest.mark.slow  # a submit flow up to the trainer's start
def test_a_job_error_the_trainer_names_is_the_submit_error_without_tracebacks(prefect_server, tmp_path):
    """A missing data.path: `frenzy submit` ends with the trainer's own message, first and in one paragraph (before:
    "no rule explains the failure; a person must look" after three tracebacks)."""
    job = _job(tmp_path, name="rec", steps=20, every=10)
    job["training"]["data"] = {"source": "text", "path": str(tmp_path / "no-such-corpus")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    Ledger(str(tmp_path / "l.db"))  # `submit --ledger` takes an existing ledger (a mistyped path is refused)
    cmd = [sys.executable, "-m", "cli", "submit", "job.yaml", "--ledger", str(tmp_path / "l.db"),
           "--evaluation", "off", "--device", "cpu", "--run-dir", str(tmp_path / "run")]
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value() or "", "FRENZY_HOME": str(tmp_path / "home")}
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("frenzy submit: error: rec: ") and "no-such-corpus" in last, p.stderr[-3000:]
    assert "no rule explains" not in p.stderr
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert Ledger(str(tmp_path / "l.db")).allocations() == []
