"""The snapshot to CPU memory: one flat, preallocated byte buffer per copy of the training state, and how many
such buffers this host can afford (`snapshot_buffers`)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from tasks.training.checkpoint.manifest import TensorEntry
from tasks.training.pinning import PAGE, PIN_CHUNK, PinState, page_up

_ALIGN = 64


class SnapshotBuffer:
    """One flat, preallocated CPU byte buffer with a typed view per tensor. Its alignment padding is zeroed, so it
    is the same in every checkpoint (no heap bytes in files; identical runs give identical checksums).

    The memory is pageable when made; `pin` (a `PinState`) registers it for DMA range by range afterwards
    (pinning.py). The layout starts a new page-aligned range after every `PIN_CHUNK` bytes of whole tensors, the
    same with or without pinning, so a copy into one tensor never spans two registrations."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]], chunk: int = PIN_CHUNK) -> None:
        self.signature = [(n, t.dtype, tuple(t.shape)) for n, t in tensors]
        self.entries: list[TensorEntry] = []
        ranges: list[tuple[int, int]] = []
        off = start = 0
        for name, t in tensors:
            if off - start >= chunk:
                off = page_up(off)
                ranges.append((start, off))
                start = off
            nbytes = t.numel() * t.element_size()
            self.entries.append(TensorEntry(name=name, dtype=str(t.dtype).removeprefix("torch."),
                                            shape=list(t.shape), offset=off, nbytes=nbytes))
            off += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        self.nbytes = off
        if off > start:
            ranges.append((start, page_up(off)))
        # page-aligned start, whole pages: ranges can be registered without sharing a page
        self._raw = torch.empty(page_up(off) + PAGE, dtype=torch.uint8)
        shift = -self._raw.data_ptr() % PAGE
        self._region = self._raw[shift:shift + page_up(off)]
        self.flat = self._region[:off]
        # only the padding needs zeroing (the tensors overwrite the rest): zero-filling the whole buffer would
        # touch every page now, competing with the training steps for memory bandwidth
        ends = [e.offset for e in self.entries[1:]] + [off]
        for e, nxt in zip(self.entries, ends, strict=True):
            if nxt > e.offset + e.nbytes:
                self.flat[e.offset + e.nbytes:nxt].zero_()
        self.views = [self.flat[e.offset:e.offset + e.nbytes].view(t.dtype).view(t.shape) for e, (_, t) in
                      zip(self.entries, tensors, strict=True)]
        self.pin = PinState(self, self._region.data_ptr(), ranges)

    def prefault(self, page: int = PAGE) -> None:
        """Touch every page now (one byte each), so neither the first snapshot nor the registration faults them
        in: a fault per 4 KiB cost 2.2-2.7 s per GB on the benchmark machine's first copy, and inside
        `cudaHostRegister` it would lengthen the driver lock. Done by the background allocation."""
        if self._region.numel():
            self._region[::page].zero_()

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


def persist_threads(on_gpu: bool, ranks_on_host: int = 1, cores: int | None = None) -> int:
    """How many threads one rank's persist uses (storage.py `write_stream`: 1 writes then hashes each chunk, 2 hash
    beside the write, more write byte ranges at once). `FRENZY_PERSIST_THREADS=N` decides. A CPU job gets 1: its
    ranks' torch threads take all but the one core the launcher leaves (launch.py `default_threads`), and a second
    persist thread took its time from the steps (benchmarks/results/checkpoint_persist.md). A GPU job, whose torch
    threads mostly wait on the device, gets 2 when its rank's share of the cores leaves one beside its loop: more
    writers of one file mostly queue on the kernel's per-file write lock (buffered writes), so they are opt-in.
    `cores`: the cores this process may use (None: its affinity)."""
    forced = os.environ.get("FRENZY_PERSIST_THREADS")
    if forced:
        return max(1, int(forced))
    if not on_gpu:
        return 1
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 2 if cores // max(1, ranks_on_host) >= 3 else 1
