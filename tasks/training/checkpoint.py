"""Asynchronous checkpointing (Acme section 6.1): snapshot into preallocated CPU buffers, persist in the background.

The training loop blocks only for `AsyncCheckpointer.save()`: a copy of every tensor into one flat CPU buffer
(pinned when the tensors live on a GPU). A background thread streams that buffer to storage while hashing
it; each rank then writes a small `rankNNNNN.json` record; rank 0 waits for all of them and commits the step by
writing `manifest.json` create-only. A step without a manifest was never committed and is never loaded.

The loop never waits for a persist. Buffers are allocated (and their pages touched) by `prepare()` in the
background once the optimizer state exists, not inside the first save. Two buffers are used when the host has the
memory (`snapshot_buffers()`), so a save that comes due while the previous persist runs snapshots into the other
one and its persist queues behind; when no buffer is free, `save()` returns None and the loop retries at the next
step boundary (a deferred checkpoint, reported as `deferred_steps`). Persists run one at a time, in order.
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
from typing import Annotated

import torch
from pydantic import BaseModel, Field

from tasks.errors import FrenzyError
from tasks.jobspec import NAME_PATTERN
from tasks.training.storage import AlreadyExists, NotAFile, Storage
from tasks.userfiles import json_loads

log = logging.getLogger("frenzy.checkpoint")
_ALIGN = 64
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(FrenzyError, RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, or from another job/layout); names the fix."""


class CheckpointMismatch(CheckpointError):
    """A valid checkpoint of another job (corpus, model shape, batch or layout differ): never loaded."""


class TensorEntry(BaseModel):
    name: str
    dtype: str
    shape: list[Annotated[int, Field(ge=0)]]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)
    global_shape: list[int] | None = None
    """For a shard of a distributed tensor: the full shape (the shard is `shape` at `global_offset`)."""
    global_offset: list[int] | None = None


class ShardRecord(BaseModel):
    """One rank's file of a checkpoint."""

    rank: int = Field(ge=0)
    key: str
    bytes: int = Field(ge=0, le=1 << 44)
    """At most 16 TiB: a record claiming more was altered (reading it would allocate that much first)."""
    sha256: str
    tensors: list[TensorEntry]
    extra: dict = Field(default_factory=dict)


class Manifest(BaseModel):
    """The commit record of one checkpoint step; written last, create-only."""

    version: int = 1
    step: int
    run: str = Field(pattern=NAME_PATTERN)
    """The job name: evaluation writes under evals/<run>/, so it must be a name, not a path."""
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
    """Seconds the training loop was blocked (the snapshot copy)."""
    persist_s: float
    """Seconds the background persist took (write, hash, fsync, commit)."""
    bytes: int
    deferred_steps: int = 0
    """Steps this checkpoint came after it was due, because every snapshot buffer was still persisting."""


def step_dir(step: int) -> str:
    return f"step_{step:08d}"


class SnapshotBuffer:
    """One flat, preallocated CPU byte buffer with a typed view per tensor. Its alignment padding is zeroed, so it
    is the same in every checkpoint (no heap bytes in files; identical runs give identical checksums)."""

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
        # only the alignment padding needs zeroing (the tensors overwrite the rest): zero-filling the whole buffer
        # would touch every page now, competing with the training steps for memory bandwidth
        self.flat = torch.empty(off, dtype=torch.uint8, pin_memory=pin)
        for e in self.entries:
            end = (e.offset + e.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
            if end > e.offset + e.nbytes:
                self.flat[e.offset + e.nbytes:end].zero_()
        self.views = [self.flat[e.offset:e.offset + e.nbytes].view(t.dtype).view(t.shape) for e, (_, t) in
                      zip(self.entries, tensors, strict=True)]

    def prefault(self, page: int = 4096) -> None:
        """Touch every page now (one byte each), so the first snapshot copies into memory the kernel already
        mapped: without it that copy pays a page fault per 4 KiB (2.2-2.7 s for 1 GB on the benchmark machine,
        against milliseconds later). Done by the background allocation, not on the training thread; pinned
        memory is mapped at allocation and skips it."""
        if not self.flat.is_pinned():
            self.flat[::page].zero_()

    def matches(self, tensors: list[tuple[str, torch.Tensor]]) -> bool:
        return self.signature == [(n, t.dtype, tuple(t.shape)) for n, t in tensors]

    def copy_from(self, tensors: list[tuple[str, torch.Tensor]], sync: bool = True) -> None:
        on_gpu = False
        for v, (_, t) in zip(self.views, tensors, strict=True):
            on_gpu |= t.device.type == "cuda"
            v.copy_(t.detach(), non_blocking=t.device.type == "cuda")
        if on_gpu and sync:
            torch.cuda.synchronize()

    def chunks(self, size: int = 16 << 20) -> Iterator[memoryview]:
        mv = memoryview(self.flat.numpy())
        for i in range(0, self.nbytes, size):
            yield mv[i:i + size]


def snapshot_buffers(nbytes: int, ranks_on_host: int = 1, memory: tuple[int, int] | None = None) -> int:
    """How many snapshot buffers to use: 2 (a save never waits for the previous persist) when every rank on this
    host can hold a second copy and still leave max(4 GiB, 15%) of RAM available, else 1 (a save that comes due
    during a persist is deferred). `FRENZY_SNAPSHOT_BUFFERS=1|2` decides instead. `memory` is (available, total)
    bytes; None reads this host's."""
    forced = os.environ.get("FRENZY_SNAPSHOT_BUFFERS")
    if forced:
        return max(1, min(2, int(forced)))
    if memory is None:
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            memory = os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        except (ValueError, OSError):
            return 1
    avail, total = memory
    # the first buffer is part of what is "available" now too: count both copies of every rank
    return 2 if avail - 2 * nbytes * ranks_on_host > max(4 << 30, 0.15 * total) else 1


class _Job:
    __slots__ = ("step", "buf", "fields", "extra", "blocked", "deferred")

    def __init__(self, step: int, buf: SnapshotBuffer, fields: dict, extra: dict, blocked: float,
                 deferred: int) -> None:
        self.step, self.buf, self.fields, self.extra = step, buf, fields, extra
        self.blocked, self.deferred = blocked, deferred


class AsyncCheckpointer:
    """Snapshot now, persist in a background thread, commit with a checksummed manifest."""

    def __init__(self, storage: Storage, rank: int, world_size: int, run: str, keep: int = 3,
                 on_commit: Callable[[CheckpointRecord, Manifest], None] | None = None,
                 commit_timeout_s: float = 900.0, nice: int | None = None, buffers: int | None = None,
                 ranks_on_host: int = 1, fence: Callable[[], bool] | None = None) -> None:
        """`nice` lowers the persist thread's CPU priority (Linux, per thread); default `$FRENZY_PERSIST_NICE` or 0:
        the trainer leaves a core for it instead (a niced persist on a busy host crawls and holds its buffer).
        `buffers` 1 or 2 fixes the number of snapshot buffers; None decides by host memory (`snapshot_buffers`).
        `fence` (rank 0): asked before each commit; False (the writer lease is lost) leaves the step uncommitted."""
        self.fence = fence
        self.storage, self.rank, self.world_size, self.run = storage, rank, world_size, run
        self.nice = int(os.environ.get("FRENZY_PERSIST_NICE", "0")) if nice is None else nice
        self.keep, self.on_commit, self.commit_timeout_s = keep, on_commit, commit_timeout_s
        self.n_buffers, self.ranks_on_host = buffers, ranks_on_host
        self._free: list[SnapshotBuffer] = []
        self._lock = threading.Condition()
        self._queue: list[_Job] = []
        self._inflight = 0
        self._worker: threading.Thread | None = None
        self._prep: threading.Thread | None = None
        self._error: tuple[int, BaseException] | None = None
        self._staging: tuple[_Job, threading.Thread] | None = None
        self._stage_error: BaseException | None = None
        self._side: torch.cuda.Stream | None = None
        self._last_step: int | None = None
        self.failed: list[tuple[int, str]] = []
        """(step, error) of every save whose persist failed."""
        self.records: list[CheckpointRecord] = []
        self.persisting = threading.Event()
        self.last_persist_s: float | None = None
        """Seconds the newest completed persist took (the loop uses it to advise on the interval)."""

    # buffers ----------------------------------------------------------------------------------------------
    def _allocate(self, tensors: list[tuple[str, torch.Tensor]], shard_meta: dict | None) -> None:
        pin = any(t.device.type == "cuda" for _, t in tensors)
        first = SnapshotBuffer(tensors, pin=pin)
        n = self.n_buffers or snapshot_buffers(first.nbytes, self.ranks_on_host)
        bufs = [first] + [SnapshotBuffer(tensors, pin=pin) for _ in range(n - 1)]
        for b in bufs:
            b.prefault()
        for b in bufs:
            for e in b.entries:
                if shard_meta and e.name in shard_meta:
                    e.global_shape, e.global_offset = shard_meta[e.name]
        with self._lock:
            self._free = bufs
            self.n_buffers = n
        log.info("checkpoint snapshot: %d buffer(s) of %.1f MB%s", n, first.nbytes / 1e6, " (pinned)" if pin else "")

    def prepare(self, tensors: list[tuple[str, torch.Tensor]], shard_meta: dict | None = None) -> None:
        """Allocate the snapshot buffers in the background (call once the optimizer state exists)."""
        if self._prep is None and not self._free:
            self._prep = threading.Thread(target=self._allocate, args=(tensors, shard_meta), daemon=True,
                                          name="frenzy-snapshot-alloc")
            self._prep.start()

    def _ready(self, tensors: list[tuple[str, torch.Tensor]], shard_meta: dict | None) -> None:
        if self._prep is not None:
            self._prep.join()
            self._prep = None
        with self._lock:
            stale = self._free and not self._free[0].matches(tensors)
            empty = not self._free and self._inflight == 0
        if stale or empty:  # the state changed shape (or was never prepared): buffers for the new signature
            self.wait()
            self._allocate(tensors, shard_meta)

    # saving -----------------------------------------------------------------------------------------------
    def save(self, step: int, tensors: list[tuple[str, torch.Tensor]], manifest_fields: dict,
             extra: dict | None = None, shard_meta: dict[str, tuple[list[int], list[int]]] | None = None,
             *, block: bool = True, deferred_steps: int = 0, stage: bool = False) -> float | None:
        """Snapshot `tensors` and queue their persist; returns the seconds the caller was blocked.

        With `stage=True` the copy into the buffer runs in a background thread (a side CUDA stream on a GPU) while
        the caller goes on with work that reads but does not change the tensors (the next forward and backward);
        the caller must call `barrier()` before it changes them, and the persist starts from there.

        With `block=False` a save that finds every buffer still persisting returns None at once (the caller
        retries at its next step boundary); with `block=True` it waits for a buffer (that wait counts as blocked).
        `shard_meta` maps names of tensors that are shards of a distributed tensor to (global shape, offset)."""
        t0 = time.perf_counter()
        self.barrier()  # a previous staged copy the caller did not wait for
        self._raise_error()
        self._ready(tensors, shard_meta)
        with self._lock:
            if not self._free and not block:
                return None
            while not self._free:
                self._lock.wait(0.1)
                self._raise_error_locked()
            buf = self._free.pop()
            self._last_step = step
            self._inflight += 1
            self.persisting.set()
        job = _Job(step, buf, dict(manifest_fields), dict(extra or {}), 0.0, deferred_steps)
        if stage:
            main = torch.cuda.current_stream() if any(t.device.type == "cuda" for _, t in tensors) else None
            th = threading.Thread(target=self._stage_copy, args=(buf, tensors, main), daemon=True,
                                  name=f"frenzy-stage-{step}")
            self._staging = (job, th)
            th.start()
            job.blocked = time.perf_counter() - t0
            return job.blocked
        buf.copy_from(tensors)
        job.blocked = time.perf_counter() - t0
        self._enqueue(job)
        return job.blocked

    def _stage_copy(self, buf: SnapshotBuffer, tensors: list[tuple[str, torch.Tensor]],
                    main: torch.cuda.Stream | None) -> None:
        try:
            if main is None:
                buf.copy_from(tensors)
                return
            if self._side is None:
                self._side = torch.cuda.Stream()
            self._side.wait_stream(main)  # copy the values after the update that preceded the save
            with torch.cuda.stream(self._side):
                buf.copy_from(tensors, sync=False)
            self._side.synchronize()
        except BaseException as err:  # noqa: BLE001 - reported by barrier()
            self._stage_error = err

    def barrier(self) -> float:
        """Wait until a staged snapshot has been copied; the loop calls it before anything changes the saved
        tensors (the optimizer step, a rollback). Returns the seconds waited (counted as blocked)."""
        if self._staging is None:
            return 0.0
        job, th = self._staging
        t0 = time.perf_counter()
        th.join()
        waited = time.perf_counter() - t0
        self._staging = None
        job.blocked += waited
        err, self._stage_error = self._stage_error, None
        if err is not None:
            with self._lock:
                self._free.append(job.buf)
                self._inflight -= 1
                if not self._inflight:
                    self.persisting.clear()
                self._error = (job.step, err)
                self._raise_error_locked()
            return waited
        self._enqueue(job, counted=True)
        return waited

    def _enqueue(self, job: _Job, counted: bool = True) -> None:
        with self._lock:
            self._queue.append(job)
            if not counted:
                self._inflight += 1
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, daemon=True, name="frenzy-persist")
                self._worker.start()
            self._lock.notify_all()

    def busy(self) -> bool:
        """True while a save would find no free buffer."""
        with self._lock:
            return bool(self._prep is None and not self._free and self._inflight)

    def _raise_error_locked(self) -> None:
        """A failed persist costs that checkpoint, not the run: it is logged and counted, and the next checkpoint
        tries again (a storage outage longer than the retry budget skips checkpoints instead of killing training)."""
        if self._error is not None:
            (step, err), self._error = self._error, None
            self.failed.append((step, str(err)))
            log.warning("checkpoint of step %d was not committed (%s); the next checkpoint tries again", step, err)

    def _raise_error(self) -> None:
        with self._lock:
            self._raise_error_locked()

    def wait(self) -> None:
        """Wait until every queued persist finished (a failure is logged and recorded in `failed`)."""
        self.barrier()
        with self._lock:
            while self._inflight:
                self._lock.wait(0.1)
            self._raise_error_locked()

    def close(self) -> None:
        """Wait for the queue; raise when the newest save failed (the run's final state was not committed)."""
        self.wait()
        if self.failed and self.failed[-1][0] == self._last_step:
            step, err = self.failed[-1]
            raise CheckpointError(f"the final checkpoint (step {step}) was not committed: {err}")

    # background ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        if self.nice and hasattr(os, "setpriority"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    return
                job = self._queue.pop(0)
            try:
                self._persist(job)
            except BaseException as err:  # noqa: BLE001 - reported by the next save() or wait()
                log.error("persist of step %d failed: %s", job.step, err)
                with self._lock:
                    self._error = (job.step, err)
            finally:
                with self._lock:
                    self._free.append(job.buf)
                    self._inflight -= 1
                    if not self._inflight:
                        self.persisting.clear()
                    self._lock.notify_all()

    def _persist(self, job: _Job) -> None:
        t0 = time.perf_counter()
        step, buf = job.step, job.buf
        d = step_dir(step)
        key = f"{d}/rank{self.rank:05d}.bin"
        n, sha = self.storage.write_stream(key, buf.chunks)
        _fault_delay(step)
        rec = ShardRecord(rank=self.rank, key=key, bytes=n, sha256=sha, tensors=buf.entries, extra=job.extra)
        self.storage.put(f"{d}/rank{self.rank:05d}.json", rec.model_dump_json().encode())
        self.last_persist_s = time.perf_counter() - t0
        if self.rank != 0:
            return
        shards = self._gather_shards(d, rec)
        if self.fence is not None and not self.fence():
            raise CheckpointError(f"step {step} not committed: this trainer no longer holds the writer lease of "
                                  f"{self.storage.uri} (another writer took it over)")
        manifest = Manifest(step=step, run=self.run, created=datetime.now(UTC).isoformat(),
                            world_size=self.world_size, shards=shards, **job.fields)
        try:
            self.storage.create(f"{d}/manifest.json", manifest.model_dump_json(indent=1).encode())
        except AlreadyExists:
            log.warning("step %d was already committed by another writer; keeping that commit", step)
            return
        persist_s = time.perf_counter() - t0
        self.last_persist_s = persist_s
        record = CheckpointRecord(step=step, uri=self.storage.url(d), blocked_s=job.blocked, persist_s=persist_s,
                                  bytes=manifest.total_bytes, deferred_steps=job.deferred)
        self.records.append(record)
        log.info("checkpoint step %d committed: %s (%.1f MB, blocked %.3fs, persist %.1fs)", step,
                 record.uri, record.bytes / 1e6, job.blocked, persist_s)
        apply_retention(self.storage, self.keep)
        if self.on_commit is not None:
            self.on_commit(record, manifest)

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
    """The step's manifest; None when it has none (never committed). A manifest that cannot be parsed, or names
    another step, raises `CheckpointError` naming the file."""
    key = f"{step_dir(step)}/manifest.json"
    try:
        m = Manifest.model_validate(json_loads(storage.read(key), storage.url(key)))
    except FileNotFoundError:
        return None
    except NotAFile as err:
        raise CheckpointError(f"{err}; the step is skipped") from None
    except ValueError as err:  # strict JSON (UserFileError) or pydantic's ValidationError: both ValueErrors
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{storage.url(key)} is not a valid manifest ({first}); the step is skipped") from None
    if m.step != step:
        raise CheckpointError(f"{storage.url(key)} names step {m.step}, not {step}; the step is skipped")
    shard_key = re.compile(re.escape(step_dir(step)) + r"/rank\d{5}\.bin")
    for sh in m.shards:
        if not shard_key.fullmatch(sh.key):  # `../../x`, an absolute path, another step's file: never followed
            raise CheckpointError(f"{storage.url(key)}: shard key {sh.key!r} is not a file of this step "
                                  f"({step_dir(step)}/rankNNNNN.bin); the manifest was altered, the step is skipped")
    return m


def committed(storage: Storage) -> list[Manifest]:
    """Manifests of every committed step, newest first; an unreadable manifest is logged by name and skipped."""
    out = []
    for s in list_steps(storage):
        try:
            m = read_manifest(storage, s)
        except CheckpointError as err:
            log.warning("%s", err)
            continue
        if m is not None:
            out.append(m)
    return out


def read_shard(storage: Storage, shard: ShardRecord) -> dict[str, torch.Tensor]:
    """Read one shard, verifying its size and sha256; raises `CheckpointError` on any mismatch."""
    try:
        size = storage.size(shard.key)
        if size != shard.bytes:  # before allocating what the record claims
            raise EOFError(f"the file is {size:,} bytes; the manifest says {shard.bytes:,} (truncated or extended)")
        flat = torch.empty(shard.bytes, dtype=torch.uint8)
        sha = storage.read_into(shard.key, memoryview(flat.numpy()))
    except (EOFError, FileNotFoundError, NotAFile) as err:
        raise CheckpointError(f"{storage.url(shard.key)}: {err}") from None
    if sha != shard.sha256:
        raise CheckpointError(f"{storage.url(shard.key)}: sha256 {sha[:12]}... does not match the manifest's "
                              f"{shard.sha256[:12]}... (corrupted)")
    out = {}
    for e in shard.tensors:
        try:
            if e.offset < 0 or e.offset + e.nbytes > shard.bytes:
                raise ValueError(f"bytes {e.offset}..{e.offset + e.nbytes} lie outside the shard")
            out[e.name] = flat[e.offset:e.offset + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape)
        except (RuntimeError, ValueError, AttributeError, TypeError) as err:
            raise CheckpointError(f"{storage.url(shard.key)}: tensor {e.name} does not match its record "
                                  f"(dtype {e.dtype}, shape {e.shape}): {err}") from None
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
