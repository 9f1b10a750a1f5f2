"""The persist's write path: sha256 computed beside the writes, shards written by several threads at their offsets,
and the guarantees kept (the same checksum as hashing the bytes in one go, a corrupt byte caught, a failing writer
failing the whole persist with nothing committed, a retry that rewrites the file whole)."""

from __future__ import annotations

import errno
import hashlib
import os
import threading

import pytest
import torch

from tasks.training import checkpoint as ck
from tasks.training import storage as storage_mod
from tasks.training.storage import Storage, StorageError

_PWRITE = os.pwrite
_FIELDS = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}


def _chunks() -> list[memoryview]:
    """Chunks of uneven sizes (one empty, some under hashlib's 2048-byte GIL threshold)."""
    g = torch.Generator().manual_seed(1)
    sizes = [1, 0, 2047, 2048, 70_000, 1 << 20, 3, 500_001]
    return [memoryview(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes())
            for n in sizes]


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_the_pipeline_gives_the_sha256_of_the_bytes_in_one_go(tmp_path, threads):
    parts = _chunks()
    whole = b"".join(bytes(c) for c in parts)
    n, sha = Storage(str(tmp_path)).write_stream("step_00000001/rank00000.bin", lambda: iter(parts), threads=threads)
    assert n == len(whole)
    assert sha == hashlib.sha256(whole).hexdigest()
    assert (tmp_path / "step_00000001/rank00000.bin").read_bytes() == whole


def test_a_rewrite_over_a_longer_file_leaves_no_tail(tmp_path):
    st = Storage(str(tmp_path))
    st.write_stream("a.bin", lambda: [memoryview(b"x" * 100_000)], threads=3)
    n, sha = st.write_stream("a.bin", lambda: [memoryview(b"y" * 10)], threads=3)
    assert (tmp_path / "a.bin").read_bytes() == b"y" * 10 and sha == hashlib.sha256(b"y" * 10).hexdigest()


def _state() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [(f"model.w{i}", torch.randn(300_000 + i, generator=g)) for i in range(6)]


def _checkpointer(st: Storage, threads: int, size: int = 256 << 10) -> ck.AsyncCheckpointer:
    """A checkpointer with `threads` persist threads whose snapshot streams in chunks of `size` bytes (many of them, so
    several writers each get some), its buffer made; `save(1, _state(), _FIELDS)` next."""
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", buffers=1)
    c.threads = threads
    c.prepare(_state())
    c._prep.join(60)
    for buf in c._bufs:
        buf.chunks = lambda size=size, b=buf: type(b).chunks(b, size)
    return c


def test_a_corrupt_byte_in_a_parallel_written_shard_fails_verification(tmp_path):
    st = Storage(str(tmp_path))
    c = _checkpointer(st, 5)
    c.save(1, _state(), _FIELDS)
    c.close()
    m = ck.read_manifest(st, 1)
    path = tmp_path / m.shards[0].key
    data = bytearray(path.read_bytes())
    assert m.shards[0].sha256 == hashlib.sha256(data).hexdigest()  # what any reader, old or new, checks
    ck.verify(st, m)
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError, match="does not match the manifest"):
        ck.verify(st, m)


class _FailingPwrite:
    """os.pwrite that fails (EIO) on its `nth` call, once, in whichever writer thread makes it. Its first two calls
    wait for each other, so they are made by two writer threads at once (a pool whose first thread finished each
    write before the next was submitted would otherwise do them all in one thread: CI saw it)."""

    def __init__(self, nth: int) -> None:
        self.nth, self.calls, self.threads = nth, 0, set()
        self.lock = threading.Lock()
        self.together = threading.Barrier(2, timeout=30)

    def __call__(self, fd: int, data: memoryview, offset: int) -> int:
        with self.lock:
            self.calls += 1
            self.threads.add(threading.get_ident())
            first_two, fail = self.calls <= 2, self.calls == self.nth
        if first_two:
            self.together.wait()  # BrokenBarrierError (a failed test) if no second writer ever comes
        if fail:
            raise OSError(errno.EIO, "injected write error")
        return _PWRITE(fd, data, offset)


def test_a_failing_writer_fails_the_whole_persist_and_commits_nothing(tmp_path, monkeypatch):
    bad = _FailingPwrite(nth=5)
    monkeypatch.setattr(storage_mod.os, "pwrite", bad, raising=False)
    st = Storage(str(tmp_path), attempts=1)
    c = _checkpointer(st, 4)
    c.save(1, _state(), _FIELDS)
    with pytest.raises(ck.CheckpointError, match="final checkpoint \\(step 1\\) was not committed.*injected"):
        c.close()
    assert len(bad.threads) > 1  # the writes were spread over the pool
    assert ck.read_manifest(st, 1) is None and ck.committed(st) == []
    assert not (tmp_path / "step_00000001").exists()  # the part-written shard was removed


def test_a_retry_after_a_failing_writer_rewrites_the_shard_whole(tmp_path, monkeypatch):
    bad = _FailingPwrite(nth=3)
    monkeypatch.setattr(storage_mod.os, "pwrite", bad, raising=False)
    st = Storage(str(tmp_path), attempts=2, backoff_s=0.0)
    parts = _chunks() * 4
    n, sha = st.write_stream("a.bin", lambda: iter(parts), threads=4)
    whole = b"".join(bytes(c) for c in parts)
    assert bad.calls > len([p for p in parts if len(p)])  # the first attempt failed, the second wrote everything
    assert (tmp_path / "a.bin").read_bytes() == whole and sha == hashlib.sha256(whole).hexdigest()


def test_a_write_error_no_retry_can_fix_is_not_retried(tmp_path, monkeypatch):
    def full(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage_mod.os, "pwrite", full, raising=False)
    with pytest.raises(StorageError, match="not retried"):
        Storage(str(tmp_path), attempts=5, backoff_s=10.0).write_stream("a.bin", lambda: _chunks(), threads=3)


def test_persist_threads_follow_the_cores_left_and_the_override(monkeypatch):
    from tasks.training.checkpoint.snapshot import persist_threads

    monkeypatch.delenv("FRENZY_PERSIST_THREADS", raising=False)
    assert persist_threads(on_gpu=False, cores=16) == 1  # a CPU job's torch threads take all but one core
    assert persist_threads(on_gpu=True, cores=16) == 2  # the writer and the hasher
    assert persist_threads(on_gpu=True, ranks_on_host=4, cores=16) == 2
    assert persist_threads(on_gpu=True, ranks_on_host=8, cores=16) == 1  # 2 cores a rank: its loop and one
    assert persist_threads(on_gpu=True, cores=2) == 1
    monkeypatch.setenv("FRENZY_PERSIST_THREADS", "3")
    assert persist_threads(on_gpu=False, cores=16) == 3


def test_two_threads_hash_beside_the_writer_and_one_hashes_in_the_writer(tmp_path, monkeypatch):
    real = hashlib.sha256
    seen: list[str] = []

    class Recording:
        def __init__(self) -> None:
            self.h = real()

        def update(self, data: memoryview) -> None:
            seen.append(threading.current_thread().name)
            self.h.update(data)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(storage_mod.hashlib, "sha256", Recording)
    st = Storage(str(tmp_path))
    st.write_stream("a.bin", _chunks, threads=2)
    assert seen and set(seen) == {"frenzy-persist-hash"}
    seen.clear()
    st.write_stream("b.bin", _chunks, threads=1)
    assert seen and set(seen) == {threading.current_thread().name}  # the old path: the writer hashes


def test_chunks_of_wider_items_land_at_their_byte_offsets(tmp_path):
    a = torch.arange(1000, dtype=torch.float32).numpy()
    b = torch.arange(7, dtype=torch.int64).numpy()
    whole = a.tobytes() + b.tobytes()
    n, sha = Storage(str(tmp_path)).write_stream("a.bin", lambda: [memoryview(a), memoryview(b)], threads=3)
    assert (tmp_path / "a.bin").read_bytes() == whole and sha == hashlib.sha256(whole).hexdigest()
