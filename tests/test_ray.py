"""Frenzy on a real multi-node Ray cluster on this machine (several raylets on loopback, fake GPU resources):
inventory and ledger, a job placed across two nodes that trains, checkpoints, loses a node and resumes, a cordoned
node that receives nothing, and the two-round node check run on the Ray nodes."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from cluster.has import GpuRequest
from cluster.ledger import Ledger
from tasks.diagnosis.diagnose import diagnose
from tasks.diagnosis.recovery import decide
from tasks.training import checkpoint as ck
from tasks.training.launch import TrainFailed
from tasks.training.storage import Storage
from tests.ray_cluster import LOOPBACK_ENV, node_args, start_cluster
from tests.trainer_util import tiny_job

for _k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED"):  # read when ray is imported
    os.environ.setdefault(_k, LOOPBACK_ENV[_k])
ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster of three raylets (about 10 s to start)


@pytest.fixture(scope="module")
def cluster():
    old = {k: os.environ.get(k) for k in (*LOOPBACK_ENV, "RAY_ADDRESS")}
    os.environ.update(LOOPBACK_ENV)
    c, nodes = start_cluster(["n1", "n2", "n3"], head_resources={"frenzy_node:head": 1})
    yield c, nodes
    ray.shutdown()
    c.shutdown()
    for k, v in old.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def test_inventory_comes_from_the_ray_nodes_and_the_ledger_syncs_it(cluster, tmp_path):
    from cluster.inventory import load_cluster

    inv = load_cluster("ray")
    by = {n.name: n for n in inv.nodes}
    assert {"n1", "n2", "n3", "head"} <= set(by)
    assert by["n1"].gpu == "A100-40GB" and by["n1"].count == 1 and by["head"].gpu == "cpu"
    ledger = Ledger(str(tmp_path / "l.db"))
    ledger.sync(inv)
    ledger.cordon("n2", "failed its node check")
    a = ledger.allocate("j1", [GpuRequest(gpus=1, min_mem_gib=30)])
    b = ledger.allocate("j2", [GpuRequest(gpus=1, min_mem_gib=30)])
    c = ledger.allocate("j3", [GpuRequest(gpus=1, min_mem_gib=30)])
    placed = {n.node for x in (a, b) for n in x.nodes}
    assert placed == {"n1", "n3"} and c is None  # the cordoned node receives nothing


def _two_alive(cluster) -> list[tuple[str, int]]:
    return [(n, 1) for n in sorted(cluster[1])[:2]]


def _committed(uri: str) -> list[int]:
    return [m.step for m in ck.committed(Storage(uri))]


def test_a_job_across_two_nodes_trains_loses_a_node_and_resumes(cluster, tmp_path):
    from cluster.inventory import load_cluster
    from cluster.ray_exec import launch_ray

    c, nodes = cluster
    ledger = Ledger(str(tmp_path / "l.db"))
    ledger.sync(load_cluster("ray"))
    alloc = ledger.allocate("x", [GpuRequest(gpus=2, min_mem_gib=30)])  # 1 GPU per node: HAS spans two nodes
    placement = [(n.node, len(n.gpu_indices)) for n in alloc.nodes]
    assert len(placement) == 2
    uri = f"file://{tmp_path}/ckpt"
    job = tiny_job(uri, steps=300, every=10)
    run_dir = tmp_path / "run"
    failure: list[BaseException] = []

    def train() -> None:
        try:
            launch_ray(job, placement, run_dir, device="cpu", threads=1, gpus=True)
        except BaseException as err:  # noqa: BLE001 - inspected below
            failure.append(err)

    th = threading.Thread(target=train)
    th.start()
    deadline = time.monotonic() + 240
    while not any(s >= 20 for s in _committed(uri)) and time.monotonic() < deadline and th.is_alive():
        time.sleep(0.5)
    assert any(s >= 20 for s in _committed(uri)), (run_dir / "train.log").read_text()[-3000:]
    lost = placement[1][0]
    t_kill = time.monotonic()
    c.remove_node(nodes.pop(lost))  # the node dies with its raylet and workers
    th.join(timeout=180)
    assert not th.is_alive() and failure and isinstance(failure[0], TrainFailed)
    detect_s = time.monotonic() - t_kill
    assert f"node {lost} lost" in str(failure[0])
    d = diagnose(run_dir / "train.log")
    assert d.category == "infrastructure" and d.restartable and decide(d, 0, 2).kind == "resume"
    # the recovery's node check cordons the node that left, HAS places the job again on healthy nodes, it resumes
    import logging

    from tasks.pipeline.attempt import check_allocation_nodes

    check_allocation_nodes(ledger, alloc, logging.getLogger("test"), "ray")
    assert next(n for n in ledger.nodes() if n.name == lost).state == "down"  # Ray saw it go
    ledger.release(alloc.id)
    again = ledger.allocate("x", [GpuRequest(gpus=2, min_mem_gib=30)])
    placement2 = [(n.node, len(n.gpu_indices)) for n in again.nodes]
    assert lost not in dict(placement2) and len(placement2) == 2
    before = max(_committed(uri))
    job.training.steps = before + 20
    res = launch_ray(job, placement2, run_dir, resume=True, device="cpu", threads=1, gpus=True)
    assert res.resumed_from_step == before and res.final_step == before + 20 and res.world_size == 2
    assert max(_committed(uri)) == before + 20
    print(f"node loss detected in {detect_s:.1f} s; trained on {placement}, resumed on {placement2}")


def test_a_stop_request_commits_and_returns(cluster, tmp_path):
    from cluster.ray_exec import launch_ray
    from tasks.training.launch import request_stop
    from tasks.training.request import TrainerResult

    uri = f"file://{tmp_path}/ckpt"
    run_dir = tmp_path / "run"
    out: list[TrainerResult] = []
    th = threading.Thread(target=lambda: out.append(launch_ray(tiny_job(uri, steps=10_000, every=1000),
                                                               _two_alive(cluster), run_dir, device="cpu")))
    th.start()
    deadline = time.monotonic() + 180
    while not (run_dir / "progress.jsonl").exists() or '"step"' not in (run_dir / "progress.jsonl").read_text():
        assert time.monotonic() < deadline and th.is_alive(), (run_dir / "train.log").read_text()[-3000:]
        time.sleep(0.5)
    request_stop(run_dir)
    th.join(timeout=120)
    assert out and out[0].stopped_early and out[0].final_step == max(_committed(uri))


def test_rank_0_on_ray_holds_the_allocation_and_stops_when_it_is_released(cluster, tmp_path):
    """Red team 41i: the Ray executor did not hand its trainer the allocation, so a trainer on Ray nodes trained on
    after its GPUs were given away. Rank 0 renews it as the local trainer does: released under it, the job commits
    its step and stops, naming the cause (without the hand-over it trains on to step 10,000)."""
    from cluster.inventory import load_cluster
    from cluster.ray_exec import launch_ray
    from tasks.training.request import AllocationHold

    led = Ledger(f"sqlite:///{tmp_path}/l.db")
    led.sync(load_cluster("phoebe"))
    alloc = led.allocate("rayheld", [GpuRequest(1, 1)], lease_s=60)
    assert alloc is not None
    uri, run_dir = f"file://{tmp_path}/ckpt", tmp_path / "run"
    hold = AllocationHold(ledger=led.url, allocation_id=alloc.id, lease_s=3)
    failed: list[BaseException] = []

    def train() -> None:
        try:
            launch_ray(tiny_job(uri, steps=10_000, every=20), _two_alive(cluster), run_dir, device="cpu",
                       allocation=hold)
        except BaseException as err:  # noqa: BLE001 - what the thread ended with is the test's subject
            failed.append(err)

    th = threading.Thread(target=train)
    th.start()
    deadline = time.monotonic() + 180
    while not _committed(uri):
        assert time.monotonic() < deadline and th.is_alive(), (run_dir / "train.log").read_text()[-3000:]
        time.sleep(0.5)
    led.release(alloc.id)
    th.join(timeout=180)
    assert not th.is_alive() and failed and isinstance(failed[0], TrainFailed), failed
    said = str(failed[0])
    assert f"allocation {alloc.id} in the ledger {led.url} was released by hand while its trainer ran" in said, said
    newest = max(_committed(uri))
    assert f"Training stopped at step {newest} after committing it" in said and newest < 10_000, said


def test_the_node_check_runs_on_the_ray_nodes_and_finds_the_faulty_one(cluster, monkeypatch):
    from cluster.nodecheck import check_nodes
    from cluster.ray_exec import ray_probe

    c, nodes = cluster
    nodes["n4"] = c.add_node(**node_args("n4"))
    c.wait_for_nodes()
    a, b = (n for n, _ in _two_alive(cluster))
    monkeypatch.setenv("FRENZY_NODECHECK_FAIL", b)  # b's probe process dies before the collective
    res = check_nodes([a, b, "head", "n4"], probe=ray_probe(probe_mb=1, timeout_s=20))
    assert res.faulty == [b] and res.slow == [] and res.unverified == [] and len(res.rounds) == 2
    assert [g.ok for g in res.rounds[0]] == [False, True]  # round 1: (a, b) fails, (head, n4) passes
    assert all(g.ok == (b not in g.nodes) for g in res.rounds[1])  # round 2 clears a, convicts b


def test_an_allocation_on_a_missing_node_is_refused_by_name(cluster, tmp_path):
    from cluster.ray_exec import launch_ray

    with pytest.raises(TrainFailed, match=r"node nope lost: not alive in Ray") as err:  # the missing node only
        launch_ray(tiny_job(f"file://{tmp_path}/c", steps=5), [("n1", 1), ("nope", 1)], Path(tmp_path / "r"),
                   device="cpu", place_timeout_s=30)
    assert "n1" not in str(err.value).split("; log:")[0]
    d = diagnose(tmp_path / "r" / "train.log")  # a node fault for the recovery, never "no rule explains"
    assert d.category == "infrastructure" and d.restartable


def test_the_shared_path_check_passes_a_shared_directory_and_names_each_node_that_sees_another(cluster, tmp_path,
                                                                                               monkeypatch):
    from cluster.ray_exec import RayExecutorError, check_shared_paths

    a, b = (n for n, _ in _two_alive(cluster))  # an earlier test of this module removes a node: two alive ones
    check_shared_paths([a, b], [tmp_path / "runs"])  # one file system on loopback: shared
    assert [p.name for p in (tmp_path / "runs").iterdir()] == []  # the marks are removed again
    # /proc/self/cwd is each process's own working directory: the submitting side's (tmp_path) is not the one the
    # raylets' workers run in, as a node-local directory of the same name on another machine would not be
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RayExecutorError) as err:
        check_shared_paths([a, b], ["/proc/self/cwd/local-runs"])
    msg = str(err.value)
    assert f"{a} cannot use /proc/self/cwd/local-runs" in msg and f"{b} cannot use" in msg and "NFS" in msg


def test_submit_with_the_ray_executor_places_trains_and_gives_the_gpus_back(cluster, prefect_server, tmp_path):
    from flows.submit import SubmitRequest, submit
    from tasks.jobspec import parse_job
    from tests.test_submit import _job

    suite = tmp_path / "small.yaml"
    suite.write_text("name: small\ndatasets:\n  - {name: heldout-loss, examples: 8, mode: ppl, infer_s_per_example: 0.004}\n")
    req = SubmitRequest(job=parse_job(_job(tmp_path, name="onray", steps=20, every=20, trace_every_steps=0)),
                        ledger=str(tmp_path / "l.db"), evaluation="in-flow", suite=str(suite), device="cpu",
                        run_dir=str(tmp_path / "run"), history_dir=str(tmp_path / "evals"), executor="ray",
                        rank_by="time")
    res = submit(req)
    [ev] = res.evaluations  # the checkpoint, evaluated on a Ray node inside the pipeline
    trials = json.loads(Path(ev.result).read_text())["trials"]
    assert ev.step == 20 and all(t["host"] in {*cluster[1], "head"} for t in trials)
    ray_nodes = {*cluster[1], "head"}
    assert {n.node for n in res.allocation.nodes} <= ray_nodes and res.released
    assert res.train.final_step == 20 and res.train.world_size == res.allocation.gpus
    assert Ledger(str(tmp_path / "l.db")).allocations() == []
    print(f"placed on {[(n.node, n.gpu_indices) for n in res.allocation.nodes]}")


def test_evaluation_spreads_over_ray_nodes_with_a_precursor_on_each(cluster, tmp_path):
    from tasks.evaluation.runner import EvalOptions, evaluate
    from tasks.evaluation.suite import ModelLoad, load_suite
    from tests.trainer_util import run

    uri = f"file://{tmp_path}/ckpt"
    run(tiny_job(uri, steps=10, every=10), tmp_path / "train")
    a, b = (n for n, _ in _two_alive(cluster))
    opts = EvalOptions(executor="ray", ray_nodes=[a, b], nodes=2, gpus_per_node=1, out_dir=str(tmp_path / "e"),
                       learn_priors=False, use_priors=False)
    # a remote load 16x a shared-memory one: the copies pay for themselves (with quick's own load times, its four
    # datasets on two nodes run `direct`, each trial from storage, and no node would copy the model)
    quick = load_suite("quick").model_copy(update={"model_load_s": ModelLoad(remote=8.0, shm=0.5)})
    res = evaluate(uri, quick, opts)
    local = evaluate(uri, quick, opts.model_copy(update={"executor": "local", "ray_nodes": None,
                                                                      "out_dir": str(tmp_path / "l")}))
    assert {t.host for t in res.trials} == {a, b}  # trials ran on both Ray nodes
    assert len(res.precursor_s) == 2 and all(s > 0 for s in res.precursor_s)
    assert res.scores == local.scores  # the same predictions and metrics as the local executor
    assert (tmp_path / "e" / "trials" / "precursor-n0.stderr").exists()
    print(f"makespan on Ray {res.makespan_s:.1f}s (predicted {res.predicted_makespan_s:.1f}s), "
          f"local {local.makespan_s:.1f}s")
