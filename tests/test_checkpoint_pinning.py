"""Snapshot buffers are pinned in the background, range by range, and the step loop never waits for it."""

from __future__ import annotations

import gc
import threading

import torch

from tasks.training import checkpoint as ck
from tasks.training.pinning import PAGE
from tasks.training.storage import Storage

_FIELDS = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}


class _GatedPinner:
    """Records registrations; the first one blocks until `gate` is set (a driver call that takes its time)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []

    def register(self, ptr: int, nbytes: int) -> None:
        self.entered.set()
        self.gate.wait()
        self.registered.append((ptr, nbytes))

    def unregister(self, ptr: int) -> None:
        self.unregistered.append(ptr)


def _state(step: int) -> list[tuple[str, torch.Tensor]]:
    return [(f"model.w{i}", torch.full((3000 + i,), float(step * 10 + i))) for i in range(6)]


def test_the_step_loop_saves_while_a_buffer_is_being_pinned_and_pinning_ends_whole(tmp_path):
    st = Storage(f"file://{tmp_path}")
    pinner = _GatedPinner()
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", keep=10, buffers=2, pin=True, pinner=pinner)
    c.pin_chunk = 2 * PAGE  # several ranges per buffer
    c.prepare(_state(0))
    pinner.entered.wait()  # the background thread is inside its first registration, holding it

    def loop(c: ck.AsyncCheckpointer) -> None:  # the "training loop": every save goes through while that registration is stuck
        for step in (2, 4, 6):
            c.save(step, _state(step), _FIELDS, block=True, stage=True)
            c.barrier()
            c.wait()

    th = threading.Thread(target=loop, args=(c,), daemon=True)
    th.start()
    th.join(60)  # a guard against a hang (the old code waited for the whole allocation), not a timing
    stuck, registered = th.is_alive(), list(pinner.registered)
    pinner.gate.set()
    assert not stuck, "the step loop waited for the buffer being pinned"
    assert [r.step for r in c.records] == [2, 4, 6] and not registered
    c._prep.join()  # pinning goes on while the buffers are free, to the end
    assert c.pin_s is not None and all(b.pin.complete for b in c._bufs)
    for b in c._bufs:  # whole pages, no overlap, each tensor inside one registration
        ranges = sorted((p - b.pin.base, p - b.pin.base + n) for p, n in pinner.registered
                        if b.pin.base <= p < b.pin.base + len(b._region))
        assert ranges == b.pin.ranges and len(ranges) > 2
        assert all(s % PAGE == 0 and e % PAGE == 0 for s, e in ranges)
        assert all(e0 <= s1 for (_, e0), (s1, _) in zip(ranges, ranges[1:], strict=False))
        assert all(any(s <= e.offset and e.offset + e.nbytes <= end for s, end in ranges) for e in b.entries)
    c.save(8, _state(8), _FIELDS)  # into a pinned buffer
    c.close()
    for step in (2, 4, 6, 8):
        got = ck.read_shard(st, ck.read_manifest(st, step).shards[0])
        assert all(torch.equal(got[n], t) for n, t in _state(step))
    ptrs = {p for p, _ in pinner.registered}
    del c, b
    gc.collect()
    assert set(pinner.unregistered) == ptrs  # registrations end before the memory is freed


def test_a_failed_registration_leaves_the_buffer_pageable_and_saving(tmp_path):
    class Refusing(_GatedPinner):
        def register(self, ptr: int, nbytes: int) -> None:
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")

    st = Storage(f"file://{tmp_path}")
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", buffers=1, pin=True, pinner=Refusing())
    c.save(1, _state(1), _FIELDS)
    c.close()
    assert c._bufs[0].pin.failed and c.pin_s is None
    got = ck.read_shard(st, ck.read_manifest(st, 1).shards[0])
    assert all(torch.equal(got[n], t) for n, t in _state(1))


def test_the_layout_starts_a_page_aligned_range_after_each_chunk_and_is_the_same_pinned_or_not():
    tensors = [(f"w{i}", torch.zeros(1500)) for i in range(5)]  # 6000 bytes each
    b = ck.SnapshotBuffer(tensors, chunk=2 * PAGE)
    assert [e.offset for e in b.entries] == [0, 6016, 3 * PAGE, 3 * PAGE + 6016, 6 * PAGE]
    assert b.pin.ranges == [(0, 3 * PAGE), (3 * PAGE, 6 * PAGE), (6 * PAGE, 8 * PAGE)]
    assert b.flat.data_ptr() % PAGE == 0 and b.nbytes == 6 * PAGE + 6016
    b.prefault()
    assert int(b.flat[6016 * 2:3 * PAGE].sum()) == 0  # the gap to the next range is zeroed padding
