"""tasks/training/elastic.py: the recovery's relayout record and the pool MTBF `auto` is tuned for, from a real
(SQLite) ledger's allocations, cordons and expired leases."""

from __future__ import annotations

import math
from types import SimpleNamespace

from cluster.has import GpuRequest
from cluster.inventory import Cluster, Node
from cluster.ledger import Ledger
from tasks.planning.layout import Layout
from tasks.training import elastic as E
from tasks.training.interval import PRIOR_GPU_MTBF_S

CLUSTER = Cluster(name="t", nodes=[Node(name="n0", gpu="A100-40GB-PCIE", count=4),
                                   Node(name="n1", gpu="A100-40GB-PCIE", count=4),
                                   Node(name="n2", gpu="A100-80GB-PCIE", count=2)])


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_pool_mtbf_counts_failures_and_gpu_hours_of_that_gpu_type(tmp_path):
    clock = Clock()
    led = Ledger(f"sqlite:///{tmp_path}/l.db", clock=clock)
    led.sync(CLUSTER)
    a = led.allocate("a", [GpuRequest(8, 40, types=frozenset({"A100-40GB-PCIE"}))], lease_s=10**6)
    b = led.allocate("b", [GpuRequest(2, 80)], lease_s=50)
    clock.t += 3600  # a: 8 GPUs for an hour; b's lease runs out after 50 s (its holder died)
    led.release(a.id)
    led.cordon("n1", "node check failed")
    mtbf, source = E.pool_mtbf(led.events(limit=1000), led.nodes(), "A100-40GB-PCIE", gpus=4, now=clock.t)
    assert math.isclose(mtbf, (PRIOR_GPU_MTBF_S + 8 * 3600) / (1 + 1) / 4)  # one cordon in 8 GPU-hours
    assert "1 failure(s) in 8.0 GPU-hours" in source
    mtbf80, _ = E.pool_mtbf(led.events(limit=1000), led.nodes(), "A100-80GB-PCIE", gpus=2, now=clock.t)
    # the expired lease is that pool's failure; its exposure ends when the ledger reclaimed it (the next
    # transaction, an hour later here)
    assert math.isclose(mtbf80, (PRIOR_GPU_MTBF_S + 2 * 3600) / 2 / 2)
    assert b.gpus == 2


def _plan(gpus: int, gpu_type: str, dp: int, tp: int, mb: int) -> SimpleNamespace:
    return SimpleNamespace(gpu_type=gpu_type, layout=Layout(dp=dp, tp=tp, micro_batch=mb))


def _alloc(gpus: int, nodes: list[str]) -> SimpleNamespace:
    return SimpleNamespace(gpus=gpus, nodes=[SimpleNamespace(node=n) for n in nodes])


def test_a_move_to_fewer_gpus_keeps_the_global_batch_and_says_why():
    old = E.placed(_plan(8, "A100-40GB-PCIE", 8, 1, 4), _alloc(8, ["n0", "n1"]), global_batch=64)
    new = E.placed(_plan(2, "A100-80GB-PCIE", 2, 1, 4), _alloc(2, ["n2"]), global_batch=64)
    assert old.grad_accumulation == 2 and new.grad_accumulation == 8  # 8 x 4 x 2 = 2 x 4 x 8 = 64
    rl = E.relayout(old, new, "NodeFailure on n0, n1", "resume")
    assert rl.changed and rl.old.dp == 8 and rl.new.gpu_type == "A100-80GB-PCIE"
    assert "8 x A100-40GB-PCIE (dp 8 x tp 1) -> 2 x A100-80GB-PCIE (dp 2 x tp 1)" in rl.why
    assert "without n0, n1" in rl.why and "8 micro-batch(es) of 4" in rl.why
    same = E.relayout(old, old, "CUDAError on n0", "resume")
    assert not same.changed and "the same layout" in same.why


def test_the_sample_audit_reads_back_in_data_parallel_order_with_the_resumed_run_winning(tmp_path, monkeypatch):
    from tasks.training import data as D

    monkeypatch.setenv("FRENZY_SAMPLE_LOG", "1")
    for rank, ids in [(0, [0, 1]), (1, [0, 1]), (2, [2, 3]), (3, [2, 3])]:  # dp 2 x tp 2: ranks 0-1 are dp rank 0
        D.record_samples(tmp_path, rank, 1, ids)
    D.record_samples(tmp_path, 0, 2, [4, 5])
    D.record_samples(tmp_path, 2, 2, [6, 7])
    D.record_samples(tmp_path, 0, 2, [40, 50])  # a resumed run on the same layout trains step 2 again
    assert D.sample_order(tmp_path, tp=2) == {1: [0, 1, 2, 3], 2: [40, 50, 6, 7]}


def test_an_oom_replans_with_marp_calibrated_and_never_offers_the_layout_that_ran_out():
    from tasks.jobspec import parse_job
    from tasks.planning.calibration import OomObservation, model_key
    from tasks.planning.plans import plan_resources

    job = parse_job({"name": "big", "model": {"preset": "gpt2-1.5b"},
                     "training": {"seq_len": 2048, "global_batch": 64, "precision": "bf16-mixed", "steps": 100}})
    cluster = Cluster(name="t", nodes=[Node(name="a", gpu="A100-40GB-PCIE", count=4),
                                       Node(name="b", gpu="A100-80GB-PCIE", count=4)])
    before = [p for p in plan_resources(job, cluster) if p.layout.pp == 1]
    ran_out = before[0]
    obs = OomObservation(model_key=model_key(job), model="gpt2-1.5b", seq_len=2048, gpu_type=ran_out.gpu_type,
                         gpu_memory_gib=40.0 if "40GB" in ran_out.gpu_type else 80.0, layout=ran_out.layout.label(),
                         predicted_device_gib=ran_out.predicted_device_gib)
    after = E.replan_after_oom(job, cluster, "gpu_seconds", [obs])
    assert after and all(p.layout.pp == 1 for p in after)
    assert (ran_out.gpu_type, ran_out.layout.label()) not in {(p.gpu_type, p.layout.label()) for p in after}
    scale = after[0].memory_calibration
    # the calibration explains the OOM (up to the plan's rounding of the factor to 4 decimals: 80 / 56.14 -> 1.425)
    assert scale > 1 and ran_out.predicted_device_gib * scale >= obs.gpu_memory_gib * (1 - 1e-4)
    assert all(p.memory_calibration == scale for p in after)  # every prediction is scaled, not only the failed one
    # when the calibrated peaks fit nowhere, the flow stops and names the fixes
    tiny = Cluster(name="s", nodes=[Node(name="a", gpu=ran_out.gpu_type, count=ran_out.gpus)])
    hopeless = obs.model_copy(update={"predicted_device_gib": ran_out.predicted_device_gib / 50})
    assert E.replan_after_oom(job, tiny, "gpu_seconds", [hopeless]) == []


def test_a_smaller_micro_batch_on_the_same_gpus_is_a_relayout_too():
    old = E.placed(_plan(1, "A100-40GB-PCIE", 1, 1, 8), _alloc(1, ["n0"]), global_batch=16)
    new = E.placed(_plan(1, "A100-40GB-PCIE", 1, 1, 4), _alloc(1, ["n0"]), global_batch=16)
    rl = E.relayout(old, new, "OutOfMemoryError on n0", "replan")
    assert rl.changed and "micro-batches of 4 instead of 8 (4 per rank per step" in rl.why and "MARP" in rl.why
