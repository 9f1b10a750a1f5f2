"""The lowest Ray layer: joining the cluster and the names of its nodes. Nodes say who they are with custom resources
at `ray start`: `frenzy_node:NAME` names the node (the name HAS and the ledger use), `frenzy_gpu:TYPE` (its GPU
count) its catalog GPU type. The inventory (cluster/inventory.py) and the executors (cluster/ray_exec.py) both stand
on this module, which imports nothing of Frenzy."""

from __future__ import annotations

import os
import threading
from typing import Any

_CONNECT_LOCK = threading.Lock()
NODE_PREFIX = "frenzy_node:"
GPU_PREFIX = "frenzy_gpu:"


class RayExecutorError(RuntimeError):
    """Ray is missing, unreachable, or cannot place what was asked; the message names the fix."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayExecutorError("the Ray executor needs Ray: pip install 'frenzy[ray]' (or ray>=2.40)") from None
    return ray


def connect(address: str | None = None) -> Any:
    """Join the Ray cluster at `address` (`ray://HOST:10001` through Ray Client, `HOST:6379`, or `auto`/None: the
    cluster this machine belongs to, or $RAY_ADDRESS) as a driver; returns the `ray` module."""
    ray = _ray()
    with _CONNECT_LOCK:  # the evaluation's node threads may all ask at once
        if ray.is_initialized():
            return ray
        addr = address or os.environ.get("RAY_ADDRESS") or "auto"
        try:
            ray.init(address=addr, namespace="frenzy", log_to_driver=False, ignore_reinit_error=True,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RayExecutorError(f"cannot reach a Ray cluster at {addr!r} ({err}); start one with `ray start "
                                   "--head` or set RAY_ADDRESS / the executor's address") from None
    return ray


def node_name(info: dict[str, Any]) -> str:
    """A Ray node's Frenzy name (the one HAS and the ledger use): its `frenzy_node:` resource, else host and id."""
    for key in info.get("Resources", {}):
        if key.startswith(NODE_PREFIX):
            return key[len(NODE_PREFIX):]
    return f"{info.get('NodeManagerHostname', 'node')}-{info['NodeID'][:8]}"


def node_resource(name: str) -> dict[str, float]:
    """The Ray resource that pins a task or actor to the node named `name` (a sliver of its `frenzy_node:`)."""
    return {f"{NODE_PREFIX}{name}": 0.001}


def alive_nodes(address: str | None = None) -> list[str]:
    """Names of the alive Ray nodes, sorted."""
    ray = connect(address)
    return sorted(node_name(n) for n in ray.nodes() if n.get("Alive"))
