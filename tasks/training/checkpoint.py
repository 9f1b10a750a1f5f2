"""Asynchronous checkpointing (Acme section 6.1): snapshot into preallocated CPU buffers, persist in the background.

The training loop blocks only for `AsyncCheckpointer.save()`: a copy of every tensor into one flat CPU buffer
(pinned when the tensors live on a GPU). A background thread streams that buffer to storage while hashing
it; each rank then writes a small `rankNNNNN.json` record; rank 0 waits for all of them and commits the step by
writing `manifest.json` create-only. A step without a manifest was never committed and is never loaded.
At most one persist is in flight: the next `save()` waits for the previous one (that wait is counted as
blocked time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import torch
from pydantic import BaseModel, Field

from tasks.training.storage import AlreadyExists, Storage

log = logging.getLogger("frenzy.checkpoint")
_ALIGN = 64
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, or from another job/layout); names the fix."""


class CheckpointMismatch(CheckpointError):
    """A valid checkpoint of another job (corpus, model shape, batch or layout differ): never loaded."""


class TensorEntry(BaseModel):
    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    global_shape: list[int] | None = None
    """For a shard of a distributed tensor: the full shape (the shard is `shape` at `global_offset`)."""
    global_offset: list[int] | None = None


class ShardRecord(BaseModel):
    """One rank's file of a checkpoint."""

    rank: int
    key: str
    bytes: int
    sha256: str
    tensors: list[TensorEntry]
    extra: dict = Field(default_factory=dict)


class Manifest(BaseModel):
    """The commit record of one checkpoint step; written last, create-only."""

    version: int = 1
    step: int
    run: str
    created: str
    world_size: int
    layout: dict
    cursor: dict
    """Data cursor: samples consumed and the skipped (spike) ranges."""
    loss: dict
    """Loss statistics at the snapshot: last loss, rolling mean/std, grad norm."""
    healthy: bool
    """No loss spike was flagged in the steps before this snapshot."""
    trainer: dict
    """Scheduler, scaler, spike-detector and other small state."""
    fingerprint: dict
    """What must match to resume: corpus sha256, model shape, batch."""
    shards: list[ShardRecord]

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


class CheckpointRecord(BaseModel):
    """What the trainer reports per committed checkpoint."""

    step: int
    uri: str
    blocked_s: float
    persist_s: float
    bytes: int


def step_dir(step: int) -> str:
    return f"step_{step:08d}"


class SnapshotBuffer:
    """One flat, preallocated CPU byte buffer with a typed view per tensor."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]], pin: bool) -> None:
        self.signature = [(n, t.dtype, tuple(t.shape)) for n, t in tensors]
        self.entries: list[TensorEntry] = []
        off = 0
        for name, t in tensors:
            nbytes = t.numel() * t.element_size()
            self.entries.append(TensorEntry(name=name, dtype=str(t.dtype).removeprefix("torch."),
                                            shape=list(t.shape), offset=off, nbytes=nbytes))
            off += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        self.nbytes = off
        self.flat = torch.empty(off, dtype=torch.uint8, pin_memory=pin)
        self.views = [self.flat[e.offset:e.offset + e.nbytes].view(t.dtype).view(t.shape) for e, (_, t) in
                      zip(self.entries, tensors, strict=True)]

    def matches(self, tensors: list[tuple[str, torch.Tensor]]) -> bool:
        return self.signature == [(n, t.dtype, tuple(t.shape)) for n, t in tensors]

    def copy_from(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        on_gpu = False
        for v, (_, t) in zip(self.views, tensors, strict=True):
            on_gpu |= t.device.type == "cuda"
            v.copy_(t.detach(), non_blocking=t.device.type == "cuda")
        if on_gpu:
            torch.cuda.synchronize()

    def chunks(self, size: int = 16 << 20) -> Iterator[memoryview]:
        mv = memoryview(self.flat.numpy())
        for i in range(0, self.nbytes, size):
            yield mv[i:i + size]


class AsyncCheckpointer:
    """Snapshot now, persist in a background thread, commit with a checksummed manifest."""

    def __init__(self, storage: Storage, rank: int, world_size: int, run: str, keep: int = 3,
                 on_commit: Callable[[CheckpointRecord, Manifest], None] | None = None,
                 commit_timeout_s: float = 900.0, nice: int | None = None) -> None:
        """`nice` lowers the persist thread's CPU priority (Linux, per thread) so hashing and writing yield
        to the training loop's threads; default `$FRENZY_PERSIST_NICE` or 19 (the lowest), 0 keeps it equal."""
        self.storage, self.rank, self.world_size, self.run = storage, rank, world_size, run
        self.nice = int(os.environ.get("FRENZY_PERSIST_NICE", "19")) if nice is None else nice
        self.keep, self.on_commit, self.commit_timeout_s = keep, on_commit, commit_timeout_s
        self._buf: SnapshotBuffer | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.records: list[CheckpointRecord] = []
        self.persisting = threading.Event()

    def save(self, step: int, tensors: list[tuple[str, torch.Tensor]], manifest_fields: dict,
             extra: dict | None = None, shard_meta: dict[str, tuple[list[int], list[int]]] | None = None) -> float:
        """Block for the snapshot only; returns the blocked seconds (including waiting for a previous persist).

        `shard_meta` maps names of tensors that are shards of a distributed tensor to (global shape, offset).
        """
        t0 = time.perf_counter()
        self.wait()
        if self._buf is None or not self._buf.matches(tensors):
            pin = any(t.device.type == "cuda" for _, t in tensors)
            self._buf = SnapshotBuffer(tensors, pin=pin)
            for e in self._buf.entries:
                if shard_meta and e.name in shard_meta:
                    e.global_shape, e.global_offset = shard_meta[e.name]
        self._buf.copy_from(tensors)
        blocked = time.perf_counter() - t0
        self.persisting.set()
        self._thread = threading.Thread(target=self._persist, name=f"frenzy-persist-{step}", daemon=True,
                                        args=(step, dict(manifest_fields), dict(extra or {}), blocked))
        self._thread.start()
        return blocked

    def wait(self) -> None:
        """Wait for the in-flight persist; re-raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"persisting a checkpoint failed: {err}") from err

    def close(self) -> None:
        self.wait()

    # background ---------------------------------------------------------------------------------------
    def _persist(self, step: int, fields: dict, extra: dict, blocked: float) -> None:
        t0 = time.perf_counter()
        if self.nice and hasattr(os, "setpriority"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        try:
            buf = self._buf
            assert buf is not None
            d = step_dir(step)
            key = f"{d}/rank{self.rank:05d}.bin"
            n, sha = self.storage.write_stream(key, buf.chunks)
            _fault_delay(step)
            rec = ShardRecord(rank=self.rank, key=key, bytes=n, sha256=sha, tensors=buf.entries, extra=extra)
            self.storage.put(f"{d}/rank{self.rank:05d}.json", rec.model_dump_json().encode())
            if self.rank != 0:
                return
            shards = self._gather_shards(d, rec)
            manifest = Manifest(step=step, run=self.run, created=datetime.now(UTC).isoformat(),
                                world_size=self.world_size, shards=shards, **fields)
            try:
                self.storage.create(f"{d}/manifest.json", manifest.model_dump_json(indent=1).encode())
            except AlreadyExists:
                log.warning("step %d was already committed by another writer; keeping that commit", step)
                return
            persist_s = time.perf_counter() - t0
            record = CheckpointRecord(step=step, uri=self.storage.url(d), blocked_s=blocked, persist_s=persist_s,
                                      bytes=manifest.total_bytes)
            self.records.append(record)
            log.info("checkpoint step %d committed: %s (%.1f MB, blocked %.3fs, persist %.1fs)", step,
                     record.uri, record.bytes / 1e6, blocked, persist_s)
            apply_retention(self.storage, self.keep)
            if self.on_commit is not None:
                self.on_commit(record, manifest)
        except BaseException as err:  # noqa: BLE001 - surfaced by the next wait()
            log.error("persist of step %d failed: %s", step, err)
            self._error = err
        finally:
            self.persisting.clear()

    def _gather_shards(self, d: str, own: ShardRecord) -> list[ShardRecord]:
        shards = [own]
        deadline = time.monotonic() + self.commit_timeout_s
        for r in range(1, self.world_size):
            key = f"{d}/rank{r:05d}.json"
            while True:
                try:
                    shards.append(ShardRecord.model_validate_json(self.storage.read(key)))
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        raise CheckpointError(f"rank {r} did not finish {d} within {self.commit_timeout_s:.0f}s; "
                                              "the step stays uncommitted") from None
                    time.sleep(0.05)
        return shards


def _fault_delay(step: int) -> None:
    """Fault injection for drills: FRENZY_FAULT_PERSIST_DELAY="STEP:SECONDS" stalls every persist of a step
    >= STEP after its shard is written and before it is committed (a window in which to kill the trainer)."""
    spec = os.environ.get("FRENZY_FAULT_PERSIST_DELAY")
    if spec:
        from_step, seconds = spec.split(":")
        if step >= int(from_step):
            time.sleep(float(seconds))


# reading ------------------------------------------------------------------------------------------------
def list_steps(storage: Storage) -> list[int]:
    """Steps with a directory (committed or not), newest first."""
    return sorted((int(m.group(1)) for n in storage.list_dirs() if (m := _STEP_DIR.match(n))), reverse=True)


def read_manifest(storage: Storage, step: int) -> Manifest | None:
    try:
        return Manifest.model_validate_json(storage.read(f"{step_dir(step)}/manifest.json"))
    except FileNotFoundError:
        return None


def committed(storage: Storage) -> list[Manifest]:
    """Manifests of every committed step, newest first."""
    return [m for s in list_steps(storage) if (m := read_manifest(storage, s)) is not None]


def read_shard(storage: Storage, shard: ShardRecord) -> dict[str, torch.Tensor]:
    """Read one shard, verifying its size and sha256; raises `CheckpointError` on any mismatch."""
    flat = torch.empty(shard.bytes, dtype=torch.uint8)
    try:
        sha = storage.read_into(shard.key, memoryview(flat.numpy()))
    except (EOFError, FileNotFoundError) as err:
        raise CheckpointError(f"{storage.url(shard.key)}: {err}") from None
    if sha != shard.sha256:
        raise CheckpointError(f"{storage.url(shard.key)}: sha256 {sha[:12]}... does not match the manifest's "
                              f"{shard.sha256[:12]}... (corrupted)")
    out = {}
    for e in shard.tensors:
        out[e.name] = flat[e.offset:e.offset + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape)
    return out


def read_full(storage: Storage, manifest: Manifest, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """Whole tensors whose names start with `prefix` (prefix removed), assembled from every rank's shards.

    Evaluation loads models this way whatever layout trained them (one rank, DDP, FSDP2)."""
    out: dict[str, torch.Tensor] = {}
    for shard in manifest.shards:
        entries = {e.name: e for e in shard.tensors if e.name.startswith(prefix)}
        if not entries:
            continue
        tensors = read_shard(storage, shard)
        for name, e in entries.items():
            key = name[len(prefix):]
            t = tensors[name]
            if e.global_shape is None:
                out[key] = t
                continue
            full = out.setdefault(key, torch.empty(e.global_shape, dtype=t.dtype))
            idx = tuple(slice(o, o + n) for o, n in zip(e.global_offset, e.shape, strict=True))
            full[idx] = t
    return out


def verify(storage: Storage, manifest: Manifest) -> None:
    for s in manifest.shards:
        read_shard(storage, s)


def apply_retention(storage: Storage, keep: int) -> list[int]:
    """Keep the newest `keep` committed steps plus the newest healthy one; drop the rest and stale partials.

    Returns the removed steps. Manifests go first so a half-finished removal never leaves a committed step
    with missing shards.
    """
    steps = list_steps(storage)
    manifests = {s: m for s in steps if (m := read_manifest(storage, s)) is not None}
    if not manifests:
        return []
    newest = max(manifests)
    keep_set = set(sorted(manifests, reverse=True)[:keep])
    healthy = [s for s in sorted(manifests, reverse=True) if manifests[s].healthy]
    if healthy and not keep_set & set(healthy):
        keep_set.add(healthy[0])
    removed = []
    for s in steps:
        if s in keep_set or (s not in manifests and s > newest):
            continue  # uncommitted and newer than every commit: possibly a persist in flight elsewhere
        if s in manifests:
            storage.delete(f"{step_dir(s)}/manifest.json")
        storage.remove_dir(step_dir(s))
        removed.append(s)
    return removed


def discard_after(storage: Storage, step: int) -> list[int]:
    """Remove every step directory newer than `step` (a resume or rollback abandons that timeline)."""
    removed = [s for s in list_steps(storage) if s > step]
    for s in removed:
        storage.delete(f"{step_dir(s)}/manifest.json")
        storage.remove_dir(step_dir(s))
    return removed
