"""Issue 45, round 20: the families set 17 showed (benchmarks/results/diagnosis_round20.md).

A. GPU memory exhausted in other runtimes' words (Paddle's allocator, a native library's failed cudaMalloc, HIP, MPS).
B. Divergence in progress lines the tracker did not read (a non-finite gradient norm, a loss name of several words
   before its separator), a summary writer's NaN warning below the progress line, `NaN loss with/at ...` raised.
C. ROCm's `Memory access fault by GPU node-N`: a GPU fault, above the abort after it.
D. Horovod's shutdown notice: the framework's, below the rank's own exception.
E. Line choice: NCCL's routine `Failed to open libibverbs` warning, the kernel's `Assertion ... failed.` without its
   backticks, a native library's `what():` line naming the CUDA call, wandb's connect timeout, a multiprocessing
   connection reset under the shell's `Killed`.

Each case is a short synthetic log written here.
"""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import diagnose
from tests.diagnosis_kit import assert_diagnosed

HEAD = "rank 0: building the model\nloading data from /data/shards\n"


@pytest.mark.parametrize("line,root", [
    ("Out of memory error on GPU 3. Cannot allocate 1.250000GB memory on GPU 3, 14.1GB memory has been allocated and "
     "available memory is only 96.5MB.", "Out of memory error on GPU 3"),
    ("[10:02:11] src/storage/pooled_storage_manager.h:157: cudaMalloc retry failed: out of memory",
     "cudaMalloc retry failed"),
    ("RuntimeError: HIP error: hipErrorOutOfMemory", "hipErrorOutOfMemory"),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 17.10 GB, other allocations: 880.00 MB, max allowed: "
     "18.13 GB).", "MPS backend out of memory"),
    ("  what():  Error while calling cudaMalloc(&data, new_size*sizeof(float)) in file /src/dlib/cuda/gpu_data.cpp:201."
     " code: 2, reason: out of memory", "Error while calling cudaMalloc"),
])
def test_a_gpu_oom_in_other_runtimes_words(line: str, root: str) -> None:
    d = assert_diagnosed(HEAD + line + "\n", "OutOfMemoryError", "framework", root)
    assert d.restartable is True


def test_a_pinned_host_allocation_stays_host_memory() -> None:
    assert_diagnosed(HEAD + "cudaMallocHost failed: out of memory\n", "HostOOM", "framework", "cudaMallocHost")


def test_b_a_gradient_norm_that_turns_infinite_is_the_divergence() -> None:
    text = HEAD + "".join(f"Epoch {e} | loss=0.{60 - e} | grad={800 + e}.5\n" for e in range(1, 5))
    text += "Epoch 5 | loss=0.55 | grad=inf\nEpoch 6 | loss=nan | grad=nan\n"
    assert_diagnosed(text, "NumericalError", "framework", "Epoch 5 | loss=0.55 | grad=inf")


def test_b_a_loss_named_in_several_words_before_its_colon() -> None:
    text = HEAD + "".join(f"step {s}, D Loss Real :  0.{s}1, lr : 0.0002\n" for s in range(10, 40, 10))
    text += "step 40, D Loss Real :  nan, lr : 0.0002\nstep 50, D Loss Real :  nan, lr : 0.0002\n"
    assert_diagnosed(text, "NumericalError", "framework", "step 40, D Loss Real :  nan")


def test_b_the_progress_line_outranks_the_summary_writers_nan_warning() -> None:
    text = HEAD + "epoch 3 | Depth Loss: 0.2210 (0.2301)\nepoch 4 | Depth Loss: nan (nan)\n"
    text += "WARNING:root:NaN or Inf found in input tensor.\n"
    assert_diagnosed(text, "NumericalError", "framework", "epoch 4 | Depth Loss: nan")


# (what the case shows, the log after HEAD, type, category, a piece of the root line, restartable)
CASES = [
    ("the summary writer's warning alone is still a divergence", "WARNING:root:NaN or Inf found in input tensor.\n",
     "NumericalError", "framework", "NaN or Inf found", False),
    ("a NaN loss raised, glued to a frame's code line, is the divergence",
     'Traceback (most recent call last):\n  File "fit.py", line 80, in <module>\n'
     "    run(cfg)ValueError:  NaN loss at step 1200.\n  File \"/work/proj/losses.py\", line 51, in forward\n"
     '    raise ValueError(f" NaN loss at step {step}.")\n',
     "NumericalError", "framework", "ValueError:  NaN loss at step 1200.", False),
    ("ROCm's memory access fault outranks the abort",
     "Memory access fault by GPU node-2 (Agent handle: 0x55d1c0) on address 0x7f31a000. Reason: Unknown.\n"
     "Aborted (core dumped)\n", "CUDAError", "infrastructure", "Memory access fault by GPU node-2", True),
    ("Horovod's shutdown is the framework's",
     "[1,1]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt "
     "to allreduce after one of the ranks finished execution.\n",
     "HorovodShutdown", "framework", "Horovod has been shut down", False),
    ("the rank's own exception outranks Horovod's shutdown",
     "[1,0]<stderr>:ValueError: the vocabulary file has 3 special tokens, expected 4\n"
     "[1,1]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks.\n",
     "ValueError", "script", "the vocabulary file", False),
    ("libibverbs absent is routine; NCCL's /sys topology warning is the cause",
     "host:11:11 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
     "host:11:40 [0] graph/xml.cc:332 NCCL WARN Could not find real path of /sys/class/pci_bus/0000:07/../../"
     "0000:07:00.0\nRuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, NCCL "
     "version 2.14.3\n", "TopologyError", "script", "Could not find real path of /sys/", False),
    ("the kernel's assertion without backticks is the root",
     "/src/aten/native/cuda/Loss.cu:240: nll_loss_forward_kernel: block: [0,0,0], thread: [7,0,0] "
     "Assertion t >= 0 && t < n_classes failed.\nRuntimeError: CUDA error: device-side assert triggered\n",
     "IndexError", "script", "Assertion t >= 0 && t < n_classes failed.", False),
    ("a native library's what() line names the failed CUDA call",
     "terminate called after throwing an instance of 'dlib::cuda_error'\n"
     "  what():  Error while calling cudaStreamSynchronize(stream) in file /src/dlib/cuda/cuda_dlib.cu:94. "
     "code: 999, reason: unknown error\n",
     "CUDAError", "infrastructure", "Error while calling cudaStreamSynchronize", True),
    ("a tracking client's connect timeout is the host's network access",
     "wandb: Network error (ConnectTimeout), entering retry loop.\n",
     "ServiceUnreachable", "script", "Network error (ConnectTimeout)", False),
    ("a tracking client's read timeout stays transient", "wandb: Network error (ReadTimeout), entering retry loop.\n",
     "NetworkError", "infrastructure", "Network error (ReadTimeout)", True),
]


@pytest.mark.parametrize("what,log,type_,category,root,restartable", CASES, ids=[c[0] for c in CASES])
def test_c_d_e_failure_named_and_line_chosen(what: str, log: str, type_: str, category: str, root: str,
                                             restartable: bool) -> None:
    d = assert_diagnosed(HEAD + log, type_, category, root)
    assert d.restartable is restartable, what


_MP = "/usr/lib/python3.9/multiprocessing"


@pytest.mark.parametrize("last", ["killed", "Killed"])
def test_e_a_multiprocessing_reset_under_the_shells_killed_is_the_kill(last: str) -> None:
    text = (HEAD + "epoch 4: 91%|#########1| 1820/2000\nTraceback (most recent call last):\n"
            f'  File "{_MP}/resource_sharer.py", line 142, in _serve\n    with self._listener.accept() as conn:\n'
            f'  File "{_MP}/connection.py", line 383, in _recv\n    chunk = read(handle, remaining)\n'
            f"ConnectionResetError: [Errno 104] Connection reset by peer\n{last}\n")
    d = assert_diagnosed(text, "Killed", "framework")
    assert d.root_cause_line == last


def test_e_a_reset_in_the_users_own_socket_keeps_the_network_rule() -> None:
    text = (HEAD + 'Traceback (most recent call last):\n  File "/work/proj/serve.py", line 40, in pull\n'
            "    chunk = sock.recv(4096)\nConnectionResetError: [Errno 104] Connection reset by peer\nKilled\n")
    d = diagnose(text.encode(), use_fallback=False)
    assert (d.type, d.category) == ("ConnectionError", "infrastructure"), d.root_cause_line
