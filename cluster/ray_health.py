"""Is a Ray node alive? Asked as an operator would after a rank was lost, without trusting a single source.

Ray declares a node dead only after its health check gives up (about 15-30 s with Ray's defaults), and a node whose
raylet hangs (SIGSTOP, a swapped-out kernel, a partition) keeps looking alive until then. So a suspect node is probed
three ways at once, and the first answer wins:

- Ray's verdict (`ray.nodes()`: `Alive` false), polled;
- its raylet's port: a refused connection means nothing listens there any more (the raylet died hard);
- a zero-CPU Ray task pinned to the node by its `frenzy_node:` resource: an answer proves the node runs work.

A node that gives none of these answers within `probe_s` is `unreachable`: a failure, not a pass. The ledger marks
dead nodes `down` (they come back `up` when Ray sees them alive again) and cordons unreachable ones (a hung node needs
a person or the node check before it gets work again).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from cluster.ray_nodes import connect, frenzy_name, node_resource

Verdict = Literal["alive", "dead", "unreachable"]
log = logging.getLogger(__name__)


class NodeVerdict(BaseModel):
    """One suspect node: what it is and how that was found out."""

    node: str
    verdict: Verdict
    how: str
    """`ray` (Ray's health check declared it dead), `port` (its raylet refused a connection), `task` (a pinned task
    answered), `gone` (no alive Ray node has that name: dead before the check, or never there), or `timeout`."""
    seconds: float
    ray_id: str = ""
    """The first 8 hex digits of the Ray node id it had, when Ray still listed it alive (a node that rejoins gets a new
    one)."""


def _raylet_refuses(info: dict[str, Any]) -> bool:
    """True when nothing listens on the node's raylet port any more (a hard death); a hung raylet still accepts."""
    host, port = info.get("NodeManagerAddress"), info.get("NodeManagerPort")
    if not host or not port:
        return False
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    except OSError:  # a timeout or an unreachable route says nothing for sure
        return False
    return False


def _alive(ray: Any) -> dict[str, dict[str, Any]]:
    """{frenzy name: entry} of the alive nodes. Ray lists a dead node with no resources, so without its name: a name
    that is not here any more is a node Ray declared dead."""
    return {name: info for info in ray.nodes() if info.get("Alive") and (name := frenzy_name(info))}


def node_verdicts(nodes: Sequence[str], address: str | None = None, probe_s: float = 20.0,
                  poll_s: float = 0.25) -> dict[str, NodeVerdict]:
    """Each of `nodes`: alive, dead or unreachable, within `probe_s` (see the module docstring)."""
    ray = connect(address)

    @ray.remote(num_cpus=0, max_retries=0)
    def here() -> bool:
        return True

    t0 = time.monotonic()
    out: dict[str, NodeVerdict] = {}

    known = _alive(ray)
    ids = {n: known[n]["NodeID"][:8] for n in nodes if n in known}

    def settle(n: str, verdict: Verdict, how: str) -> None:
        out[n] = NodeVerdict(node=n, verdict=verdict, how=how, seconds=round(time.monotonic() - t0, 2),
                             ray_id=ids.get(n, ""))

    for n in nodes:
        if n not in known:
            settle(n, "dead", "gone")
    refs = {here.options(resources=node_resource(n)).remote(): n for n in nodes if n not in out}
    try:
        while len(out) < len(nodes) and time.monotonic() - t0 < probe_s:
            done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=poll_s) if refs else ([], [])
            for ref in done:
                with contextlib.suppress(Exception):  # a task that failed proves nothing; the other probes decide
                    if ray.get(ref) and refs[ref] not in out:
                        settle(refs[ref], "alive", "task")
                refs.pop(ref)
            known = _alive(ray)
            for n in nodes:
                if n in out:
                    continue
                if n not in known:
                    settle(n, "dead", "ray")
                elif _raylet_refuses(known[n]):
                    settle(n, "dead", "port")
            if not refs and len(out) < len(nodes):
                time.sleep(poll_s)  # only Ray's verdict is left to wait for
    finally:
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
    for n in nodes:
        if n not in out:
            settle(n, "unreachable", "timeout")
    return {n: out[n] for n in nodes}


def sync_ledger(ledger: Any, address: str | None = None) -> list[str]:
    """Bring the ledger's node states in line with Ray's (nodes not alive in Ray `down`, rejoined ones `up`); the
    changed nodes. Run before every placement, so nothing is placed on a node Ray already knows is gone."""
    when = time.strftime("%Y-%m-%d %H:%M")
    ray = connect(address)
    alive = {name: info["NodeID"][:8] for name, info in _alive(ray).items()}
    # Every ledger node counts: with the Ray executor, a node that is not an alive named Ray node can run nothing.
    # A node found dead by a direct probe before Ray's health check caught up is still listed alive under the id it
    # died with (kept in its reason): it stays down until Ray lists that name under a new id (the node rejoined).
    states = {n.name: n.name in alive and not (n.state == "down" and f"Ray node {alive[n.name]}" in n.reason)
              for n in ledger.nodes()}
    changed = ledger.set_liveness(states, f"not alive in Ray at {when} (its raylet is gone or was never started)")
    for n in changed:
        log.warning("ledger: Ray node %s is now %s", n, next(x.state for x in ledger.nodes() if x.name == n))
    return changed


def settle_suspects(ledger: Any, nodes: Sequence[str], address: str | None = None, probe_s: float = 20.0
                    ) -> tuple[list[str], dict[str, NodeVerdict]]:
    """The allocation's nodes after a lost rank: dead ones marked `down`, unreachable ones cordoned; returns the
    alive nodes and every verdict."""
    verdicts = node_verdicts(nodes, address, probe_s)
    when = time.strftime("%Y-%m-%d %H:%M")
    for n, v in verdicts.items():
        if v.verdict == "dead":  # one at a time: the reason names the Ray node id it died with (see sync_ledger)
            ledger.set_liveness({n: False}, f"dead at {when}: lost during training ({v.how}"
                                            f"{f'; Ray node {v.ray_id}' if v.ray_id else ''})")
    for n, v in verdicts.items():
        if v.verdict == "unreachable":
            ledger.cordon(n, f"unreachable at {when}: no answer within {probe_s:.0f} s (hung raylet or partition); "
                             "`frenzy cluster uncordon` once it is healthy")
        if v.verdict != "alive":
            log.warning("node %s is %s (%s, %.1f s)", n, v.verdict, v.how, v.seconds)
    return [n for n, v in verdicts.items() if v.verdict == "alive"], verdicts


def check_ray_nodes(names: Sequence[str], address: str | None = None, *, timeout_s: float = 30.0,
                    backend: str = "gloo", probe_s: float = 20.0) -> tuple[Any, dict[str, NodeVerdict]]:
    """`frenzy cluster check --executor ray`: every node asked whether it is alive first; dead and unreachable ones
    are faulty outright (a pair test with them would only make their partner look bad), the rest run the two-round
    collective test on their own nodes. Returns the NodeCheck and the verdicts."""
    from cluster.nodecheck import NodeCheck, check_nodes
    from cluster.ray_exec import ray_probe

    t0 = time.monotonic()
    verdicts = node_verdicts(names, address, probe_s)
    gone = [n for n in names if verdicts[n].verdict != "alive"]
    alive = [n for n in names if n not in gone]
    if len(alive) >= 2:
        res = check_nodes(alive, probe=ray_probe(timeout_s=timeout_s, backend=backend, address=address))
    else:  # one node cannot be tested against another: it stays unverified
        res = NodeCheck(nodes=alive, faulty=[], slow=[], unverified=alive, rounds=[], seconds=0.0)
    res.nodes, res.faulty = list(names), gone + res.faulty
    res.seconds = time.monotonic() - t0
    return res, verdicts


def cordon_gone(ledger: Any, verdicts: dict[str, NodeVerdict]) -> list[str]:
    """Cordon the nodes a check found dead or unreachable, with how that was found; returns their names."""
    when = time.strftime("%Y-%m-%d %H:%M")
    gone = [v for v in verdicts.values() if v.verdict != "alive"]
    for v in gone:
        ledger.cordon(v.node, f"node check {when}: {v.verdict} ({v.how} after {v.seconds:.1f} s)")
    return [v.node for v in gone]
