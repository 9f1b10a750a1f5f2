"""A labelled corpus of failure logs for testing the diagnosis: realistic, not easy.

Each log is a multi-rank training run as torchrun prints it (`[rankN]:` prefixes, interleaved), with long metric
noise, the framework's start-up chatter (NCCL INFO lines, the benign c10d "socket has failed to connect" warning,
UserWarnings, eval lines that mention "error rate"), then one failure: its root-cause line, in the message format
the real stack prints (PyTorch, CUDA, NVRM Xid lines from dmesg, NCCL, torchrun, botocore, Python), and the
symptoms it causes on the other ranks (NCCL watchdog timeouts, lost connections, tracebacks, torchrun's failure
summary with host and rank). Some logs hold a second, unrelated error line (a retried S3 read, a warning-level
exception) that must not be taken for the root cause. The label is (type, rank, node, the root line's text).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

ROOTS: dict[str, list[str]] = {
    "ECCError": [
        "{host} kernel: NVRM: Xid (PCI:0000:{bus}:00): 48, pid={pid}, name=python, An uncorrectable double bit error "
        "(DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "[rank{r}]: RuntimeError: CUDA error: uncorrectable ECC error encountered"],
    "NVLinkError": [
        "{host} kernel: NVRM: Xid (PCI:0000:{bus}:00): 74, pid={pid}, name=python, NVLink: fatal error detected on "
        "link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"],
    "NodeFailure": [
        "{host} kernel: NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, name=python, GPU has fallen off the bus.",
        "{host} kernel: mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: be00000000800400"],
    "CUDAError": [
        "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "[rank{r}]: RuntimeError: CUDA error: unspecified launch failure"],
    "OutOfMemoryError": [
        "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {r} has a total "
        "capacity of 79.10 GiB of which 1.21 GiB is free. Including non-PyTorch memory, this process has 77.88 GiB "
        "memory in use."],
    "DataloaderKilled": [
        "[rank{r}]: RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Killed. ",
        "[rank{r}]: RuntimeError: DataLoader worker (pid(s) {pid}) exited unexpectedly"],
    "ModelLoadingError": [
        "[rank{r}]: RuntimeError: Error(s) in loading state_dict for GPT:",
        "[rank{r}]: safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"],
    "DatasetLoadingError": [
        "[rank{r}]: datasets.exceptions.DatasetNotFoundError: Dataset 'org/web-corpus' doesn't exist on the Hub",
        "[rank{r}]: pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer. Either the file is corrupted "
        "or this is not a parquet file."],
    "FileNotFoundError": ["[rank{r}]: FileNotFoundError: [Errno 2] No such file or directory: '/data/tokenizer.json'"],
    "ImportError": ["[rank{r}]: ModuleNotFoundError: No module named 'flash_attn'",
                    "[rank{r}]: ImportError: cannot import name 'apply_rotary' from 'model.rope'"],
    "KeyError": ["[rank{r}]: KeyError: 'optimizer'"],
    "TypeError": ["[rank{r}]: TypeError: forward() got an unexpected keyword argument 'attn_mask'"],
    "NameError": ["[rank{r}]: NameError: name 'warmup_steps' is not defined"],
    "SyntaxError": ["[rank{r}]:     SyntaxError: invalid syntax"],
    "ArgumentError": ["[rank{r}]: pretrain.py: error: unrecognized arguments: --lr-warmup-iters 100"],
    "PermissionError": ["[rank{r}]: PermissionError: [Errno 13] Permission denied: '/ckpt/run7/step_00000400'"],
    "IndexError": ["[rank{r}]: IndexError: index 50257 is out of bounds for dimension 0 with size 50257"],
    "CalledProcessError": ["[rank{r}]: subprocess.CalledProcessError: Command '['git', 'rev-parse', 'HEAD']' "
                           "returned non-zero exit status 128."],
    "S3StorageError": [
        "[rank{r}]: botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL: "
        "\"https://s3.us-east-1.amazonaws.com/ckpt/run7/step_00000400/rank{r:05d}.bin\"",
        "[rank{r}]: OSError: [Errno 5] An error occurred (SlowDown) when calling the PutObject operation (reached max "
        "retries: 4): Please reduce your request rate."],
    "NCCLRemoteError": [
        "[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:"
        "275, remote process exited or there was a network error, NCCL version 2.21.5",
        "[rank{r}]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely."],
    "NetworkError": [
        "{host}:{pid}:{pid2} [{r}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got async event : port error",
        "{host}:{pid}:{pid2} [{r}] misc/socket.cc:538 NCCL WARN Net : Connect to 10.1.4.{r}<43521> failed : "
        "Software caused connection abort"],
    "ConnectionError": [
        "[rank{r}]: torch.distributed.DistNetworkError: Connection reset by peer",
        "[rank{r}]: ConnectionError: Tried to send 4 bytes to the TCPStore at 10.1.4.2:29500 and it failed: "
        "Broken pipe"],
    "NCCLTimeoutError": [
        "[rank{r}]:[E{md} {hms}.{us} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) "
        "ran for 600{ms3} milliseconds before timing out."],
    "AssertionError": ["[rank{r}]: AssertionError: expected the flat parameter to be unsharded before the forward "
                       "pass"],  # a library's invariant (a size that does not divide is the config: ConfigError)
    "AttributeError": ["[rank{r}]: AttributeError: 'NoneType' object has no attribute 'shape'"],
    "ValueError": ["[rank{r}]: ValueError: Expected input batch_size (16) to match target batch_size (8)."],
    "RuntimeError": ["[rank{r}]: RuntimeError: DataLoader timed out after 600 seconds"],
}

#: what the failure causes on the other ranks: (other ranks' lines, whether torchrun's summary follows)
_SPREADS_TO_PEERS = {"ECCError", "NVLinkError", "NodeFailure", "CUDAError", "NCCLRemoteError", "NetworkError",
                     "ConnectionError", "NCCLTimeoutError", "OutOfMemoryError", "DataloaderKilled", "RuntimeError"}
_ON_EVERY_RANK = {"ModelLoadingError", "DatasetLoadingError", "FileNotFoundError", "ImportError", "KeyError",
                  "TypeError", "NameError", "SyntaxError", "ArgumentError", "PermissionError", "AttributeError",
                  "ValueError", "AssertionError", "IndexError", "CalledProcessError"}


@dataclass
class Labelled:
    text: str
    type: str
    rank: int
    node: str
    root_line: str


def _noise(rng: random.Random, world: int, step0: int, n: int) -> list[str]:
    out = []
    for i in range(n):
        r = rng.randrange(world)
        s = step0 + i // world
        kind = rng.random()
        if kind < 0.8:
            out.append(f"[rank{r}]: [{s:>6}/100000] loss {rng.uniform(1.8, 3.2):.4f} | lr {rng.uniform(1e-5, 3e-4):.3e} "
                       f"| grad_norm {rng.uniform(0.2, 2.0):.3f} | tokens/s {rng.randint(40000, 60000)} | "
                       f"mem {rng.uniform(40, 70):.2f} GiB")
        elif kind < 0.9:
            out.append(f"[rank{r}]: eval step {s}: heldout loss {rng.uniform(2, 3):.3f}, error rate {rng.random():.3f}")
        elif kind < 0.95:
            out.append(f"[rank{r}]: checkpoint step_{s:08d} committed in {rng.uniform(1, 9):.1f} s (blocked "
                       f"{rng.randint(1, 40)} ms)")
        else:
            out.append(f"[rank{r}]: data loader: shard {rng.randint(0, 999):05d} opened, {rng.randint(1, 9)} workers")
    return out


def _startup(rng: random.Random, world: int, hosts: list[str], per_node: int) -> list[str]:
    out = [f"[W{rng.randint(1000, 1299)} 10:00:0{rng.randint(0, 9)}.{rng.randint(100000, 999999)} socket.cpp:752] "
           "[c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot assign "
           "requested address)."]
    for r in range(world):
        h = hosts[r // per_node]
        out.append(f"{h}:{1000 + r}:{1000 + r} [{r % per_node}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:"
                   f"10.1.4.{r // per_node}<0>")
        out.append(f"{h}:{1000 + r}:{1000 + r} [{r % per_node}] NCCL INFO comm 0x{rng.getrandbits(32):x} rank {r} "
                   f"nRanks {world} - Init COMPLETE")
    out.append("[rank0]: UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed "
               "explicitly; it will default to False in a future release")
    return out


_CLOCK = itertools.count(100000000, 1000)
"""Timestamps rise in the order lines are made, as on a real cluster (the diagnosis orders candidates by time)."""


def _fmt(template: str, rng: random.Random, r: int, host: str) -> str:
    return template.format(r=r, host=host, bus=f"{rng.randint(16, 250):02x}", pid=rng.randint(1000, 99999),
                           pid2=rng.randint(1000, 99999), seq=rng.randint(100, 99999), numel=rng.randint(1, 10 ** 9),
                           md="0301", hms="20:50:36", us=next(_CLOCK) % 900000000 + 100000000, ms3=f"{rng.randint(0, 999):03d}")


def make_log(kind: str, rng: random.Random, noise_lines: int = 400, second_error: bool = False) -> Labelled:
    """One failed run whose root cause is `kind` (a key of `ROOTS`)."""
    nodes = rng.choice([1, 2, 4])
    per_node = rng.choice([2, 4, 8])
    world = nodes * per_node
    hosts = [f"gpu-{rng.choice(['a', 'b', 'c'])}{rng.randint(10, 99)}-{i}" for i in range(nodes)]
    r = rng.randrange(world)
    host = hosts[r // per_node]
    lines = _startup(rng, world, hosts, per_node) + _noise(rng, world, rng.randint(1, 5000), noise_lines)
    if second_error:  # an earlier, unrelated, recovered-from error line of low priority
        lines.append(f"[rank{rng.randrange(world)}]: WARNING retrying read of shard 00042 after timeout (attempt 1/8)")
    templates = ROOTS[kind]
    root = _fmt(rng.choice(templates), rng, r, host)
    if kind in _ON_EVERY_RANK:  # the same deterministic error: every rank prints it; the first is the root
        order = [r] + [x for x in range(world) if x != r]
        for k, x in enumerate(order):
            lines.append(f"[rank{x}]: Traceback (most recent call last):")
            lines.append(f'[rank{x}]:   File "/workspace/pretrain.py", line {rng.randint(20, 900)}, in <module>')
            lines.append(root if k == 0 else _fmt(templates[0], rng, x, hosts[x // per_node]))
    else:
        if not root.startswith(("[rank", host)):
            root = f"[rank{r}]: " + root
        if "Traceback" not in root and root.startswith("[rank"):
            lines.append(f"[rank{r}]: Traceback (most recent call last):")
        lines.append(root)
        if kind in _SPREADS_TO_PEERS and world > 1:
            lines += _noise(rng, world, 6000, rng.randint(0, 20))
            for x in rng.sample([x for x in range(world) if x != r], min(world - 1, rng.randint(1, 6))):
                lines.append(_fmt(ROOTS["NCCLTimeoutError"][0], rng, x, hosts[x // per_node]))
                if kind not in ("NCCLTimeoutError",) and rng.random() < 0.4:
                    lines.append(f"[rank{x}]: torch.distributed.DistNetworkError: Connection reset by peer"
                                 if kind != "ConnectionError" else f"[rank{x}]: UserWarning: collective slow")
    lines.append("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    lines.append("============================================================")
    lines.append("pretrain.py FAILED")
    lines.append("------------------------------------------------------------")
    lines.append("Root Cause (first observed failure):")
    lines.append("[0]:")
    lines.append(f"  time      : 2026-11-2{rng.randint(0, 9)}_0{rng.randint(0, 9)}:{rng.randint(10, 59)}:00")
    lines.append(f"  host      : {host}")
    lines.append(f"  rank      : {r} (local_rank: {r % per_node})")
    lines.append(f"  exitcode  : 1 (pid: {rng.randint(1000, 99999)})")
    lines.append("  error_file: <N/A>")
    return Labelled("\n".join(lines) + "\n", kind, r, host, root.strip())


def corpus(per_class: int = 20, seed: int = 0, noise_lines: int = 400) -> list[Labelled]:
    rng = random.Random(seed)
    return [make_log(k, rng, noise_lines, second_error=i % 3 == 0) for k in ROOTS for i in range(per_class)]
