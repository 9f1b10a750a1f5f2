"""Issue 45, round 24: the families sets 21 and 22 showed (benchmarks/results/diagnosis_round24.md).

A. The shell could not find the program it runs (`command not found`), in English, dash's and a translated
   shell's words, and Windows' cmd.exe's.
B. A runner's in-line report of a step that raised (`Node 'x' failed with error: Y`, `backend failed with error:
   Y`): Y is read first, as the other in-line chain markers.
C. A device lost, in any runtime's enum (Unified Runtime's `UR_RESULT_ERROR_DEVICE_LOST`, Vulkan's).
D. gloo unable to make a transport device for the host (`makeDeviceForHostname(): unsupported gloo device`).
E. XLA's device allocator failing in words without `out of memory` (`Error allocating device buffer`).
G. NCCL's `unhandled cuda error` raised while the process group is set up (an init frame beside it): the machine's
   CUDA set-up; without such a frame it stays the GPU-fault rule's.
F. Line choice: a DataLoader worker's traceback cut at its `raise` statement; a stamped watchdog line over the
   terminate handler's unstamped `what():` copy of it.

Each case is a short synthetic log written here.
"""

from __future__ import annotations

import pytest

from tests.diagnosis_kit import assert_case

HEAD = "epoch 1 | step 200 | loss 2.41 | lr 1e-4\nepoch 1 | step 210 | loss 2.39 | lr 1e-4\n"

_WATCHDOG = ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=8, "
             "NumelOut=8, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.")

# (what the case shows, the log after HEAD, type, category, a piece of the root line, restartable)
CASES = [
    ("bash's command not found is the environment",
     "launch.sh: line 12: deepspeed: command not found\n",
     "CommandNotFound", "script", "deepspeed: command not found", False),
    ("a translated shell's command not found is the same",
     "[INFO] starting 4 ranks\nlaunch.sh: 行 12: torchrun：未找到命令\n",
     "CommandNotFound", "script", "torchrun：未找到命令", False),
    ("dash's terse not found after its line number",
     "sh: 3: accelerate: not found\n",
     "CommandNotFound", "script", "accelerate: not found", False),
    ("cmd.exe's unrecognised command",
     "'torchrun' is not recognized as an internal or external command,\noperable program or batch file.\n",
     "CommandNotFound", "script", "is not recognized as an internal or external command", False),
    ("a pipeline node that failed with an error is read for the error it names",
     "ERROR Node 'train_model: fit([data]) -> [model]' failed with error: Timed out initializing process group "
     "in store based barrier on rank: 3, for key: store_based_barrier_key:1 (world_size=4, worker_count=5, "
     "timeout=0:30:00)\n",
     "RendezvousError", "script", "failed with error: Timed out initializing", False),
    ("a Unified Runtime device lost is a GPU lost",
     "RuntimeError: level_zero backend failed with error: 20 (UR_RESULT_ERROR_DEVICE_LOST)\n",
     "NodeFailure", "infrastructure", "UR_RESULT_ERROR_DEVICE_LOST", True),
    ("Vulkan's device lost is the same",
     "ggml_vulkan: vk::Queue::submit: ErrorDeviceLost (VK_ERROR_DEVICE_LOST)\n",
     "NodeFailure", "infrastructure", "VK_ERROR_DEVICE_LOST", True),
    ("gloo unable to make a device for the host is its set-up",
     "  File \"C:\\\\env\\\\lib\\\\site-packages\\\\torch\\\\distributed\\\\distributed_c10d.py\", line 1580, in "
     "_new_process_group_helper\n    backend_class = ProcessGroupGloo(\n"
     "RuntimeError: makeDeviceForHostname(): unsupported gloo device\n",
     "DistributedInitError", "script", "unsupported gloo device", False),
    ("XLA's device allocator failing is the accelerator's memory",
     "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to "
     "allocate 3.20G. That was not possible. There are 1.75G free.; (0x0x0_HBM0)\n",
     "OutOfMemoryError", "framework", "Error allocating device buffer", True),
    ("NCCL's unhandled CUDA error under the process group's set-up is the machine's CUDA set-up",
     "Traceback (most recent call last):\n  File \"train.py\", line 30, in <module>\n"
     "    dist.init_process_group(backend='nccl')\n"
     "  File \"/opt/torch/distributed/distributed_c10d.py\", line 1151, in init_process_group\n"
     "    default_pg._get_backend(device).eager_connect_single_device(device)\n"
     "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL "
     "version 2.18.1\n",
     "DriverError", "script", "unhandled cuda error, NCCL version 2.18.1", False),
    ("a native stack's init frame below the abort counts the same",
     "terminate called after throwing an instance of 'std::runtime_error'\n  what():  unhandled cuda error\n"
     "*** SIGABRT received by PID 812; stack trace: ***\n    @     0x55d0c1a2 app::ncclCheck()\n"
     "    @     0x55d0c1b9 app::distributedInit()\n    @     0x55d0c0f1 main\n",
     "DriverError", "script", "what():  unhandled cuda error", False),
    ("a worker's traceback cut at its raise statement names the line",
     "Traceback (most recent call last):\n  File \"run.py\", line 40, in <module>\n    for batch in loader:\n"
     "KeyError: Caught KeyError in DataLoader worker process 2.\nOriginal Traceback (most recent call last):\n"
     "  File \"/opt/torch/utils/data/_utils/worker.py\", line 308, in _worker_loop\n"
     "    data = fetcher.fetch(index)\n"
     "  File \"/home/u/proj/data/coco.py\", line 88, in __getitem__\n"
     "    raise KeyError('no annotation for image {}'.format(idx))\n",
     "DataLoaderWorkerError", "script", "raise KeyError('no annotation for image", False),
    ("the earliest stamped watchdog line, not the terminate handler's copy",
     f"[rank0]:[E1101 10:00:05.000000100 ProcessGroupNCCL.cpp:685] [Rank 0] {_WATCHDOG}\n"
     f"[rank1]:[E1101 10:00:05.000000200 ProcessGroupNCCL.cpp:685] [Rank 1] {_WATCHDOG}\n"
     "terminate called after throwing an instance of 'c10::DistBackendError'\n"
     f"  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with "
     f"exception: [Rank 1] {_WATCHDOG}\n",
     "NCCLTimeoutError", "infrastructure", "[rank0]:[E1101 10:00:05.000000100", True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_failure_named_and_line_chosen(case: tuple[str, str, str, str, str, bool]) -> None:
    assert_case(HEAD, case)


def test_unhandled_cuda_error_without_an_init_frame_stays_a_gpu_fault() -> None:
    """Guard: mid-training, with no set-up frame near it, NCCL's unhandled CUDA error keeps the GPU-fault rule."""
    assert_case(HEAD, (
        "no init frame: the GPU-fault rule",
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "  what():  NCCL Error 1: unhandled cuda error\n",
        "CUDAError", "infrastructure", "NCCL Error 1: unhandled cuda error", True))


def test_a_cut_traceback_that_raises_nothing_keeps_the_wrapper() -> None:
    """Guard: a worker traceback cut at torch's own frame (no `raise`) says less than the wrapper line."""
    assert_case(HEAD, (
        "the wrapper stays the line",
        "Traceback (most recent call last):\n  File \"run.py\", line 40, in <module>\n    for batch in loader:\n"
        "KeyError: Caught KeyError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        "  File \"/opt/torch/utils/data/_utils/worker.py\", line 308, in _worker_loop\n"
        "    data = fetcher.fetch(index)\n",
        "DataLoaderWorkerError", "script", "Caught KeyError in DataLoader worker process 0", False))
