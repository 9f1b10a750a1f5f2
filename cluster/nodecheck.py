"""Find faulty and slow nodes with a two-round pairwise collective test (Acme, DLRover).

Round 1 pairs the nodes (0-1, 2-3, ...; with an odd count the last three form one world of three) and runs, in
every group at once, an all-gather and a bandwidth probe (an all-reduce of `probe_mb`). A group that fails or
times out makes all its members suspects; a group slower than `slow_factor` x the median makes its members slow
suspects. Round 2 pairs each suspect with a node that passed round 1: a suspect that fails (or is slow) again is
faulty (or slow); one that passes is cleared (its round-1 partner was the culprit). With no node known good, the
suspects stay `unverified`.

Each probe is a real `torch.distributed` job (gloo over TCP here, NCCL on GPUs) of one process per node. On this
machine every node's process runs locally; on a cluster the same probe runs on the nodes themselves. Fault
injection for drills and tests: `FRENZY_NODECHECK_FAIL=a,b` (those nodes' processes die before the collective),
`FRENZY_NODECHECK_HANG=a` (hangs: the group times out), `FRENZY_NODECHECK_SLOW=a:SECONDS` (delays its collective).
"""

from __future__ import annotations

import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from tasks.errors import FrenzyError


class GroupRun(BaseModel):
    nodes: list[str]
    ok: bool
    seconds: float
    error: str = ""


class NodeCheck(BaseModel):
    """What `frenzy cluster check --json` prints."""

    nodes: list[str]
    faulty: list[str]
    slow: list[str]
    unverified: list[str]
    rounds: list[list[GroupRun]]
    seconds: float
    cordoned: list[str] = []


Probe = Callable[[Sequence[str]], GroupRun]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_WORKER = r"""
import json, os, sys, time
import torch, torch.distributed as dist
cfg = json.loads(sys.argv[1])
node = cfg["node"]
open(cfg["ready"], "w").close()  # started (Python and torch imported): the collective's timeout runs from here
if node in os.environ.get("FRENZY_NODECHECK_FAIL", "").split(","):
    sys.exit("injected failure on " + node)
dev = torch.device("cpu")
if cfg["backend"] == "nccl":
    dev = torch.device("cuda", cfg["rank"] % torch.cuda.device_count())
    torch.cuda.set_device(dev)
dist.init_process_group(cfg["backend"], init_method=f"tcp://{cfg.get('master', '127.0.0.1')}:{cfg['port']}", rank=cfg["rank"],
                        world_size=cfg["world"], timeout=__import__("datetime").timedelta(seconds=cfg["timeout"]))
if node in os.environ.get("FRENZY_NODECHECK_HANG", "").split(","):
    time.sleep(10 ** 6)
slow = dict(x.split(":") for x in os.environ.get("FRENZY_NODECHECK_SLOW", "").split(",") if ":" in x)
t0 = time.perf_counter()
if node in slow:
    time.sleep(float(slow[node]))
out = [torch.zeros(4, device=dev) for _ in range(cfg["world"])]
dist.all_gather(out, torch.full((4,), float(cfg["rank"]), device=dev))
assert [int(t[0]) for t in out] == list(range(cfg["world"])), "all_gather returned wrong data"
x = torch.ones(cfg["probe_mb"] * 262144, device=dev)
dist.all_reduce(x)
assert float(x[0]) == cfg["world"], "all_reduce returned wrong data"
if dev.type == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"node": node, "seconds": time.perf_counter() - t0}), flush=True)
dist.destroy_process_group()
"""


def local_probe(probe_mb: int = 16, timeout_s: float = 30.0, startup_s: float = 300.0,
                backend: str = "gloo") -> Probe:
    """A probe that runs one process per node on this machine (gloo over loopback; `backend="nccl"` puts each
    process on a GPU, round robin). `timeout_s` bounds the collective, counted once every member has started;
    `startup_s` bounds the start (a busy host is slow to start many Python processes, which says nothing about
    the nodes)."""
    if backend not in ("gloo", "nccl"):
        raise FrenzyError(f"backend {backend!r}: choose gloo or nccl")

    def run(group: Sequence[str]) -> GroupRun:
        import tempfile

        port = _free_port()
        marks = Path(tempfile.mkdtemp(prefix="frenzy-nodecheck-"))
        procs = [subprocess.Popen([sys.executable, "-c", _WORKER,
                                   json.dumps({"node": n, "rank": i, "world": len(group), "port": port,
                                               "probe_mb": probe_mb, "timeout": timeout_s, "backend": backend,
                                               "ready": str(marks / f"{i}.ready")})],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i, n in enumerate(group)]
        start_by = time.monotonic() + startup_s
        while (len(list(marks.glob("*.ready"))) < len(group) and time.monotonic() < start_by
               and not any(p.poll() not in (None, 0) for p in procs)):
            time.sleep(0.05)
        shutil.rmtree(marks, ignore_errors=True)
        deadline = time.monotonic() + timeout_s
        # poll: a member that dies fails the group at once (its peers would wait for it until the timeout)
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
        dead = [(n, p) for n, p in zip(group, procs, strict=True) if p.poll() not in (None, 0)]
        hung = [p for p in procs if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                p.kill()
        outs = [p.communicate() for p in procs]
        if dead:
            n, p = dead[0]
            tail = outs[procs.index(p)][1].strip().splitlines()
            return GroupRun(nodes=list(group), ok=False, seconds=timeout_s,
                            error=f"{n}: exit {p.returncode}: {tail[-1] if tail else ''}")
        if hung:
            return GroupRun(nodes=list(group), ok=False, seconds=timeout_s, error=f"timed out after {timeout_s:.0f} s")
        secs = max(json.loads(o.strip().splitlines()[-1])["seconds"] for o, _ in outs)
        return GroupRun(nodes=list(group), ok=True, seconds=secs)

    return run


def _pairs(nodes: Sequence[str]) -> list[list[str]]:
    groups = [list(nodes[i:i + 2]) for i in range(0, len(nodes) - len(nodes) % 2, 2)]
    if len(nodes) % 2:
        if groups:
            groups[-1].append(nodes[-1])  # odd: the last three form one world
        else:
            groups = [list(nodes)]
    return groups


def _run_round(groups: list[list[str]], probe: Probe) -> list[GroupRun]:
    with ThreadPoolExecutor(max(1, len(groups))) as pool:
        return list(pool.map(probe, groups))


@dataclass
class _Verdict:
    suspects: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)


def _judge(runs: list[GroupRun], slow_factor: float) -> _Verdict:
    v = _Verdict()
    good = [r.seconds for r in runs if r.ok]
    med = statistics.median(good) if good else 0.0
    for r in runs:
        if not r.ok:
            v.suspects += r.nodes
        elif med > 0 and r.seconds > slow_factor * med:
            v.slow += r.nodes
    return v


def check_nodes(nodes: Sequence[str], probe: Probe | None = None, slow_factor: float = 2.0) -> NodeCheck:
    """The two-round check of `nodes` (module docstring)."""
    if len(nodes) < 2:
        raise FrenzyError(f"the node check needs at least 2 nodes (got {len(nodes)}): it tests nodes against each other")
    probe = probe or local_probe()
    t0 = time.perf_counter()
    r1 = _run_round(_pairs(nodes), probe)
    v1 = _judge(r1, slow_factor)
    flagged = list(dict.fromkeys(v1.suspects + v1.slow))
    good = [n for n in nodes if n not in flagged]
    faulty: list[str] = []
    slow: list[str] = []
    unverified: list[str] = []
    r2: list[GroupRun] = []
    if flagged:
        if not good:
            unverified = flagged
        else:
            groups = [[s, good[i % len(good)]] for i, s in enumerate(flagged)]
            # a good node paired with several suspects would run concurrent jobs: one batch per reuse of a node
            batches: list[list[list[str]]] = []
            for g in groups:
                for b in batches:
                    if all(g[1] != h[1] for h in b):
                        b.append(g)
                        break
                else:
                    batches.append([g])
            for b in batches:
                r2 += _run_round(b, probe)
            med = statistics.median([r.seconds for r in r1 if r.ok and not set(r.nodes) & set(flagged)] or
                                    [r.seconds for r in r2 if r.ok] or [0.0])
            for g, r in zip([g for b in batches for g in b], r2, strict=True):
                s = g[0]
                if not r.ok:
                    faulty.append(s)
                elif s in v1.slow and med > 0 and r.seconds > slow_factor * med:
                    slow.append(s)
    return NodeCheck(nodes=list(nodes), faulty=faulty, slow=slow, unverified=unverified, rounds=[r1, r2] if r2 else [r1],
                     seconds=time.perf_counter() - t0)


def cordon_faulty(ledger: object, result: NodeCheck) -> list[str]:
    """Cordon the faulty nodes in the ledger, with the reason; returns their names."""
    when = time.strftime("%Y-%m-%d %H:%M")
    for n in result.faulty:
        partners = sorted({m for rnd in result.rounds for r in rnd if n in r.nodes and not r.ok for m in r.nodes} - {n})
        ledger.cordon(n, f"node check {when}: failed its collective in both rounds (with {', '.join(partners)})")  # type: ignore[attr-defined]
    return list(result.faulty)
