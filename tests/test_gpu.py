"""The GPU paths: NVML discovery, CUDA training with asynchronous checkpoints, NCCL data parallelism.

Marked `gpu` (deselected by the default command); `.ci/run` runs them with `-m gpu` where `nvidia-smi` finds a GPU,
and on a machine without one they skip and say so."""

from __future__ import annotations

import statistics

import pytest
import torch

from cluster.catalog import default_catalog
from cluster.inventory import discover_local
from tasks.training import checkpoint as ck
from tasks.training.launch import launch
from tasks.training.storage import Storage
from tests.trainer_util import final_state, tiny_job

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")]


def test_nvml_discovery_lists_every_gpu_torch_sees():
    c = discover_local()
    assert sum(n.count for n in c.nodes) == torch.cuda.device_count()
    cat = default_catalog()
    seen = {torch.cuda.get_device_properties(i).total_memory / 1024**3 for i in range(torch.cuda.device_count())}
    for n in c.nodes:
        assert n.gpu != "cpu"
        mem = cat.get(n.gpu).memory_gib
        # NVML's total and torch's agree; a catalog entry may round the marketing size (80 GB vs 79.2 GiB)
        assert any(abs(mem - s) <= 0.1 * s for s in seen), (n.gpu, mem, seen)


def test_cuda_training_checkpoints_asynchronously_and_resumes_bitwise(tmp_path):
    full = f"file://{tmp_path}/full"
    ref = launch(tiny_job(full, 30, every=5), tmp_path / "a", device="cuda", threads=1)
    assert ref.device.startswith("cuda") and ref.final_step == 30
    recs = ref.checkpoints
    assert len(recs) == 6 and all(r.persist_s > 0 for r in recs)
    # the step waits for the snapshot into pinned CPU memory, not for the write to disk
    assert statistics.median(r.blocked_s for r in recs) < statistics.median(r.persist_s for r in recs)
    part = f"file://{tmp_path}/part"
    job = tiny_job(part, 30, every=5)
    launch(job, tmp_path / "b", device="cuda", threads=1, stop_after_steps=12)
    res = launch(job, tmp_path / "b", device="cuda", threads=1, resume=True)
    assert res.resumed_from_step == 12  # the stop commits the step it is at
    a, b = final_state(part, 30), final_state(full, 30)
    assert a.keys() == b.keys()
    for k in a:  # cuBLAS may pick other kernels in a new process: equal to float tolerance, not bitwise
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


def test_a_cpu_checkpoint_resumes_on_cuda_and_back(tmp_path):
    """Layout-independent checkpoints across devices (issue 28): written on the CPU, resumed on CUDA, ending with the
    state of an uninterrupted CPU run to float tolerance; then resumed on the CPU again from the CUDA commit."""
    full, part = f"file://{tmp_path}/full", f"file://{tmp_path}/part"
    launch(tiny_job(full, 20, every=5), tmp_path / "ref", device="cpu", threads=1)
    job = tiny_job(part, 20, every=5)
    first = launch(job, tmp_path / "a", device="cpu", threads=1, stop_after_steps=10)
    assert first.final_step == 10
    res = launch(job, tmp_path / "b", device="cuda", threads=1, resume=True, stop_after_steps=5)  # 5 more
    assert res.device.startswith("cuda") and res.resumed_from_step == 10 and res.final_step == 15
    back = launch(job, tmp_path / "c", device="cpu", threads=1, resume=True)
    assert back.resumed_from_step == 15 and back.final_step == 20
    a, b = final_state(part, 20), final_state(full, 20)
    assert a.keys() == b.keys()
    for k in a:  # CUDA kernels round differently from the CPU's: float tolerance over 5 steps
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL data parallelism needs two GPUs")
def test_nccl_ddp_trains_the_same_model_as_one_gpu(tmp_path):
    one = f"file://{tmp_path}/one"
    launch(tiny_job(one, 10), tmp_path / "r1", device="cuda", threads=1)
    ddp = f"file://{tmp_path}/ddp"
    res = launch(tiny_job(ddp, 10), tmp_path / "r2", nproc=2, device="cuda", threads=1)
    assert res.world_size == 2
    a, b = (ck.read_full(Storage(u), ck.read_manifest(Storage(u), 10)) for u in (one, ddp))
    for k, v in b.items():
        torch.testing.assert_close(v, a[k], rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="an NCCL pair needs two GPUs")
def test_the_node_check_runs_nccl_pairs():
    from cluster.nodecheck import check_nodes, local_probe

    r = check_nodes(["g0", "g1", "g2", "g3"], probe=local_probe(probe_mb=64, timeout_s=60, backend="nccl"))
    assert r.faulty == [] and r.unverified == [] and all(g.ok for g in r.rounds[0])
