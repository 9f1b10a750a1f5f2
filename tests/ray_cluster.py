"""A real multi-node Ray cluster on this machine for tests and benchmarks: a head and named raylets with fake GPU
resources, every address on loopback (set `LOOPBACK_ENV` before `ray` is imported: Ray reads it at import)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray addresses on 127.0.0.1, never the host's interface
                "RAY_USAGE_STATS_ENABLED": "0", "GLOO_SOCKET_IFNAME": "lo"}


def node_args(name: str, cpus: int = 2, gpus: int = 1, gpu_type: str = "A100-40GB") -> dict[str, Any]:
    """`Cluster.add_node` arguments of a Frenzy node: its name and GPU type as custom resources."""
    return {"num_cpus": cpus, "num_gpus": gpus, "object_store_memory": 80 << 20,
            "resources": {f"frenzy_node:{name}": 1, f"frenzy_gpu:{gpu_type}": gpus}}


def start_cluster(names: list[str], cpus: int = 2, head_resources: dict[str, float] | None = None,  # noqa: ANN201
                  head_gpus: int = 0):
    """(the `ray.cluster_utils.Cluster`, {name: node}) with RAY_ADDRESS pointing at it."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": head_gpus,
                                                      "object_store_memory": 80 << 20, "include_dashboard": False,
                                                      "resources": head_resources or {}})
    nodes = {n: c.add_node(**node_args(n, cpus)) for n in names}
    c.wait_for_nodes()
    if not c.address.startswith("127.0.0.1:"):
        c.shutdown()
        raise RuntimeError(f"the Ray cluster came up on {c.address}, not loopback: import ray after LOOPBACK_ENV")
    os.environ["RAY_ADDRESS"] = c.address
    return c, nodes


def _children() -> dict[int, list[int]]:
    """{pid: child pids} of every process, from /proc."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(stat.parent.name))
    return kids


def node_pids(node: Any) -> list[int]:
    """The pids of a `Cluster` node: its raylet and everything the raylet started (workers, agents)."""
    from ray._private import ray_constants

    kids, pids = _children(), []
    for info in node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, []):
        todo = [info.process.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo += kids.get(pid, [])
    return pids


def fault(node: Any, sig: int) -> list[int]:
    """A hard fault on `node`, as a datacenter delivers it: `sig` (SIGKILL: the machine is gone, no goodbye;
    SIGSTOP: it hangs, neither answering nor dying) to its raylet and every process under it at once. Returns the
    pids signalled (`revive` needs them for a SIGSTOP)."""
    import signal

    pids = node_pids(node)
    if not pids:
        raise RuntimeError("the node has no raylet process to signal")
    for sig_ in ([signal.SIGSTOP] if sig == signal.SIGKILL else []) + [sig]:  # freeze all first: none reacts
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig_)
    return pids


def replace_node(c: Any, nodes: dict[str, Any], name: str, pids: list[int], cpus: int = 1) -> None:
    """Clear the wreck of a faulted node (SIGKILL what is left, reap it) and start a fresh node of the same name."""
    import signal

    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        c.remove_node(nodes.pop(name), allow_graceful=False)
    nodes[name] = c.add_node(**node_args(name, cpus))
    c.wait_for_nodes()
