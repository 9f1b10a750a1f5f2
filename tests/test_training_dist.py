"""Two ranks under torchrun on gloo: DDP, FSDP2 and tensor parallelism train the same model as one process,
checkpoint, resume. Each run is a module-scoped fixture, so every test below checks one thing and its failure
names it, while the (expensive) runs happen once."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from tasks.training import checkpoint as ck
from tasks.training.launch import launch
from tasks.training.request import TrainerResult
from tasks.training.storage import Storage
from tests.trainer_util import assert_bitwise_equal, final_state, tiny_job

STEPS = 20
TP_STEPS = 12
TP_MODEL = {"preset": "gpt-tiny", "mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False,
            "kv_heads": 2}


def _model(uri: str, step: int) -> dict[str, torch.Tensor]:
    st = Storage(uri)
    return ck.read_full(st, ck.read_manifest(st, step))


def _assert_same_model(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert got.keys() == ref.keys()
    for k, v in got.items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dist")


@pytest.fixture(scope="module")
def one_process(root) -> str:
    uri = f"file://{root}/one"
    launch(tiny_job(uri, STEPS, trace_every_steps=5), root / "r1", nproc=1, device="cpu", threads=1)
    return uri


@pytest.fixture(scope="module")
def ddp(root) -> tuple[str, TrainerResult]:
    uri = f"file://{root}/ddp"
    return uri, launch(tiny_job(uri, STEPS, trace_every_steps=5), root / "r2", nproc=2, device="cpu", threads=1)


@pytest.fixture(scope="module")
def fsdp(root) -> tuple[str, TrainerResult]:
    """FSDP2 (zero_stage 3), stopped at step 10 and resumed to the end."""
    uri = f"file://{root}/fsdp"
    job = tiny_job(uri, STEPS, zero_stage=3)
    launch(job, root / "r3", nproc=2, device="cpu", threads=1, stop_after_steps=10)
    return uri, launch(job, root / "r3", nproc=2, device="cpu", threads=1, resume=True)


def test_ddp_runs_two_ranks_to_the_end(ddp):
    _, res = ddp
    assert res.world_size == 2 and res.final_step == STEPS


def test_ddp_checkpoint_has_one_replica_and_each_ranks_rng(ddp):
    uri, _ = ddp
    m = ck.read_manifest(Storage(uri), STEPS)
    assert [s.rank for s in m.shards] == [0, 1]
    assert {e.name for e in m.shards[1].tensors} == {"rng.cpu"}  # rank 1 holds only its RNG state


def test_ddp_trains_the_same_model_as_one_process(ddp, one_process):
    _assert_same_model(_model(ddp[0], STEPS), _model(one_process, STEPS))


def test_ddp_trace_covers_every_rank_and_op_type(ddp):
    trace = pd.read_parquet(ddp[1].trace)
    assert set(trace["rank"]) == {0, 1} and set(trace["step"]) == {1, 6, 11, 16}
    assert {"forward-compute", "backward-compute", "separate-grads-all-reduce", "optimizer"} <= set(trace["optype"])
    fwd = trace[(trace.optype == "forward-compute") & (trace.step == 6) & (trace["rank"] == 0)]
    assert list(fwd["mb_id"]) == list(range(len(fwd))) and (trace["duration"] > 0).all()


@pytest.mark.slow  # two-process FSDP2/TP training runs (about 80 s together); .ci/run's slow pass
def test_fsdp2_resumes_from_its_stop(fsdp):
    _, res = fsdp
    assert res.resumed_from_step == 10 and res.final_step == STEPS


@pytest.mark.slow  # two-process FSDP2/TP training runs (about 80 s together); .ci/run's slow pass
def test_fsdp2_ranks_write_their_own_row_shards(fsdp):
    m = ck.read_manifest(Storage(fsdp[0]), STEPS)
    sharded = [e for e in m.shards[1].tensors if e.global_shape is not None]
    assert sharded and all(e.global_offset[0] > 0 for e in sharded if e.name == "model.wte.weight")


@pytest.mark.slow  # two-process FSDP2/TP training runs (about 80 s together); .ci/run's slow pass
def test_fsdp2_stopped_and_resumed_trains_the_same_model_as_one_process(fsdp, one_process):
    _assert_same_model(_model(fsdp[0], STEPS), _model(one_process, STEPS))


@pytest.fixture(scope="module")
def tp(root) -> tuple[str, str, TrainerResult]:
    """One process and TP=2 (stopped at 7, resumed) on a llama-style model."""
    one = f"file://{root}/tp-one"
    job1 = tiny_job(one, TP_STEPS)
    job1.model = job1.model.model_validate(TP_MODEL)
    launch(job1, root / "t1", nproc=1, device="cpu", threads=1)
    uri = f"file://{root}/tp"
    job2 = job1.model_copy(deep=True)
    job2.training.checkpoint.uri = uri
    launch(job2, root / "t2", nproc=2, tp=2, device="cpu", threads=1, stop_after_steps=7)
    return one, uri, launch(job2, root / "t2", nproc=2, tp=2, device="cpu", threads=1, resume=True)


@pytest.mark.slow  # two-process FSDP2/TP training runs (about 80 s together); .ci/run's slow pass
def test_tensor_parallel_resumes_from_its_stop(tp):
    res = tp[2]
    assert res.tp == 2 and res.resumed_from_step == 7 and res.final_step == TP_STEPS


@pytest.mark.slow  # two-process FSDP2/TP training runs (about 80 s together); .ci/run's slow pass
def test_tensor_parallel_shards_heads_and_mlp_columns(tp):
    m = ck.read_manifest(Storage(tp[1]), TP_STEPS)
    assert m.layout == {"dp": 1, "tp": 2, "zero_stage": 0}
    by_name = {e.name: e for e in m.shards[1].tensors}  # half of the q/k/v heads and of the MLP columns
    assert by_name["model.blocks.0.q.weight"].global_offset == [32, 0]
    assert by_name["model.blocks.0.proj.weight"].global_offset == [0, 32]
    assert by_name["model.wte.weight"].global_shape is None  # norms and embeddings are whole


@pytest.mark.slow  # two-process FSDP2/TP training runs (about 80 s together); .ci/run's slow pass
def test_tensor_parallel_trains_the_same_model_as_one_process(tp):
    _assert_same_model(_model(tp[1], TP_STEPS), _model(tp[0], TP_STEPS))


@pytest.mark.parametrize("precision", ["fp16-mixed", "bf16"])
def test_mixed_precision_trains_and_resumes_exactly(tmp_path, precision):
    """fp16-mixed carries a gradient scaler whose state must survive the checkpoint; bf16 keeps bf16 moments. The
    resume starts from a copy of the reference's step-5 checkpoint (two trainer starts, not three: a stopped run's
    step-5 checkpoint is that one, training being deterministic)."""
    full = f"file://{tmp_path}/full"
    ref = launch(tiny_job(full, 12, every=5, precision=precision), tmp_path / "a", device="cpu", threads=1)
    assert math.isfinite(ref.last_loss)
    shutil.copytree(tmp_path / "full", tmp_path / "part", ignore=shutil.ignore_patterns("step_00000010", "step_00000012"))
    part = f"file://{tmp_path}/part"
    res = launch(tiny_job(part, 12, every=5, precision=precision), tmp_path / "b", device="cpu", threads=1, resume=True)
    assert res.resumed_from_step == 5
    m = ck.read_manifest(Storage(part), 12)
    if precision == "fp16-mixed":
        assert m.trainer["scaler"]["scale"] > 0
    else:
        assert {e.dtype for e in m.shards[0].tensors if e.name.startswith("model.")} == {"bfloat16"}
    assert_bitwise_equal(final_state(part, 12), final_state(full, 12))
