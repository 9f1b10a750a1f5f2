"""Pure pieces of the trainer: the loader's cursor, the spike detector, commit/verify/retention, shard assembly."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from tasks.training import checkpoint as ck
from tasks.training.data import BatchLoader, Cursor, decode, encode
from tasks.training.spikes import SpikeDetector
from tasks.training.storage import AlreadyExists, Storage, StorageError


def test_byte_tokenizer_roundtrip():
    text = "déjà vu — λ"
    assert decode(encode(text)) == text and encode(text).max() < 256


def test_loader_is_a_function_of_the_cursor_and_skips_ranges():
    tokens = np.arange(10_000, dtype=np.int64).astype(np.uint8)
    a = BatchLoader(tokens, 16, 4, seed=1)
    c = Cursor()
    first = [a.next_indices(c) for _ in range(5)]
    assert first[0] == [0, 1, 2, 3] and c.samples == 20
    # a fresh loader from a saved cursor continues with exactly the same batches
    b = BatchLoader(tokens, 16, 4, seed=1)
    c2 = Cursor.from_dict(Cursor(8).to_dict())
    assert b.next_indices(c2) == first[2]
    x1, y1 = a.batch(first[2])
    x2, y2 = b.batch(first[2])
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])
    # a skipped range is jumped over, also mid-batch
    c3 = Cursor(2, skips=[(3, 9)])
    assert a.next_indices(c3) == [2, 9, 10, 11] and c3.samples == 12
    # epochs use a new permutation: the second epoch's windows are a reordering of the first's
    n = a.n_windows
    ep0 = sorted(int(a.batch([i])[0][0, 0]) for i in range(n))
    ep1 = sorted(int(a.batch([n + i])[0][0, 0]) for i in range(n))
    assert ep0 == ep1


def test_noise_injection_replaces_only_the_named_samples():
    tokens = (np.arange(5000) % 7).astype(np.uint8)
    lo = BatchLoader(tokens, 32, 4, seed=0, noise_samples=[(4, 8)])
    assert int(lo.batch([0, 1, 2, 3])[0].max()) < 7
    assert int(lo.batch([4, 5, 6, 7])[0].max()) > 7


def test_spike_detector_flags_outliers_and_nonfinite_only_after_history():
    d = SpikeDetector(zscore=6, window=16, min_steps=8)
    rng = np.random.default_rng(0)
    assert not d.check(50.0, 1.0).spike  # no history yet: nothing is judged
    for _ in range(20):
        assert not d.check(3.0 + 0.01 * rng.standard_normal(), 1.0 + 0.01 * rng.standard_normal()).spike
    v = d.check(3.5, 1.0)
    assert v.spike and v.loss_z > 6 and "loss" in v.reason
    assert d.check(3.0, 2.0).spike  # gradient norm alone
    assert d.check(math.nan, 1.0).spike and d.check(3.0, math.inf).spike
    assert not d.check(3.01, 1.0).spike
    # spikes never enter the history; state round-trips exactly
    e = SpikeDetector(6, 16, 8)
    e.load(d.state())
    assert e.state() == d.state() and max(e.loss) < 3.1


def _commit(storage: Storage, step: int, healthy: bool = True, value: float = 0.0) -> None:
    c = ck.AsyncCheckpointer(storage, 0, 1, run="t", keep=100, nice=0)
    t = torch.full((64,), value)
    c.save(step, [("model.w", t)], {"layout": {}, "cursor": {"samples": step}, "loss": {}, "healthy": healthy,
                                     "trainer": {}, "fingerprint": {}})
    c.close()


def test_commit_verify_and_snapshot_isolation(tmp_path):
    st = Storage(str(tmp_path))
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", nice=0)
    w = torch.arange(1000, dtype=torch.float32)
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    blocked = c.save(5, [("model.w", w)], fields)
    w += 1  # the training loop moves on at once; the checkpoint holds the snapshot
    c.close()
    assert blocked >= 0
    m = ck.read_manifest(st, 5)
    assert m.shards[0].bytes == 4032 and len(m.shards[0].sha256) == 64  # 4000 bytes, padded to 64
    assert torch.equal(ck.read_shard(st, m.shards[0])["model.w"], torch.arange(1000, dtype=torch.float32))
    with pytest.raises(AlreadyExists):
        st.create("step_00000005/manifest.json", b"{}")


def test_retention_keeps_newest_and_one_healthy(tmp_path):
    st = Storage(f"file://{tmp_path}")
    _commit(st, 10, healthy=True)
    for s in (20, 30, 40):
        _commit(st, s, healthy=False)
    (tmp_path / "step_00000015").mkdir()  # an uncommitted leftover of a crash
    (tmp_path / "step_00000015" / "rank00000.bin").write_bytes(b"x")
    removed = ck.apply_retention(st, keep=2)
    assert sorted(removed) == [15, 20]
    assert [m.step for m in ck.committed(st)] == [40, 30, 10]  # 10 is the one healthy, pre-spike checkpoint
    assert ck.discard_after(st, 30) == [40]


def test_read_full_assembles_row_shards(tmp_path):
    st = Storage(str(tmp_path))
    full = torch.arange(24, dtype=torch.float32).view(6, 4)
    writers = []
    for rank, rows in ((0, slice(0, 3)), (1, slice(3, 6))):  # rank 0 commits once rank 1's record lands
        c = ck.AsyncCheckpointer(st, rank, 2, run="t", nice=0, commit_timeout_s=30)
        c.save(1, [("model.w", full[rows].clone()), ("model.b", torch.ones(2))],
               {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}},
               shard_meta={"model.w": ([6, 4], [rows.start, 0])})
        writers.append(c)
    for c in writers:
        c.close()
    m = ck.read_manifest(st, 1)
    out = ck.read_full(st, m)
    assert torch.equal(out["w"], full) and torch.equal(out["b"], torch.ones(2))


def test_text_corpus_directory_is_cached_until_a_file_changes(tmp_path, monkeypatch):
    from tasks.jobspec import DataSpec
    from tasks.training.data import DataError, load_corpus

    monkeypatch.setenv("FRENZY_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "text"
    d.mkdir()
    (d / "a.txt").write_text("hello")
    (d / "b.txt").write_text("world")
    assert bytes(load_corpus(DataSpec(source="text", path=str(d)))) == b"hello\nworld"
    assert bytes(load_corpus(DataSpec(source="text", path=str(d)))) == b"hello\nworld"
    assert len(list((tmp_path / "cache" / "corpus").iterdir())) == 1
    (d / "b.txt").write_text("there!")
    assert bytes(load_corpus(DataSpec(source="text", path=str(d)))) == b"hello\nthere!"
    with pytest.raises(DataError, match="does not exist"):
        load_corpus(DataSpec(source="text", path=str(tmp_path / "missing")))


@pytest.mark.parametrize("attention", ["flash", "math"])
def test_op_recompute_gives_the_same_gradients_and_recomputes_every_other_matmul(attention, monkeypatch):
    from tasks.jobspec import ModelSpec
    from tasks.training import model as model_mod
    from tasks.training.model import GPT

    spec = ModelSpec.model_validate({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 97,
                                     "mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False})
    torch.manual_seed(0)
    ref = GPT(spec, 32, attention=attention)
    op = GPT(spec, 32, attention=attention, recompute="op")
    op.load_state_dict(ref.state_dict())
    x, y = torch.randint(0, 97, (2, 32)), torch.randint(0, 97, (2, 32))
    decisions = []
    real = model_mod._op_checkpoint_context

    def spy():  # record what the policy decides for each matmul, forward and recompute
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        fwd_ctx, rec_ctx = real()
        policy = fwd_ctx.policy_fn

        def logged(ctx, func, *args, **kwargs):
            out = policy(ctx, func, *args, **kwargs)
            if func in model_mod._MATMULS:
                decisions.append((ctx.is_recompute, out == CheckpointPolicy.MUST_SAVE))
            return out
        return create_selective_checkpoint_contexts(logged)

    monkeypatch.setattr(model_mod, "_op_checkpoint_context", spy)
    loss_ref, loss_op = ref(x, y), op(x, y)
    loss_ref.backward()
    loss_op.backward()
    assert torch.equal(loss_ref, loss_op)
    for (name, a), b in zip(ref.named_parameters(), op.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
    fwd = [keep for rec, keep in decisions if not rec]
    assert fwd == [True, False, True, False, True, False, True] * 2  # q k v proj fc1 fc3 fc2, per block


class _GatedStorage(Storage):
    """Local storage whose shard writes wait for a gate: a persist that is still running, under the test's control."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.gate = threading.Event()

    def write_stream(self, key, chunks, threads=1):  # noqa: ANN001, ANN201
        assert self.gate.wait(60), "gate never opened"
        return super().write_stream(key, chunks, threads)


_FIELDS = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}


def test_one_buffer_defers_a_save_instead_of_waiting_for_the_persist(tmp_path):
    st = _GatedStorage(f"file://{tmp_path}")
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", buffers=1)
    w = [("model.w", torch.arange(10.0))]
    assert c.save(1, w, _FIELDS, block=False) is not None
    assert c.busy() and c.save(2, w, _FIELDS, block=False) is None  # due while step 1 persists: deferred, not waited
    st.gate.set()
    c.wait()
    assert not c.busy() and c.save(3, w, _FIELDS, block=False, deferred_steps=1) is not None
    c.close()
    assert [(r.step, r.deferred_steps) for r in c.records] == [(1, 0), (3, 1)]


def test_two_buffers_take_a_save_during_a_persist_and_persist_in_order(tmp_path):
    st = _GatedStorage(f"file://{tmp_path}")
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", buffers=2)
    w = torch.arange(10.0)
    c.prepare([("model.w", w)])
    c._prep.join(60)  # both buffers made (a save while the second is still being made is deferred, by design)
    assert len(c._bufs) == 2
    assert c.save(1, [("model.w", w)], _FIELDS, block=False) is not None
    w += 1
    assert c.save(2, [("model.w", w)], _FIELDS, block=False) is not None  # the second buffer
    assert c.save(3, [("model.w", w)], _FIELDS, block=False) is None  # both persisting: deferred
    st.gate.set()
    c.close()
    assert [r.step for r in c.records] == [1, 2]
    one, two = (ck.read_shard(st, ck.read_manifest(st, s).shards[0])["model.w"] for s in (1, 2))
    assert torch.equal(one, torch.arange(10.0)) and torch.equal(two, torch.arange(10.0) + 1)


def test_snapshot_padding_is_zero_so_identical_state_gives_identical_checksums(tmp_path):
    shas = []
    for root in ("a", "b"):
        torch.empty(1 << 20, dtype=torch.uint8).fill_(0xAB)  # leave garbage on the heap for the next buffer
        c = ck.AsyncCheckpointer(Storage(f"file://{tmp_path / root}"), 0, 1, run="t")
        c.save(1, [("model.a", torch.ones(3)), ("model.b", torch.arange(5, dtype=torch.int16))], _FIELDS)
        c.close()
        shas.append(ck.read_manifest(Storage(f"file://{tmp_path / root}"), 1).shards[0].sha256)
        buf = c._free[0]
        pad = buf.flat[buf.entries[0].nbytes:buf.entries[1].offset]
        assert pad.numel() > 0 and int(pad.sum()) == 0
    assert shas[0] == shas[1]


def test_snapshot_buffers_follow_host_memory_and_the_override(monkeypatch):
    monkeypatch.delenv("FRENZY_SNAPSHOT_BUFFERS", raising=False)
    gib = 1 << 30
    assert ck.snapshot_buffers(1 << 20, memory=(16 * gib, 24 * gib)) == 2  # 1 MiB twice leaves plenty
    assert ck.snapshot_buffers(1 << 20, memory=(4 * gib, 24 * gib)) == 1  # would dip under the 4 GiB floor
    assert ck.snapshot_buffers(4 * gib, ranks_on_host=4, memory=(40 * gib, 64 * gib)) == 1  # 4 ranks x 2 copies
    assert ck.snapshot_buffers(4 * gib, ranks_on_host=2, memory=(40 * gib, 64 * gib)) == 2
    assert ck.snapshot_buffers(1 << 50) == 1  # a petabyte fits on no host
    monkeypatch.setenv("FRENZY_SNAPSHOT_BUFFERS", "1")
    assert ck.snapshot_buffers(1 << 20) == 1


class _FlakyStorage(Storage):
    """Shard writes of the steps in `down` fail as an outage longer than the retry budget would."""

    def __init__(self, uri: str, down: set[int]) -> None:
        super().__init__(uri, attempts=1)
        self.down = down

    def write_stream(self, key, chunks, threads=1):  # noqa: ANN001, ANN201
        if int(key[5:13]) in self.down:
            raise StorageError(f"{key}: endpoint unreachable")
        return super().write_stream(key, chunks, threads)


def test_a_failed_persist_skips_that_checkpoint_and_the_next_one_commits(tmp_path):
    st = _FlakyStorage(f"file://{tmp_path}", down={2})
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", buffers=1)
    for step in (1, 2, 3):
        c.save(step, [("model.w", torch.full((4,), float(step)))], _FIELDS)
        c.wait()
    c.close()  # the newest save committed: no error
    assert [r.step for r in c.records] == [1, 3] and [s for s, _ in c.failed] == [2]
    st.down = {4}
    c.save(4, [("model.w", torch.ones(4))], _FIELDS)
    with pytest.raises(ck.CheckpointError, match="final checkpoint \\(step 4\\) was not committed"):
        c.close()


def test_a_staged_snapshot_holds_the_values_at_the_save_not_after_the_update(tmp_path):
    st = Storage(f"file://{tmp_path}")
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", buffers=1)
    w = torch.arange(100_000, dtype=torch.float32)
    c.save(7, [("model.w", w)], _FIELDS, stage=True)  # returns at once; the copy runs beside "forward/backward"
    waited = c.barrier()  # the loop calls this before the optimizer step
    assert waited >= 0.0
    w += 1  # the update
    c.close()
    [rec] = c.records
    assert rec.step == 7 and rec.blocked_s >= waited
    got = ck.read_shard(st, ck.read_manifest(st, 7).shards[0])["model.w"]
    assert torch.equal(got, torch.arange(100_000, dtype=torch.float32))
