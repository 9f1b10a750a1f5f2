"""The threaded background writer: `AsyncCheckpointer` snapshots into preallocated CPU buffers, persists in the
background and commits the step.

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
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import torch

from tasks.errors import unfixable_oserror
from tasks.training.checkpoint.manifest import CheckpointError, CheckpointRecord, Manifest, ShardRecord, step_dir
from tasks.training.checkpoint.retention import apply_retention
from tasks.training.checkpoint.snapshot import SnapshotBuffer, persist_threads, snapshot_buffers
from tasks.training.pinning import PIN_CHUNK, CudaPinner, Pinner
from tasks.training.storage import AlreadyExists, Storage

log = logging.getLogger("frenzy.checkpoint")


class _Job:
    __slots__ = ("step", "buf", "fields", "extra", "blocked", "drag", "deferred")

    def __init__(self, step: int, buf: SnapshotBuffer, fields: dict, extra: dict, blocked: float,
                 deferred: int) -> None:
        self.step, self.buf, self.fields, self.extra = step, buf, fields, extra
        self.blocked, self.drag, self.deferred = blocked, 0.0, deferred


class AsyncCheckpointer:
    """Snapshot now, persist in a background thread, commit with a checksummed manifest."""

    def __init__(self, storage: Storage, rank: int, world_size: int, run: str, keep: int = 3,
                 on_commit: Callable[[CheckpointRecord, Manifest], None] | None = None,
                 commit_timeout_s: float = 900.0, nice: int | None = None, buffers: int | None = None,
                 ranks_on_host: int = 1, fence: Callable[[], bool] | None = None, pinner: Pinner | None = None,
                 pin: bool | None = None) -> None:
        """`nice` lowers the persist thread's CPU priority (Linux, per thread); default `$FRENZY_PERSIST_NICE` or 0:
        the trainer leaves a core for it instead (a niced persist on a busy host crawls and holds its buffer).
        `buffers` 1 or 2 fixes the number of snapshot buffers; None decides by host memory (`snapshot_buffers`).
        `fence` (rank 0): asked before each commit; False (the writer lease is lost) leaves the step uncommitted.
        `pin`: register the snapshot buffers for DMA (None: when the tensors are on a GPU), through `pinner`
        (None: `CudaPinner`); pinning runs in the background, range by range (pinning.py)."""
        self.fence = fence
        self.storage, self.rank, self.world_size, self.run = storage, rank, world_size, run
        self.nice = int(os.environ.get("FRENZY_PERSIST_NICE", "0")) if nice is None else nice
        self.keep, self.on_commit, self.commit_timeout_s = keep, on_commit, commit_timeout_s
        self.n_buffers, self.ranks_on_host = buffers, ranks_on_host
        self.pinner, self.pin = pinner, pin
        self.pin_chunk = PIN_CHUNK
        self.threads: int | None = None
        """Threads of a persist (None: `persist_threads`, decided when the buffers are made)."""
        self._bufs: list[SnapshotBuffer] = []
        self._stop_prep = False
        self._jobs: dict[int, _Job] = {}
        self.pin_s: float | None = None
        """Seconds from `prepare` until every buffer was pinned (None: not pinned, or not yet)."""
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
        self.unfixable: tuple[int, OSError] | None = None
        """The first persist that failed on an error no retry can fix (a full disk, a read-only mount): the step and
        the OSError. Every later checkpoint would fail the same way, so the trainer stops on it (`Shutdown`)."""
        self.records: list[CheckpointRecord] = []
        self.persisting = threading.Event()
        self.last_persist_s: float | None = None
        """Seconds the newest completed persist took (the loop uses it to advise on the interval)."""

    # buffers ----------------------------------------------------------------------------------------------
    def _allocate(self, tensors: list[tuple[str, torch.Tensor]], shard_meta: dict | None) -> None:
        """The background thread: make each buffer (pageable, pages touched) and hand it out at once, then pin
        them range by range while they are free. Nothing here waits on the training thread or blocks it for
        longer than one range's registration."""
        t0 = time.perf_counter()
        on_gpu = any(t.device.type == "cuda" for _, t in tensors)
        pin = self.pin if self.pin is not None else on_gpu
        if self.threads is None:
            self.threads = persist_threads(on_gpu, self.ranks_on_host)
        n = self.n_buffers
        while not self._stop_prep and len(self._bufs) < (n or 1):
            buf = SnapshotBuffer(tensors, self.pin_chunk)
            buf.prefault()
            for e in buf.entries:
                if shard_meta and e.name in shard_meta:
                    e.global_shape, e.global_offset = shard_meta[e.name]
            n = n or snapshot_buffers(buf.nbytes, self.ranks_on_host)
            with self._lock:
                self.n_buffers = n
                self._bufs.append(buf)
                self._free.append(buf)
                self._lock.notify_all()
        log.info("checkpoint snapshot: %d buffer(s) of %.1f MB", n, self._bufs[0].nbytes / 1e6)
        if pin and not self._stop_prep:
            self._pin_all(self.pinner or CudaPinner())
            if all(b.pin.complete for b in self._bufs):
                self.pin_s = time.perf_counter() - t0
                log.info("checkpoint snapshot buffers pinned after %.1f s", self.pin_s)

    def _pin_all(self, pinner: Pinner) -> None:
        """Register every buffer's ranges, one at a time, only while that buffer is free."""
        while True:
            with self._lock:
                todo = [b for b in self._bufs if b.pin.pending]
                if not todo or self._stop_prep:
                    return
                free = [b for b in todo if any(b is f for f in self._free)]
                if not free:  # every unpinned buffer is in use: wait for one to come back
                    self._lock.wait(1.0)
                    continue
                buf = free[0]
                buf.pin.lock.acquire()  # a save that takes it now waits for this range, no more
            try:
                buf.pin.pin_next(pinner)
            finally:
                buf.pin.lock.release()

    def prepare(self, tensors: list[tuple[str, torch.Tensor]], shard_meta: dict | None = None) -> None:
        """Make the snapshot buffers in the background (call once the optimizer state exists)."""
        if self._prep is None and not self._bufs:
            self._stop_prep = False
            self._prep = threading.Thread(target=self._allocate, args=(tensors, shard_meta), daemon=True,
                                          name="frenzy-snapshot-alloc")
            self._prep.start()

    def _end_prep(self) -> None:
        """Stop the background allocation and pinning (at most one range's registration to wait for)."""
        if self._prep is not None:
            with self._lock:
                self._stop_prep = True
                self._lock.notify_all()
            self._prep.join()
            self._prep = None
            with self._lock:
                self.n_buffers = len(self._bufs) or self.n_buffers

    def _ready(self, tensors: list[tuple[str, torch.Tensor]], shard_meta: dict | None) -> None:
        with self._lock:
            stale = bool(self._bufs) and not self._bufs[0].matches(tensors)
        if stale:  # the state changed shape: buffers for the new signature
            self._end_prep()
            self.wait()
            with self._lock:
                self._bufs, self._free = [], []
        self.prepare(tensors, shard_meta)

    def _take(self, block: bool) -> SnapshotBuffer | None:
        """A free buffer (the caller holds the lock); None when every buffer is persisting and not `block`. A
        buffer still being made is waited for (the first save after a start); so is the persist with `block`."""
        while not self._free:
            if not block and self._all_persisting():
                return None
            self._lock.wait(0.1)
            self._raise_error_locked()
        # one not being registered right now (no wait), else the most-pinned one (it copies fastest)
        buf = max(self._free, key=lambda b: (not b.pin.lock.locked(), b.pin.done))
        self._free.remove(buf)
        return buf

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
            buf = self._take(block)
            if buf is None:
                return None
            self._last_step = step
            self._inflight += 1
            self.persisting.set()
            job = _Job(step, buf, dict(manifest_fields), dict(extra or {}), 0.0, deferred_steps)
            self._jobs[step] = job
        with buf.pin.lock:  # a registration of this buffer in progress ends first; no other starts while in use
            pass
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
                self._release_locked(job)
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

    def _release_locked(self, job: _Job) -> None:
        """A save's buffer back to the free list (the caller holds the lock); the last one out clears `persisting`."""
        self._free.append(job.buf)
        self._jobs.pop(job.step, None)
        self._inflight -= 1
        if not self._inflight:
            self.persisting.clear()

    def idle(self) -> bool:
        """Nothing staged, queued or persisting."""
        with self._lock:
            return self._staging is None and not self._inflight

    def busy(self) -> bool:
        """True while a save would find no free buffer."""
        with self._lock:
            return self._all_persisting()

    def _all_persisting(self) -> bool:
        """No buffer is free and a persist holds one (the caller holds the lock): a second buffer still being made
        is not waited for either; only the very first save waits for its buffer to exist."""
        return bool(not self._free and self._inflight)

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

    def salvage(self, timeout_s: float) -> list[int]:
        """The run is failing (an exception leaves the loop): persist what is already in memory (a staged copy
        finishes first; its tensors were not updated since), waiting at most `timeout_s`. Returns the steps still
        uncommitted when the time ran out (their snapshots are lost with the process)."""
        with contextlib.suppress(BaseException):
            self.barrier()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._inflight and time.monotonic() < deadline:
                self._lock.wait(0.1)
            return sorted(self._jobs)

    def add_drag(self, step: int, seconds: float) -> None:
        """Charge the save of `step` with `seconds` more that the loop lost to it (measured after the save)."""
        with self._lock:
            job = self._jobs.get(step)
            if job is not None:
                job.drag += seconds
                return
            for rec in self.records:
                if rec.step == step:
                    rec.drag_s += seconds
                    rec.blocked_s += seconds

    def close(self) -> None:
        """Wait for the queue and stop the background pinning; raise when the newest save failed (the run's final
        state was not committed)."""
        self.wait()
        self._end_prep()
        if self.failed and self.failed[-1][0] == self._last_step:
            step, err = self.failed[-1]
            newest = max((r.step for r in self.records), default=None)
            resume = (f"; step {newest} is the newest this run committed (a rerun resumes from it)"
                      if newest is not None else "")
            raise CheckpointError(f"the final checkpoint (step {step}) was not committed: {err}{resume}")

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
                self._discard_partial(job.step)
                with self._lock:
                    self._error = (job.step, err)
                    cause = unfixable_oserror(err)
                    if cause is not None and self.unfixable is None:
                        self.unfixable = (job.step, cause)
            finally:
                with self._lock:
                    self._release_locked(job)
                    self._lock.notify_all()

    def _persist(self, job: _Job) -> None:
        t0 = time.perf_counter()
        step, buf = job.step, job.buf
        d = step_dir(step)
        key = f"{d}/rank{self.rank:05d}.bin"
        n, sha = self.storage.write_stream(key, buf.chunks, threads=self.threads or 1)
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
        with self._lock:  # `add_drag` updates the job until this record exists, the record after
            record = CheckpointRecord(step=step, uri=self.storage.url(d), blocked_s=job.blocked + job.drag,
                                      wait_s=job.blocked, drag_s=job.drag, persist_s=persist_s,
                                      bytes=manifest.total_bytes, deferred_steps=job.deferred)
            self.records.append(record)
            self._jobs.pop(step, None)
        log.info("checkpoint step %d committed: %s (%.1f MB, blocked %.3fs, persist %.1fs)", step,
                 record.uri, record.bytes / 1e6, job.blocked, persist_s)
        apply_retention(self.storage, self.keep)
        if self.on_commit is not None:
            self.on_commit(record, manifest)

    def _discard_partial(self, step: int) -> None:
        """A persist that failed before its commit: remove this rank's part-written shard (a full disk keeps no
        half-file); the step stays `no manifest (never committed)` until retention or a later commit of it."""
        d = step_dir(step)
        with contextlib.suppress(Exception):
            if self.storage.exists(f"{d}/manifest.json"):
                return
            for key in (f"{d}/rank{self.rank:05d}.bin", f"{d}/rank{self.rank:05d}.json"):
                self.storage.delete(key)
            if self.storage.local is not None:
                (self.storage.local / d).rmdir()  # only when no other rank's file is left in it

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
