"""Issue 45, round 22: the families set 18 showed (benchmarks/results/diagnosis_round22.md).

A. GPU memory exhausted in a CUDA call's code-and-text form (NCCL's `Cuda failure 2 'out of memory'`).
B. Connections that never opened, in other runtimes' words: NCCL's connect retries logged at INFO, the XLA
   coordination service's barrier deadline (JAX, TensorFlow).
C. The run's own statement that it stopped training on a non-finite loss, above its notices of skipped steps.
D. Line choice: an exception class printed alone before its traceback (the traceback's last line states it), an
   exception whose message follows a blank line (Paddle's format), the errno's text beneath a write-failure summary.

Each case is a short synthetic log written here.
"""

from __future__ import annotations

import pytest

from tests.diagnosis_kit import assert_case

HEAD = "step 120 | loss 2.31 | lr 3e-4\nstep 130 | loss 2.29 | lr 3e-4\n"
_SKIPS = "".join(f"[it {i}] non-finite loss, skipping this batch\n" for i in (131, 140, 152))

# (what the case shows, the log after HEAD, type, category, a piece of the root line, restartable)
CASES = [
    ("NCCL's Cuda failure with its code first is GPU memory",
     "gpu17:4411:4490 [3] transport/p2p.cc:204 NCCL WARN Cuda failure 2 'out of memory'\n"
     "[gpu17:4411:0:4411] Caught signal 11 (Segmentation fault: address not mapped to object)\n"
     "Segmentation fault (core dumped)\n", "OutOfMemoryError", "framework", "Cuda failure 2 'out of memory'", True),
    ("another Cuda failure with its code stays a CUDA error",
     "gpu17:4411:4490 [3] enqueue.cc:118 NCCL WARN Cuda failure 700 'an illegal memory access'\n",
     "CUDAError", "infrastructure", "Cuda failure 700", True),
    ("NCCL's connect retries at INFO are a network fault",
     "nodeA:900:950 [1] NCCL INFO Channel 01 : 3[41000] -> 1[41000] [send] via NET/Socket/0\n"
     "nodeA:900:950 [1] NCCL INFO Call to connect returned Connection timed out, retrying\n"
     "nodeA:900:950 [1] NCCL INFO Call to connect returned Connection timed out, retrying\n",
     "NetworkError", "infrastructure", "Call to connect returned Connection timed out", True),
    ("NCCL's other INFO lines stay silent",
     "nodeA:900:950 [1] NCCL INFO Call to connect returned Connection refused, retrying\n"
     "nodeA:900:950 [1] NCCL INFO Connected all rings\n"
     "RuntimeError: shape '[8, 64]' is invalid for input of size 500\n",
     "RuntimeError", "framework", "is invalid for input of size", True),
    ("the coordination service's barrier deadline is a task that never joined",
     "jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: PjRT_Client_Connect. Some tasks did not "
     "reach the barrier: /job:jax_worker/replica:0/task:5\n",
     "ConnectionError", "infrastructure", "DEADLINE_EXCEEDED: Barrier timed out", True),
    ("the stop, value first, outranks the skipped steps", _SKIPS + "[it 153] total loss not finite, terminating training\n",
     "NumericalError", "framework", "terminating training", False),
    ("the stop, value after, outranks the skipped steps",
     _SKIPS + "Stopping training at iteration 153 because the loss value is non-finite\n",
     "NumericalError", "framework", "Stopping training at iteration 153", False),
    ("skipped steps alone are still the divergence", _SKIPS,
     "NumericalError", "framework", "[it 131] non-finite loss", False),
    ("a class printed before its traceback takes the traceback's message",
     "resuming from runs/last.pt\nIndexError\nTraceback (most recent call last):\n"
     '  File "resume.py", line 40, in load\n    start = ckpt["history"][-1]\nIndexError: list index out of range\n',
     "IndexError", "script", "IndexError: list index out of range", False),
    ("a message after a blank line states the exception",
     "E1201 08:00:03.100 5120 op.cc:99] conv2d raises an exception paddle::memory::allocation::BadAlloc, "
     "ResourceExhaustedError: \n\nOut of memory error on GPU 1. Cannot allocate 512.000000MB memory on GPU 1, 10.2GB "
     "memory has been allocated and available memory is only 20.5MB.\n",
     "OutOfMemoryError", "framework", "Out of memory error on GPU 1", True),
    ("the errno's text outranks the write-failure summary",
     "OSError: Can't write data (file write failed: time = Mon Mar  3 10:00:00 2025\n"
     ", filename = '/scratch/ckpt/epoch_12.h5', file descriptor = 7, errno = 28, error message = "
     "'No space left on device', buf = 0x55d0, total write size = 4096)\n",
     "DiskFull", "infrastructure", "'No space left on device'", False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_failure_named_and_line_chosen(case: tuple[str, str, str, str, str, bool]) -> None:
    assert_case(HEAD, case)
