"""A real multi-node Ray cluster on this machine for tests and benchmarks: a head and named raylets with fake GPU
resources, every address on loopback (set `LOOPBACK_ENV` before `ray` is imported: Ray reads it at import)."""

from __future__ import annotations

import os
from typing import Any

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray addresses on 127.0.0.1, never the host's interface
                "RAY_USAGE_STATS_ENABLED": "0", "GLOO_SOCKET_IFNAME": "lo"}


def node_args(name: str, cpus: int = 2, gpus: int = 1, gpu_type: str = "A100-40GB") -> dict[str, Any]:
    """`Cluster.add_node` arguments of a Frenzy node: its name and GPU type as custom resources."""
    return {"num_cpus": cpus, "num_gpus": gpus, "object_store_memory": 80 << 20,
            "resources": {f"frenzy_node:{name}": 1, f"frenzy_gpu:{gpu_type}": gpus}}


def start_cluster(names: list[str], cpus: int = 2, head_resources: dict[str, float] | None = None):  # noqa: ANN201
    """(the `ray.cluster_utils.Cluster`, {name: node}) with RAY_ADDRESS pointing at it."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20,
                                                      "include_dashboard": False, "resources": head_resources or {}})
    nodes = {n: c.add_node(**node_args(n, cpus)) for n in names}
    c.wait_for_nodes()
    if not c.address.startswith("127.0.0.1:"):
        c.shutdown()
        raise RuntimeError(f"the Ray cluster came up on {c.address}, not loopback: import ray after LOOPBACK_ENV")
    os.environ["RAY_ADDRESS"] = c.address
    return c, nodes
