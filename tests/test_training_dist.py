"""Two ranks under torchrun on gloo: DDP and FSDP2 train the same model as one process, checkpoint, resume."""

from __future__ import annotations

import pandas as pd
import torch

from tasks.training import checkpoint as ck
from tasks.training.launch import launch
from tasks.training.storage import Storage
from tests.trainer_util import tiny_job


def _model(uri: str, step: int) -> dict[str, torch.Tensor]:
    st = Storage(uri)
    return ck.read_full(st, ck.read_manifest(st, step))


def test_ddp_and_fsdp2_match_one_process_and_resume(tmp_path):
    steps = 20
    one = f"file://{tmp_path}/one"
    launch(tiny_job(one, steps, trace_every_steps=5), tmp_path / "r1", nproc=1, device="cpu", threads=1)
    ddp = f"file://{tmp_path}/ddp"
    res = launch(tiny_job(ddp, steps, trace_every_steps=5), tmp_path / "r2", nproc=2, device="cpu", threads=1)
    assert res["world_size"] == 2 and res["final_step"] == steps
    m = ck.read_manifest(Storage(ddp), steps)
    assert [s.rank for s in m.shards] == [0, 1]
    # DDP: rank 0 holds the one replica of model and optimizer; rank 1 only its RNG state
    assert {e.name for e in m.shards[1].tensors} == {"rng.cpu"}
    ref = _model(one, steps)
    for k, v in _model(ddp, steps).items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5)
    trace = pd.read_parquet(res["trace"])
    assert set(trace["rank"]) == {0, 1} and set(trace["step"]) == {1, 6, 11, 16}
    assert {"forward-compute", "backward-compute", "separate-grads-all-reduce", "optimizer"} <= set(trace["optype"])
    # forward rows carry their micro-batch id in order; every op has a duration
    fwd = trace[(trace.optype == "forward-compute") & (trace.step == 6) & (trace["rank"] == 0)]
    assert list(fwd["mb_id"]) == list(range(len(fwd))) and (trace["duration"] > 0).all()

    # FSDP2 (zero_stage 3): each rank writes its own row shards; stop at 10, resume to 20
    fsdp = f"file://{tmp_path}/fsdp"
    job = tiny_job(fsdp, steps, zero_stage=3)
    launch(job, tmp_path / "r3", nproc=2, device="cpu", threads=1, stop_after_steps=10)
    res = launch(job, tmp_path / "r3", nproc=2, device="cpu", threads=1, resume=True)
    assert res["resumed_from_step"] == 10 and res["final_step"] == steps
    m = ck.read_manifest(Storage(fsdp), steps)
    sharded = [e for e in m.shards[1].tensors if e.global_shape is not None]
    assert sharded and all(e.global_offset[0] > 0 for e in sharded if e.name == "model.wte.weight")
    for k, v in _model(fsdp, steps).items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5)
