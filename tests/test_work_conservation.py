"""Work conservation (issue 26) in the live ledger: random clusters and job streams go through `Ledger.schedule`
and `Ledger.release` with an injected clock, and after every scheduling event the waiting jobs are checked from the
ledger's own tables, independently of cluster/sizing.py's bookkeeping.

A waiting job with a plan that fits the free GPUs now may wait only when it has a faster plan (waiting for it may
finish sooner) or, not being the queue's head, when that plan would still run at the earliest moment the head's
reservation can start (the earliest predicted end of a running allocation)."""

from __future__ import annotations

import random

from cluster.has import FreePool, GpuRequest, NodeInfo
from cluster.inventory import Cluster, Node
from cluster.ledger import Ledger

TYPES = {"RTX-2080Ti": 2.5, "V100-32GB": 1.4, "A100-40GB-SXM": 1.0}  # run-time factor against the A100
LONG_LEASE_S = 1e9  # the test's clock never expires a lease: jobs end by release, as a finished job does


def _cluster(rng: random.Random) -> Cluster:
    types = rng.sample(sorted(TYPES), rng.randint(1, 3))
    return Cluster(name="random", nodes=[Node(name=f"{t}-{k}", gpu=t, count=rng.choice((2, 4, 8)))
                                         for t in types for k in range(rng.randint(1, 2))])


def _requests(rng: random.Random, types: list[str], heavy: bool) -> list[GpuRequest]:
    """Mostly 1-GPU jobs, a few wide; each GPU type a plan (slower on older types), sometimes a 2x-wider plan."""
    base = rng.choice((1, 1, 1, 1, 1, 1, 4, 8))
    run = min(86400.0, 300.0 * rng.paretovariate(1.2)) if heavy else 3600.0
    out = []
    for t in types:
        out.append(GpuRequest(base, 8, 1, frozenset({t}), run_s=run * TYPES[t]))
        if rng.random() < 0.4:
            out.append(GpuRequest(base * 2, 8, 1, frozenset({t}), run_s=run * TYPES[t] * rng.uniform(0.55, 0.9)))
    return out


def _unjustified(ledger: Ledger, reqs: dict[str, list[GpuRequest]], ends: dict[str, float], now: float) -> list[str]:
    """Waiting jobs that leave a plan fitting the free GPUs unused without an excuse (module docstring). `ends`:
    when each running allocation finishes (its chosen plan's run time: this test's jobs run exactly as predicted)."""
    nodes = [n for n in ledger.nodes() if n.state == "up"]
    pool = FreePool([NodeInfo(n.name, n.gpu_type, n.mem_gib, 0.0, n.gpus) for n in nodes],
                    {n.name: len(n.free_indices) for n in nodes})
    first_end = min(ends.values(), default=float("inf"))
    bad = []
    for q in ledger.queue():
        head = ledger.queue_status(q.job).position == 1
        for r in reqs[q.job]:
            if not pool.fits(r) or any(o.run_s < r.run_s for o in reqs[q.job]):  # type: ignore[operator]
                continue
            if not head and now + r.run_s > first_end:  # type: ignore[operator]
                continue
            bad.append(f"{q.job} waits beside free GPUs for {r} at t={now:.0f}")
    return bad


def _run(seed: int, db: str) -> tuple[int, int]:
    """One random stream through the ledger: returns (scheduling events, jobs placed)."""
    rng = random.Random(seed)
    cluster = _cluster(rng)
    types = sorted({n.gpu for n in cluster.nodes})
    gpus = sum(n.count for n in cluster.nodes)
    heavy, load = rng.random() < 0.7, rng.uniform(0.3, 1.2)
    clock = [0.0]
    ledger = Ledger(db, clock=lambda: clock[0])
    ledger.sync(cluster)
    reqs: dict[str, list[GpuRequest]] = {}
    ends: dict[str, float] = {}  # allocation id -> when its job finishes
    events = placed = 0
    for k in range(rng.randint(15, 30)):
        job = f"j{k}"
        reqs[job] = _requests(rng, types, heavy)
        mean_work = reqs[job][0].gpus * (reqs[job][0].run_s or 0.0)
        next_arrival = clock[0] + rng.expovariate(load * gpus / mean_work)
        while ends and min(ends.values()) <= next_arrival:  # finish what ends before the next arrival
            aid = min(ends, key=ends.__getitem__)
            clock[0] = ends.pop(aid)
            new = ledger.release(aid)
            events, placed = events + 1, placed + len(new)
            ends.update({a.id: clock[0] + (reqs[a.job][a.plan_index].run_s or 0.0) for a in new})
            assert not _unjustified(ledger, reqs, ends, clock[0])
        clock[0] = next_arrival
        ledger.submit(job, reqs[job], predicted_s=reqs[job][0].run_s, lease_s=LONG_LEASE_S)
        new = ledger.schedule()
        events, placed = events + 1, placed + len(new)
        ends.update({a.id: clock[0] + (reqs[a.job][a.plan_index].run_s or 0.0) for a in new})
        assert not (bad := _unjustified(ledger, reqs, ends, clock[0])), bad
    assert ledger.idle_violations == 0
    return events, placed


def test_the_ledger_never_leaves_a_job_waiting_beside_gpus_it_could_use(tmp_path):
    """Random clusters (1-3 GPU types), many 1-GPU jobs and a few wide, equal or heavy-tailed run times, offered
    loads 0.3-1.2; after every submit and every release."""
    totals = [_run(seed, str(tmp_path / f"l{seed}.db")) for seed in range(12)]
    assert sum(e for e, _ in totals) > 12 * 15 and all(p > 0 for _, p in totals)
