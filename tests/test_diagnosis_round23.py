"""Issue 45, round 23: the families sets 19 and 20 showed (benchmarks/results/diagnosis_round23.md).

A. The open-file limit in multiprocessing's words: a DataLoader worker's tensor arrives without its file
   descriptor (`received 0 items of ancdata`).
B. XLA's coordination service (JAX, TensorFlow): its agent gives up on a call to the leader (`RegisterTask`,
   `Coordination service agent in error status: DEADLINE_EXCEEDED`), as round 22's barrier deadline.
C. torch's wrapper for a DataLoader worker's exception whose `Original Traceback` is cut off: the data or the
   dataset code; where the traceback is there, its last exception stays the cause.
D. A kernel library's word that its kernel failed on the GPU, cuDNN's as cuBLAS's (`CUDNN_STATUS_EXECUTION_FAILED`).
E. Line choice: c10d's error that no address answered over its warnings for each address it tried; a DataLoader
   worker's SIGBUS whose message wraps after `Bus` over the hint about shared memory on the lines it wraps onto.

Each case is a short synthetic log written here.
"""

from __future__ import annotations

import pytest

from tests.diagnosis_kit import assert_case

HEAD = "epoch 3 | step 410 | loss 1.87 | lr 2e-4\nepoch 3 | step 420 | loss 1.85 | lr 2e-4\n"


def _tb(*frames: tuple[str, int, str, str]) -> str:
    """A traceback's header and frames (file, line, function, statement), the script's loop first."""
    rows = [("fit.py", 51, "<module>", "for x, y in loader:"), *frames]
    return "Traceback (most recent call last):\n" + "".join(
        f'  File "{f}", line {n}, in {fn}\n    {stmt}\n' for f, n, fn, stmt in rows)


_TB = _tb()

# (what the case shows, the log after HEAD, type, category, a piece of the root line, restartable)
CASES = [
    ("a tensor that arrives without its descriptor is the open-file limit",
     _tb(("/usr/lib/python3.10/multiprocessing/reduction.py", 164, "recvfds",
          "raise RuntimeError('received %d items of ancdata' %")) +
     "RuntimeError: received 0 items of ancdata\n",
     "ResourceLimitError", "script", "received 0 items of ancdata", False),
    ("the coordination agent's deadline on registering is a connection never made",
     "W0301 08:00:01.5 client.cc:120] RegisterTask to the leader is taking long, retrying\n"
     "E0301 08:10:01.5 coordination_service_agent.cc:332] Coordination service agent in error status: "
     "DEADLINE_EXCEEDED: Deadline Exceeded\n",
     "ConnectionError", "infrastructure", "agent in error status: DEADLINE_EXCEEDED", True),
    ("a worker's exception with its traceback cut off is the data's or the dataset code's",
     _tb(("/opt/torch/_utils.py", 461, "reraise", "raise exception")) +
     "ValueError: Caught ValueError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n",
     "DataLoaderWorkerError", "script", "Caught ValueError in DataLoader worker process 1", False),
    ("a worker's exception with its traceback keeps the traceback's last exception",
     _TB + "OSError: Caught OSError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
     "  File \"/opt/torch/utils/data/_utils/worker.py\", line 308, in _worker_loop\n"
     "    data = fetcher.fetch(index)\n"
     "FileNotFoundError: [Errno 2] No such file or directory: '/data/train/0042.png'\n",
     "FileNotFoundError", "script", "No such file or directory: '/data/train/0042.png'", False),
    ("cuDNN's kernel failing on the GPU is the GPU fault cuBLAS's is",
     "2025-02-11 09:14:02.1: E tensorflow/stream_executor/dnn.cc:613] CUDNN_STATUS_EXECUTION_FAILED\n"
     "2025-02-11 09:14:02.1: W tensorflow/core/framework/op_kernel.cc:1767] OP_REQUIRES failed\n",
     "CUDAError", "infrastructure", "CUDNN_STATUS_EXECUTION_FAILED", True),
    ("c10d's error after its per-address warnings is the line",
     "[W socket.cpp:601] [c10d] The client socket has failed to connect to [node7]:29500 (errno: 110 - "
     "Connection timed out).\n"
     "[W socket.cpp:601] [c10d] The client socket has failed to connect to [node7]:29500 (errno: 110 - "
     "Connection timed out).\n"
     "[E socket.cpp:657] [c10d] The client socket has failed to connect to any network address of (node7, 29500).\n",
     "NetworkConfigError", "script", "failed to connect to any network address of (node7", False),
    ("a worker's SIGBUS wrapped after Bus is the line, not the hint it wraps onto",
     _TB + "RuntimeError: DataLoader worker (pid 812) is killed by signal: Bus\n"
     "error. It is possible that dataloader's workers are out of shared\n"
     "memory. Please try to raise your shared memory limit.\n",
     "DataloaderKilled", "script", "DataLoader worker (pid 812) is killed by signal: Bus", False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_failure_named_and_line_chosen(case: tuple[str, str, str, str, str, bool]) -> None:
    assert_case(HEAD, case)
