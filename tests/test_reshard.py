"""reshard.py without processes: pieces of a checkpoint (replicated, row shards, duplicated replicas) reassembled into
the slice a rank of another layout needs; the fingerprint keys a resume may change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tasks.training import checkpoint as ck
from tasks.training import reshard
from tasks.training.storage import Storage

_FIELDS = {"layout": {}, "cursor": {"samples": 80}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}


def _write(st: Storage, world: int, pieces: list[list[tuple[str, torch.Tensor]]], meta: list[dict]) -> ck.Manifest:
    cps = [ck.AsyncCheckpointer(st, r, world, run="t", buffers=1) for r in range(world)]
    for r, cp in enumerate(cps):
        cp.save(4, pieces[r], _FIELDS, shard_meta=meta[r])
    for cp in reversed(cps):  # rank 0 commits once every rank's record is there
        cp.close()
    return ck.read_manifest(st, 4)


def test_row_shards_of_two_ranks_reassemble_into_one_process(tmp_path):
    torch.manual_seed(0)
    w, m1 = torch.randn(6, 3), torch.randn(6, 3)
    st = Storage(f"file://{tmp_path}")
    rows = [(slice(0, 3), [0, 0]), (slice(3, 6), [3, 0])]
    pieces = [[("model.weight", w[s]), ("optim.weight.exp_avg", m1[s]), ("optim.weight.step", torch.tensor(4.0)),
               ("rng.cpu", torch.get_rng_state())] for s, _ in rows]
    meta = [{"model.weight": ([6, 3], off), "optim.weight.exp_avg": ([6, 3], off)} for _, off in rows]
    m = _write(st, 2, pieces, meta)
    model = nn.Linear(3, 6, bias=False)
    got = reshard.read_resharded(st, m, model, rank=0)
    torch.testing.assert_close(got["model.weight"], w, rtol=0, atol=0)
    torch.testing.assert_close(got["optim.weight.exp_avg"], m1, rtol=0, atol=0)
    assert got["optim.weight.step"].item() == 4.0 and "rng.cpu" in got


def test_replicated_copies_on_every_rank_are_taken_once(tmp_path):
    w = torch.arange(12.0).view(6, 2)
    st = Storage(f"file://{tmp_path}")
    m = _write(st, 2, [[("model.weight", w)], [("model.weight", w)]], [{}, {}])
    got = reshard.read_resharded(st, m, nn.Linear(2, 6, bias=False), rank=1)
    torch.testing.assert_close(got["model.weight"], w, rtol=0, atol=0)


def test_a_missing_piece_is_an_error_naming_the_tensor(tmp_path):
    st = Storage(f"file://{tmp_path}")
    m = _write(st, 1, [[("model.weight", torch.ones(3, 3))]], [{"model.weight": ([6, 3], [0, 0])}])
    with pytest.raises(ck.CheckpointError, match="does not cover.*model.weight"):
        reshard.read_resharded(st, m, nn.Linear(3, 6, bias=False), rank=0)


def test_layout_and_batch_may_change_but_not_the_corpus():
    saved = {"corpus_sha256": "a", "seq_len": 64, "world_size": 2, "tp": 1, "global_batch": 8, "zero_stage": 0}
    now = {**saved, "world_size": 4, "tp": 2, "global_batch": 16}
    assert reshard.mismatch(saved, now) == []
    assert reshard.layout_changes(saved, now) == {"world_size": (2, 4), "tp": (1, 2), "global_batch": (8, 16)}
    assert "token 5120" in reshard.describe(reshard.layout_changes(saved, now), 80, 64)
    assert reshard.mismatch(saved, {**now, "corpus_sha256": "b"}) == ["corpus_sha256"]


def test_a_bf16_checkpoint_resumes_at_fp32(tmp_path):
    """Precision is not part of the fingerprint: the weights and the optimizer moments take the new dtype."""
    from tasks.training.launch import launch
    from tests.trainer_util import tiny_job

    uri = f"file://{tmp_path}/ck"
    launch(tiny_job(uri, 10, every=5, precision="bf16"), tmp_path / "a", device="cpu", threads=1, stop_after_steps=5)
    res = launch(tiny_job(uri, 10, every=5, precision="fp32"), tmp_path / "b", device="cpu", threads=1, resume=True)
    assert res.resumed_from_step == 5 and res.final_step == 10
    m = ck.read_manifest(Storage(uri), 10)
    dtypes = {e.dtype for s in m.shards for e in s.tensors if e.name.startswith(("model.", "optim.")) and e.shape}
    assert dtypes == {"float32"}
