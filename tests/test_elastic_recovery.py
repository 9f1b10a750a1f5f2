"""Recovery onto what is left (issue 28), end to end through the submit flow on a real Ray cluster on loopback: a job
placed on two GPU nodes loses one mid-run (its raylet and workers die); the flow diagnoses the loss, the ledger
marks the node down (it left Ray), HAS places the job on the best MARP plan that fits what remains (fewer GPUs), and
the trainer resumes from the newest commit on the new layout. No committed step is lost, and the data stream
continues exactly: every step trains on the next global batch of sample ids, none repeated or skipped, across the
layout change."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from cluster.ledger import Ledger
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tests.ray_cluster import LOOPBACK_ENV, start_cluster

for _k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED"):  # read when ray is imported
    os.environ.setdefault(_k, LOOPBACK_ENV[_k])
ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster and a whole submit flow with a recovery (a few minutes)

STEPS, GLOBAL_BATCH = 40, 16  # seq 128 x 16: MARP's fastest runnable plan on two GPUs is then dp 2


@pytest.fixture()
def cluster(monkeypatch):
    for k, v in {**LOOPBACK_ENV, "FRENZY_SAMPLE_LOG": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    c, nodes = start_cluster(["n1", "n2"], head_resources={"frenzy_node:head": 1})
    yield c, nodes
    ray.shutdown()
    c.shutdown()
    os.environ.pop("RAY_ADDRESS", None)


def _sample_order(run_dir: Path, resumed_from: int, old_world: int, new_world: int) -> dict[int, list[int]]:
    """step -> the global batch's sample ids in data-parallel rank order: up to `resumed_from` from the first
    attempt's `old_world` ranks (their first record of the step), after it from the resumed attempt's `new_world`
    ranks (their last record: the first attempt may have run a step or two past its last commit before the loss)."""
    per: dict[int, dict[int, list[int]]] = {}
    for f in sorted(run_dir.glob("samples-rank*.jsonl")):
        rank = int(f.stem.removeprefix("samples-rank"))
        for line in f.read_text().splitlines():
            r = json.loads(line)
            s = r["step"]
            if s <= resumed_from and rank < old_world:
                per.setdefault(s, {}).setdefault(rank, r["samples"])
            elif s > resumed_from and rank < new_world:
                per.setdefault(s, {})[rank] = r["samples"]
    return {s: [i for rank in sorted(v) for i in v[rank]] for s, v in per.items()}


def test_a_lost_node_is_recovered_onto_the_gpus_that_are_left(cluster, prefect_server, tmp_path):
    from flows.submit import SubmitRequest, submit
    from tasks.jobspec import parse_job
    from tests.test_submit import _job

    c, nodes = cluster
    uri = f"file://{tmp_path}/ckpt"
    req = SubmitRequest(job=parse_job(_job(tmp_path, name="shrink", steps=STEPS, every=10, trace_every_steps=0,
                                           seq_len=128, global_batch=GLOBAL_BATCH)),
                        ledger=str(tmp_path / "l.db"), evaluation="off", device="cpu", run_dir=str(tmp_path / "run"),
                        executor="ray", rank_by="time")
    out: list = []
    th = threading.Thread(target=lambda: out.append(_run(submit, req)))
    th.start()
    ledger = Ledger(str(tmp_path / "l.db"))
    deadline = time.monotonic() + 300
    while not any(m.step >= 10 for m in ck.committed(Storage(uri))):
        assert th.is_alive() and time.monotonic() < deadline, out
        time.sleep(0.3)
    [alloc] = ledger.allocations()
    first_nodes = sorted(n.node for n in alloc.nodes)
    assert first_nodes == ["n1", "n2"], first_nodes  # rank_by time: both GPU nodes, data parallel 2
    c.remove_node(nodes.pop("n2"))  # a lost node: its raylet and the rank on it die
    committed_at_loss = max(m.step for m in ck.committed(Storage(uri)))
    th.join(timeout=600)
    assert not th.is_alive() and out and not isinstance(out[0], BaseException), out
    res = out[0]
    [rec] = res.recoveries
    rl = rec.relayout
    assert rl is not None and rl.changed and rl.old.gpus == 2 and rl.new.gpus == 1 and "n2" in rl.why
    assert "n2" not in {n.node for n in res.allocation.nodes} and res.train.world_size == 1
    assert next(n for n in ledger.nodes() if n.name == "n2").state == "down"  # gone from Ray: down, not free
    assert "without n2" in Path(res.report).read_text()  # the report says where the recovery moved the job
    assert res.train.resumed_from_step >= committed_at_loss >= 10  # no committed step lost
    assert res.train.final_step == STEPS
    order = _sample_order(tmp_path / "run", res.train.resumed_from_step, 2, 1)
    assert sorted(order) == list(range(1, STEPS + 1))
    for step, ids in order.items():  # each step: the next global batch, in order; none repeated, none skipped
        assert ids == list(range((step - 1) * GLOBAL_BATCH, step * GLOBAL_BATCH)), (step, ids)
    assert ledger.allocations() == []


def _run(fn, *args):  # noqa: ANN001, ANN202 - the flow's result or its exception, handed to the test thread
    try:
        return fn(*args)
    except BaseException as err:  # noqa: BLE001
        return err
