"""Ray under hard faults (issue 31), on a real loopback Ray cluster: a head and two workers, one fake A100 each, one
CPU each. A worker's raylet and every process under it are SIGKILLed (the machine is gone) or SIGSTOPped (it hangs:
it neither answers nor dies) while `frenzy submit --executor ray --json` trains; the job must be detected as failed,
diagnosed as a node fault, the node taken out of the ledger, the job resumed on the GPUs left from its last commit,
the JSON clean and the evaluations present. Then the operator's view: `cluster init` and `cluster check` with a dead
node. One cluster for the module; a faulted worker is replaced by a fresh node of the same name."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.ledger import Ledger
from cluster.ray_nodes import alive_nodes
from tests.ray_cluster import LOOPBACK_ENV, fault, node_pids, replace_node, start_cluster

for _k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED"):  # read when ray is imported
    os.environ.setdefault(_k, LOOPBACK_ENV[_k])
ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster, a whole submit with a recovery per test (1-3 minutes each)

GPU = {"frenzy_node:head": 1, "frenzy_gpu:A100-40GB": 1}


@pytest.fixture(scope="module")
def cluster():
    old = {k: os.environ.get(k) for k in (*LOOPBACK_ENV, "RAY_ADDRESS")}
    os.environ.update(LOOPBACK_ENV)
    c, nodes = start_cluster(["w1", "w2"], cpus=1, head_resources=GPU, head_gpus=1)
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        for node in list(nodes.values()):  # a SIGSTOPped node's processes die with SIGKILL, stopped or not
            for pid in node_pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        c.shutdown()
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _check_recovered(run, tmp: Path) -> None:
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    assert run.victim, f"no fault injected: {run.stderr[-3000:]}"
    assert run.rc == 0, run.stderr[-4000:]
    doc = run.doc  # parsed from the whole of stdout: nothing but the document is there
    [rec] = doc["recoveries"]
    assert rec["diagnosis"]["category"] == "infrastructure" and rec["action"]["kind"] == "resume"
    assert rec["diagnosis"]["node"] == run.victim or run.victim in (rec["diagnosis"]["root_cause_line"] or "")
    assert run.victim not in {n["node"] for n in doc["allocation"]["nodes"]}  # resumed on the GPUs left
    assert run.victim_state[0] in ("down", "cordoned"), run.victim_state  # out of the ledger, with the reason
    committed = [m.step for m in ck.committed(Storage(f"file://{tmp}/ckpt"))]
    assert doc["train"]["resumed_from_step"] >= run.committed_at_fault  # no committed step lost
    assert doc["train"]["final_step"] == max(committed) == 40
    assert doc["evaluations"] and all(Path(e["result"]).is_file() for e in doc["evaluations"])
    assert all(Path(e["result"]).is_relative_to(tmp / "evals") for e in doc["evaluations"])  # the submitter's dir
    assert Ledger(str(tmp / "l.db")).allocations() == []  # nothing left allocated, nothing double-allocated
    assert run.detect_s is not None and run.resume_s is not None


def test_a_sigkilled_worker_is_marked_down_and_the_job_resumes_on_the_rest(cluster, prefect_server, tmp_path):
    from tests.ray_faults_kit import submit_with_fault

    c, nodes = cluster
    run = submit_with_fault(tmp_path, nodes, signal.SIGKILL)
    try:
        _check_recovered(run, tmp_path)
        assert run.victim_state[0] == "down" and "lost during training" in run.victim_state[1]
        print(f"SIGKILL {run.victim}: detected in {run.detect_s:.1f} s, training again {run.resume_s:.1f} s after")
    finally:
        if run.victim:
            replace_node(c, nodes, run.victim, run.pids)


def test_a_sigstopped_worker_is_taken_out_and_the_job_resumes_on_the_rest(cluster, prefect_server, tmp_path):
    from tests.ray_faults_kit import submit_with_fault

    c, nodes = cluster
    run = submit_with_fault(tmp_path, nodes, signal.SIGSTOP)
    try:
        _check_recovered(run, tmp_path)
        print(f"SIGSTOP {run.victim}: detected in {run.detect_s:.1f} s, training again {run.resume_s:.1f} s after; "
              f"ledger: {run.victim_state}")
    finally:
        if run.victim:
            replace_node(c, nodes, run.victim, run.pids)


def _frenzy(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=tmp, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


def test_init_and_check_see_a_dead_node_as_dead(cluster, tmp_path):
    c, nodes = cluster
    led, led2 = str(tmp_path / "l.db"), str(tmp_path / "l2.db")
    for path in (led, led2):
        r = _frenzy("cluster", "init", "--cluster", "ray", "--ledger", path, "--json", tmp=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert {n["name"]: n["state"] for n in json.loads(r.stdout)["nodes"]} == {"head": "up", "w1": "up", "w2": "up"}
    pids = fault(nodes["w1"], signal.SIGKILL)
    try:
        r = _frenzy("cluster", "check", "--executor", "ray", "--cordon", "--nodes", "head,w1,w2", "--ledger", led,
                    "--timeout", "20", "--json", tmp=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)  # clean: Ray's dead-raylet banners went to stderr
        assert doc["faulty"] == ["w1"] and doc["cordoned"] == ["w1"] and doc["verdicts"]["w1"]["verdict"] == "dead"
        assert doc["verdicts"]["head"]["verdict"] == "alive" and "w2" not in doc["faulty"] + doc["unverified"]
        state = {n.name: n.state for n in Ledger(led).nodes()}
        assert state == {"head": "up", "w1": "cordoned", "w2": "up"}
        # `cluster init` again once Ray has declared it dead: the ledger that still had it up marks it down
        deadline = time.monotonic() + 90
        while "w1" in alive_nodes() and time.monotonic() < deadline:  # Ray's health check, about 15 s
            time.sleep(0.5)
        r = _frenzy("cluster", "init", "--cluster", "ray", "--ledger", led2, "--json", tmp=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        got = {n["name"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
        assert got == {"head": "up", "w1": "down", "w2": "up"}, got
        assert "not alive in Ray" in next(n["reason"] for n in json.loads(r.stdout)["nodes"] if n["name"] == "w1")
    finally:
        replace_node(c, nodes, "w1", pids)
