"""Pinning the snapshot buffers without stalling the training thread.

Why the training thread used to wait: a pinned buffer made with `torch.empty(..., pin_memory=True)` is one
`cudaHostAlloc` of the whole size (torch's host allocator rounds it up to a power of two: 16 GiB for a 14.5 GB
state), and the CUDA driver holds a process-wide lock for the whole call while it faults in and locks every page
(12.7 s on the H100 host). The GIL is not the cause (torch's bindings release it around the call); the driver
lock is: the training thread's own CUDA calls that need it (allocations, synchronisation) queue behind it, so
step 2 of a 1.2B-parameter run took 19.4 s with two buffers. PyTorch's own comment on its
`pinned_use_cuda_host_register` option names the same lock.

What is done instead: the buffer is ordinary pageable memory (`torch.empty`, its pages touched by the background
thread, no driver call at all), then registered with `cudaHostRegister` one range at a time (about `PIN_CHUNK`
bytes, whole tensors, page-aligned). Each call holds the driver lock only for its range, so the training thread
waits at most one range's registration at a time instead of the whole buffer's. A buffer is usable before it is
pinned: a copy into a range not yet registered is a pageable copy (slower, still correct), one into a registered
range is a direct DMA. A range is never registered while its buffer is in use (snapshot or persist).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Protocol

import torch

log = logging.getLogger("frenzy.checkpoint")
PAGE = 4096
PIN_CHUNK = 64 << 20
"""Target bytes per registration: the longest the driver lock is held at once (a tensor larger than this is one
range of its own)."""


class Pinner(Protocol):
    """Registers host memory with the accelerator's driver (page-locks it for DMA) and releases it."""

    def register(self, ptr: int, nbytes: int) -> None: ...

    def unregister(self, ptr: int) -> None: ...


class CudaPinner:
    """`cudaHostRegister` / `cudaHostUnregister` through torch's cudart binding (which releases the GIL)."""

    def __init__(self) -> None:
        self.rt = torch.cuda.cudart()

    def register(self, ptr: int, nbytes: int) -> None:
        torch.cuda.check_error(self.rt.cudaHostRegister(ptr, nbytes, 0))

    def unregister(self, ptr: int) -> None:
        torch.cuda.check_error(self.rt.cudaHostUnregister(ptr))


def page_up(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


class PinState:
    """The registration progress of one page-aligned host region split into `ranges` (start, end) byte offsets.

    `lock` is held for the duration of one registration: whoever takes the buffer for a snapshot acquires it once,
    so the snapshot never overlaps a registration. Registered ranges are unregistered when the owner is collected
    (`weakref.finalize`), before its memory is freed."""

    def __init__(self, owner: object, base: int, ranges: list[tuple[int, int]]) -> None:
        self.base, self.ranges = base, ranges
        self.done = 0
        """Ranges registered so far (in order)."""
        self.failed: str | None = None
        self.lock = threading.Lock()
        self._registered: list[int] = []
        self._pinner: Pinner | None = None
        weakref.finalize(owner, _unregister_all, self._registered, self)

    @property
    def complete(self) -> bool:
        return self.done == len(self.ranges)

    @property
    def pending(self) -> bool:
        """More ranges to register (and no registration failed)."""
        return not self.complete and self.failed is None

    def pin_next(self, pinner: Pinner) -> None:
        """Register the next range (the caller holds `lock`). A failure leaves the rest pageable, logged once."""
        start, end = self.ranges[self.done]
        try:
            pinner.register(self.base + start, end - start)
        except Exception as err:  # noqa: BLE001 - the buffer still works unpinned
            self.failed = f"{type(err).__name__}: {err}"
            log.warning("pinning a snapshot buffer failed after %d of %d ranges (%s); the rest stays pageable "
                        "(slower device-to-host copies)", self.done, len(self.ranges), self.failed)
            return
        self._pinner = pinner
        self._registered.append(self.base + start)
        self.done += 1


def _unregister_all(registered: list[int], state: PinState) -> None:
    pinner = state._pinner
    while registered and pinner is not None:
        ptr = registered.pop()
        try:
            pinner.unregister(ptr)
        except Exception as err:  # noqa: BLE001 - at teardown: nothing to do but say so
            log.debug("cudaHostUnregister failed: %s", err)
