"""Issue 45, round 14: six families that red-team set 13 showed.

1. The kernel's OOM killer names the cause beneath a wrapper: a data-loader worker or a rank killed by signal 9,
   and the kernel's `Memory cgroup out of memory: Killed process N` (or an older kernel's `Kill process N`).
2. A notebook service that reports the VM's RAM used up, with no exception (Colab, Kaggle): host memory.
3. Storage errno messages quoted cut short (`[Errno 5] Input/output`): still the filesystem.
4. Ray's detail under an ActorDiedError that the actor's (or its owner's) node died: the cause, infrastructure.
5. A log that holds only the C++ frames of the NCCL watchdog (`WorkNCCL::checkTimeout`), no message line.
6. `Default process group has not been initialized`: the run's setup (no launcher, a distributed piece in a
   one-process config), the script's.

Each case is a short synthetic log written here in the format the software prints; the guards keep the shapes
that must not move (a message line over its frames, a Ray actor's death with no node named, a worker killed with
no OOM line).
"""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import diagnose
from tests.diagnosis_kit import assert_diagnosed

SITE = "/opt/conda/lib/python3.11/site-packages"

FAMILIES = {
    "cgroup-oom-under-dataloader": (
        "Epoch 3: 41%|####      | 812/1980 [05:12<07:30, 2.59it/s]\n"
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/torch/utils/data/dataloader.py", line 1133, in _try_get_data\n'
        "    data = self._data_queue.get(timeout=timeout)\n"
        "RuntimeError: DataLoader worker (pid 7311) is killed by signal: Killed.\n"
        "$ dmesg -T | tail -1\n"
        "[Tue Mar  4 10:02:11 2025] Memory cgroup out of memory: Killed process 7311 (python3) total-vm:20480000kB, "
        "anon-rss:9000000kB, file-rss:1000kB, shmem-rss:0kB, UID:1000 pgtables:20000kB oom_score_adj:0\n",
        "HostOOM", "framework", "Memory cgroup out of memory: Killed process 7311"),
    "old-kernel-oom-under-exit-9": (
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 501 closing signal SIGTERM\n"
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 1 (pid: 502)\n"
        "node07 kernel: Out of memory: Kill process 502 (python) score 911 or sacrifice child\n",
        "HostOOM", "framework", "Out of memory: Kill process 502"),
    "colab-ram": (
        "Loading 120000 samples into memory...\n"
        "Your session crashed after using all available RAM. If you are interested in access to high-RAM runtimes, "
        "you may want to check out Colab Pro.\n",
        "HostOOM", "framework", "Your session crashed after using all available RAM"),
    "kaggle-ram": (
        "building features: 63%\n"
        "Your notebook tried to allocate more memory than is available. It has restarted.\n",
        "HostOOM", "framework", "tried to allocate more memory than is available"),
    "eio-cut-short": (
        f'  File "{SITE}/PIL/Image.py", line 3236, in open\n'
        "    fp = builtins.open(filename, \"rb\")\n"
        "OSError: [Errno 5] Input/output\n",
        "StorageError", "infrastructure", "[Errno 5] Input/output"),
    "estale-cut-short": (
        "saving checkpoint to /mnt/nfs/run3/ckpt_4000.pt\n"
        "OSError: [Errno 116] Stale\n",
        "StorageError", "infrastructure", "[Errno 116] Stale"),
    "eremoteio-cut-short": (
        "reading shard 17 of 64\n"
        "OSError: [Errno 121] Remote I/O\n",
        "StorageError", "infrastructure", "[Errno 121] Remote I/O"),
    "ray-actor-node-died": (
        f'  File "{SITE}/ray/_private/worker.py", line 871, in get_objects\n'
        "    raise value\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
        "        class_name: RolloutWorker\n"
        "        actor_id: 9f2c0000aa11\n"
        "The actor died because its node has died. Node Id: 4be1f0c9d2\n",
        "RayError", "infrastructure", "because its node has died"),
    "ray-owner-node-crashed": (
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
        "The actor is dead because its owner has died. Owner Id: 0100ffff Owner Ip address: 10.0.3.4 Owner worker "
        "exit type: SYSTEM_ERROR Worker exit detail: Owner's node has crashed.\n",
        "RayError", "infrastructure", "Owner's node has crashed"),
    "nccl-watchdog-frames-only": (
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f01 in /env/lib/libc10.so)\n"
        "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
        "std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f02 in /env/lib/libtorch_cuda.so)\n"
        "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7f03 in /env/lib/libtorch_cuda.so)\n"
        "frame #3: <unknown function> + 0xdbbf4 (0x7f04 in /lib/libstdc++.so.6)\n",
        "NCCLTimeoutError", "infrastructure", "WorkNCCL::checkTimeout"),
    "no-process-group": (
        "Traceback (most recent call last):\n"
        '  File "train_net.py", line 88, in <module>\n'
        "    model = build_model(cfg)\n"
        f'  File "{SITE}/torch/nn/modules/batchnorm.py", line 770, in forward\n'
        "    process_group = torch.distributed.group.WORLD\n"
        f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 1025, in _get_default_group\n'
        "    raise ValueError(\n"
        "RuntimeError: Default process group has not been initialized, please make sure to call "
        "init_process_group.\n",
        "ConfigError", "script", "Default process group has not been initialized"),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_names_its_cause(name: str) -> None:
    assert_diagnosed(*FAMILIES[name])


def test_host_memory_is_not_restartable_and_a_lost_node_is() -> None:
    assert not diagnose(FAMILIES["colab-ram"][0].encode(), use_fallback=False).restartable
    ray = diagnose(FAMILIES["ray-actor-node-died"][0].encode(), use_fallback=False)
    assert ray.restartable and "node" in ray.mitigation


def test_a_word_after_node_is_not_a_node_name() -> None:
    """`... because its node has died`, `the node is shared`: `has`, `is` are words, not a node's name (a host
    name holds a digit); `node=gpu-12` still names one."""
    d = diagnose(FAMILIES["ray-actor-node-died"][0].encode(), use_fallback=False)
    assert d.node is None
    word = diagnose(b"RuntimeError: CUDA error: unspecified launch failure (the node is shared)\n", use_fallback=False)
    assert (word.type, word.node) == ("CUDAError", None)
    named = diagnose(b"RuntimeError: CUDA error: an illegal memory access was encountered node=gpu-12\n",
                     use_fallback=False)
    assert named.node == "gpu-12"


GUARDS = {
    "message-over-frames": (  # the watchdog's message states the timeout; its frames stay out
        "[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.\n"
        "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
        "std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f02 in /env/lib/libtorch_cuda.so)\n",
        "NCCLTimeoutError", "Watchdog caught collective operation timeout"),
    "ray-actor-no-node-named": (  # the actor died with no node named: the exception is the line
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
        "        class_name: Trainer\n",
        "RayError", "ActorDiedError"),
    "worker-killed-no-oom-line": (  # no kernel line: the worker's death stays the cause
        "RuntimeError: DataLoader worker (pid 7311) is killed by signal: Killed.\n",
        "DataloaderKilled", "DataLoader worker (pid 7311)"),
    "oom-over-node-died": (  # the node died of the host OOM killer: the OOM line ranks above Ray's detail
        "Out of memory: Killed process 811 (raylet) total-vm:1000kB\n"
        "The actor died because its node has died. Node Id: 4be1f0c9d2\n",
        "HostOOM", "Killed process 811"),
}


@pytest.mark.parametrize("name", sorted(GUARDS))
def test_guards_keep_their_answer(name: str) -> None:
    text, type_, root = GUARDS[name]
    d = diagnose(text.encode(), use_fallback=False)
    assert d.type == type_, d.root_cause_line
    assert d.root_cause_line is not None and root in d.root_cause_line
