"""The lowest Ray layer: joining the cluster and the names of its nodes. Nodes say who they are with custom resources
at `ray start`: `frenzy_node:NAME` names the node (the name HAS and the ledger use), `frenzy_gpu:TYPE` (its GPU
count) its catalog GPU type. The inventory (cluster/inventory.py) and the executors (cluster/ray_exec.py) both stand
on this module, which imports nothing of Frenzy."""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
from typing import Any

from tasks.errors import FrenzyError

_CONNECT_LOCK = threading.Lock()
NODE_PREFIX = "frenzy_node:"
GPU_PREFIX = "frenzy_gpu:"


class RayExecutorError(FrenzyError, RuntimeError):
    """Ray is missing, unreachable, or cannot place what was asked; the message names the fix."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayExecutorError("the Ray executor needs Ray: pip install 'frenzy[ray]' (or ray>=2.40)") from None
    return ray


CONNECT_TIMEOUT_S = float(os.environ.get("FRENZY_RAY_CONNECT_TIMEOUT_S", "30"))


def _fix(addr: str) -> str:
    return (f"start one with `ray start --head` (workers: `ray start --address HEAD:6379`), or point RAY_ADDRESS / "
            f"--executor at a running cluster (tried {addr!r})")


def _reachable(addr: str, timeout_s: float) -> None:
    """Fail at once, naming the fix, when nothing listens at an explicit HOST:PORT (Ray itself retries for ever)."""
    hostport = addr[len("ray://"):] if addr.startswith("ray://") else addr
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        if addr.startswith("ray://"):
            raise RayExecutorError(f"{addr!r} is not a Ray Client address; use ray://HOST:10001")
        return  # `auto`, or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout_s, 10.0)).close()
    except OSError as err:
        raise RayExecutorError(f"cannot reach a Ray cluster at {addr!r}: {err.strerror or err}; {_fix(addr)}") \
            from None


def connect(address: str | None = None, timeout_s: float | None = None) -> Any:
    """Join the Ray cluster at `address` (`ray://HOST:10001` through Ray Client, `HOST:6379`, or `auto`/None: the
    cluster this machine belongs to, or $RAY_ADDRESS) as a driver within `timeout_s` (default
    $FRENZY_RAY_CONNECT_TIMEOUT_S or 30 s); returns the `ray` module. Ray's output stays off the driver's stdout
    (`log_to_driver=False`: the ranks write their own log files)."""
    ray = _ray()
    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    with _CONNECT_LOCK:  # the evaluation's node threads may all ask at once
        if ray.is_initialized():
            return ray
        addr = address or os.environ.get("RAY_ADDRESS") or "auto"
        if addr.startswith("ray://") and importlib.util.find_spec("grpc") is None:
            raise RayExecutorError(f"{addr!r} is a Ray Client address, and Ray Client is not installed: "
                                   "pip install 'ray[client]' (or `pip install -e \".[ray]\"`), or use HOST:6379 "
                                   "from a machine in the cluster")
        _reachable(addr, timeout_s)
        _init_within(ray, addr, timeout_s)
    return ray


def _init_within(ray: Any, addr: str, timeout_s: float) -> None:
    """`ray.init` in a helper thread, waited on for `timeout_s`: Ray's own connection retries are unbounded and
    ignore SIGTERM, while a main thread waiting on a join stays interruptible."""
    outcome: list[BaseException | None] = []

    def init() -> None:
        try:
            ray.init(address=addr, namespace="frenzy", log_to_driver=False, ignore_reinit_error=True,
                     configure_logging=False)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(err)

    th = threading.Thread(target=init, name="frenzy-ray-connect", daemon=True)
    th.start()
    th.join(timeout_s)
    if not outcome:
        raise RayExecutorError(f"no answer from a Ray cluster at {addr!r} within {timeout_s:.0f} s "
                               f"(FRENZY_RAY_CONNECT_TIMEOUT_S); {_fix(addr)}")
    err = outcome[0]
    if isinstance(err, (ConnectionError, RuntimeError, ValueError, TimeoutError)):
        raise RayExecutorError(f"cannot reach a Ray cluster at {addr!r} ({err}); {_fix(addr)}") from None
    if err is not None:
        raise err


def node_name(info: dict[str, Any]) -> str:
    """A Ray node's Frenzy name (the one HAS and the ledger use): its `frenzy_node:` resource, else host and id."""
    return frenzy_name(info) or f"{info.get('NodeManagerHostname', 'node')}-{info['NodeID'][:8]}"


def frenzy_name(info: dict[str, Any]) -> str | None:
    """The node's `frenzy_node:` name, None when it was started without one (nothing can be pinned to it)."""
    for key in info.get("Resources", {}):
        if key.startswith(NODE_PREFIX):
            return key[len(NODE_PREFIX):]
    return None


def node_resource(name: str) -> dict[str, float]:
    """The Ray resource that pins a task or actor to the node named `name` (a sliver of its `frenzy_node:`)."""
    return {f"{NODE_PREFIX}{name}": 0.001}


def alive_nodes(address: str | None = None) -> list[str]:
    """Names of the alive Ray nodes that carry a `frenzy_node:` name (the only ones work can be pinned to), sorted."""
    ray = connect(address)
    return sorted(name for n in ray.nodes() if n.get("Alive") and (name := frenzy_name(n)))
