"""Two ranks under torchrun on gloo: DDP and FSDP2 train the same model as one process, checkpoint, resume."""

from __future__ import annotations

import math

import pandas as pd
import torch

from tasks.training import checkpoint as ck
from tasks.training.launch import launch
from tasks.training.storage import Storage
from tests.trainer_util import assert_bitwise_equal, final_state, tiny_job


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


def test_tensor_parallel_matches_one_process_and_resumes(tmp_path):
    steps = 12
    spec = {"model": {"preset": "gpt-tiny", "mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False,
                      "kv_heads": 2}}
    one = f"file://{tmp_path}/one"
    job1 = tiny_job(one, steps)
    job1.model = job1.model.model_validate(spec["model"])
    launch(job1, tmp_path / "r1", nproc=1, device="cpu", threads=1)
    tp = f"file://{tmp_path}/tp"
    job2 = job1.model_copy(deep=True)
    job2.training.checkpoint.uri = tp
    launch(job2, tmp_path / "r2", nproc=2, tp=2, device="cpu", threads=1, stop_after_steps=7)
    res = launch(job2, tmp_path / "r2", nproc=2, tp=2, device="cpu", threads=1, resume=True)
    assert res["tp"] == 2 and res["resumed_from_step"] == 7 and res["final_step"] == steps
    m = ck.read_manifest(Storage(tp), steps)
    assert m.layout == {"dp": 1, "tp": 2, "zero_stage": 0}
    # each rank holds half of the heads of q/k/v and half of the MLP columns; norms and embeddings are whole
    by_name = {e.name: e for e in m.shards[1].tensors}
    assert by_name["model.blocks.0.q.weight"].global_offset == [32, 0]
    assert by_name["model.blocks.0.proj.weight"].global_offset == [0, 32]
    assert by_name["model.wte.weight"].global_shape is None
    ref = _model(one, steps)
    got = _model(tp, steps)
    assert got.keys() == ref.keys()
    for k, v in got.items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5)


def test_mixed_precision_trains_and_resumes_exactly(tmp_path):
    # fp16-mixed carries a gradient scaler whose state must survive the checkpoint; bf16 keeps bf16 moments
    for precision in ("fp16-mixed", "bf16"):
        full = f"file://{tmp_path}/{precision}-full"
        ref = launch(tiny_job(full, 12, precision=precision), tmp_path / f"{precision}-a", device="cpu", threads=1)
        assert math.isfinite(ref["last_loss"])
        part = f"file://{tmp_path}/{precision}-part"
        job = tiny_job(part, 12, precision=precision)
        launch(job, tmp_path / f"{precision}-b", device="cpu", threads=1, stop_after_steps=5)
        res = launch(job, tmp_path / f"{precision}-b", device="cpu", threads=1, resume=True)
        assert res["resumed_from_step"] == 5
        m = ck.read_manifest(Storage(part), 12)
        if precision == "fp16-mixed":
            assert m.trainer["scaler"]["scale"] > 0
        else:
            assert {e.dtype for e in m.shards[0].tensors if e.name.startswith("model.")} == {"bfloat16"}
        assert_bitwise_equal(final_state(part, 12), final_state(full, 12))
