"""The placement benchmark's computation (benchmarks/placement_load.py runs it; benchmarks/placement_report.py writes
its report): the trace families and their windows, every policy at every load, the bounds, the decision latency.
No prose here: every function returns numbers."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cluster.has import FreePool
from cluster.inventory import Cluster, load_cluster
from cluster.queue import Running, Waiting, ordered, walk
from cluster.simulator import SimConfig, Simulator, _srpt_flow, lower_bounds, simulate
from cluster.sizing import Sizer
from cluster.synth_traces import mixed, production
from cluster.traces import TraceJob, at_load, load_trace, new_workload, read_philly

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
LOADS = (0.5, 0.7, 0.9, 1.1)
POLICIES = ("has", "fcfs", "fifo", "ilp")
WINDOW_JOBS = 450
"""Jobs read per Philly window, before the jobs the cluster can never hold are dropped (at least 400 stay)."""
PHILLY_STARTS = ("2017-10-09 06:00:00", "2017-10-30 06:00:00", "2017-11-20 06:00:00", "2017-12-11 06:00:00")
TUNING_SEEDS = (0, 1, 2)


@dataclasses.dataclass
class Family:
    name: str
    operator: str
    role: str
    """`held-out` or `tuning` (chosen by operator, module docstring of benchmarks/placement_load.py)."""
    cluster: str
    windows: list[list[TraceJob]]
    dropped: list[int]
    """Per window, the jobs dropped because no policy can run them on the cluster (too wide for what holds them)."""
    real: bool = True
    """A real trace (the issue's figures apply) or a generated family (tuning only)."""
    labels: str = "abcd"
    """Each window's name (the real windows' files end in it)."""


def runnable(cluster: Cluster, trace: Sequence[TraceJob]) -> tuple[list[TraceJob], int]:
    """The jobs every policy can run on `cluster` (none unschedulable at arrival), and how many others there were."""
    bad: set[int] = set()
    for pol in POLICIES:
        sim = Simulator(cluster, trace, pol)  # type: ignore[arg-type]
        bad |= {i for i, j in enumerate(sim.jobs) if j.unschedulable or sim.policy.never_runs(sim, i)}
    return [t for i, t in enumerate(trace) if i not in bad], len(bad)


def _real(name: str, operator: str, role: str, traces: list[list[TraceJob]], cluster: str, labels: str = "abcd"
          ) -> Family:
    c = load_cluster(cluster)
    kept = [runnable(c, t) for t in traces]
    return Family(name, operator, role, cluster, [k for k, _ in kept], [d for _, d in kept], labels=labels)


def _generated(name: str, operator: str, traces: list[list[TraceJob]], cluster: str = "phoebe") -> Family:
    return Family(name, operator, "tuning", cluster, traces, [0] * len(traces), real=False)


def families(quick: bool = False) -> list[Family]:
    """Held-out operators first (benchmarks/placement_load.py's docstring says which and why)."""
    real = TRACES / "real"
    n = 1 if quick else 3
    held = "a" if quick else "abcd"
    out = [_real("alibaba-openb", "Alibaba", "held-out",
                 [load_trace(real / f"openb-window-{w}.csv") for w in held], "phoebe-x4", held),
           _real("helios-venus", "SenseTime", "held-out",
                 [load_trace(real / f"helios-venus-window-{w}.csv") for w in held], "phoebe-x4", held),
           _real("philly", "Microsoft", "tuning",
                 [read_philly(TRACES / "philly.csv", max_jobs=WINDOW_JOBS, start=s) for s in PHILLY_STARTS[:n + 1]],
                 "phoebe-x4")]
    sia = sorted((TRACES / "sia-workloads" / "philly").glob("workload-*.csv"), key=lambda p: int(p.stem.split("-")[1]))
    seeds = TUNING_SEEDS[:n]
    out += [_generated("sia-philly", "Microsoft (Sia's samples, elastic)", [load_trace(p, "sia") for p in sia[:n]]),
            _generated("newworkload", "Frenzy paper (elastic)",
                       [new_workload(60, seed=s, mean_interarrival_s=120.0) for s in seeds]),
            _generated("production", "generated (issue-26 shape)", [production(400, s) for s in seeds]),
            _generated("mixed", "generated", [mixed(200, s) for s in seeds])]
    return out


def run_window(cluster: Cluster, trace: list[TraceJob], load: float, policies: Sequence[str]) -> dict[str, Any]:
    """Every policy on one window at `load`: each policy's summary, and the window's bounds."""
    t2 = at_load(trace, sum(n.count for n in cluster.nodes), load)
    out: dict[str, Any] = {"jobs": len(t2)}
    for p in policies:
        out[p] = simulate(cluster, t2, p).summary().to_json()  # type: ignore[arg-type]
    rb, demand = rate_bound(cluster, t2)
    out["lower_bound_avg_jct_s"] = max(lower_bounds(cluster, t2).avg_jct_s, rb)
    out["demand_over_capacity"] = demand
    return out


def row_for(fam: Family, load: float, policies: Sequence[str],
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One family at one load: every window's runs (the report takes medians and ranges over them)."""
    c = load_cluster(fam.cluster)
    runs = []
    for k, tr in enumerate(fam.windows):
        t0 = time.time()
        runs.append(run_window(c, tr, load, policies))
        if progress:
            progress(f"{fam.name} window {k + 1}/{len(fam.windows)} load {load}: {time.time() - t0:.0f} s")
    return {"family": fam.name, "operator": fam.operator, "role": fam.role, "real": fam.real, "cluster": fam.cluster,
            "load": load, "windows": runs, "dropped": fam.dropped, "labels": fam.labels[:len(runs)]}


def _options(sim: Simulator, i: int) -> list[tuple[str, int, float]]:
    """Every way job `i` can run: (GPU type, GPUs, run seconds) over what has may run it on and its user's own
    request (fcfs)."""
    j = sim.jobs[i]
    o = sim.policy.options(sim, i)  # type: ignore[union-attr]
    opts = [(next(iter(r.types or ())), r.gpus, r.run_s or math.inf) for r in (o.requests if o else [])]
    for t in sim.perf.types:
        node = max((n for n, x in sim.perf.node.items() if x.gpu_type == t), key=lambda n: sim.perf.node[n].capacity)
        if j.num_gpus <= sim.perf.node[node].capacity and sim.perf.mem_gib(t) >= j.min_mem:
            dur, lay, _ = sim.perf.run_time(j, [(node, j.num_gpus)], None)
            if lay is not None:
                opts.append((t, j.num_gpus, dur))
    return [x for x in opts if math.isfinite(x[2])]


def rate_bound(c: Cluster, trace: list[TraceJob]) -> tuple[float, float]:
    """A lower bound on average JCT that keeps the cluster's heterogeneity: each job's work is its fewest GPU-seconds
    over what it can run on, and the cluster is one machine whose rate is, per type, its GPUs x the best fraction of a
    job's fewest GPU-seconds any job gets per GPU-second there; preemptive SRPT on that machine, or the mean fastest
    run time, whichever is larger. With the demand over capacity: the work asked for per second of the arrival span
    over that rate (above 1 the queue grows for the whole window under any policy)."""
    sim = Simulator(c, trace, "has")
    best: dict[str, float] = {}
    work, rel, fastest = [], [], []
    for i, j in enumerate(sim.jobs):
        w: dict[str, float] = {}
        opts = _options(sim, i)
        for t, k, d in opts:
            w[t] = min(w.get(t, math.inf), k * d)
        if not w:
            continue
        u = min(w.values())
        for t, x in w.items():
            best[t] = max(best.get(t, 0.0), u / x)
        work.append(u)
        rel.append(j.trace.submit_s)
        fastest.append(min(d for _, _, d in opts))
    if not work:
        return 0.0, 0.0
    rate = sum(sim.perf.total[t] * f for t, f in best.items())
    span = max(rel) - min(rel)
    demand = sum(work) / span / rate if span > 0 and rate > 0 else math.inf
    return max(statistics.mean(fastest), _srpt_flow(rel, work, rate) / len(work)), demand


def latency(gpus: int, queue: int, elastic: bool) -> dict[str, Any]:
    """Decision latency of the default (one `Sizer.pick` per queued job, in one pass) and of fcfs (one placement per
    job) at `gpus` GPUs: half the GPUs busy in random per-node amounts with random predicted ends; `elastic`: the
    production-shaped queue with every job elastic (MARP's plans), else rigid (its count on each type). A round is
    one pass over the whole queue (`has`: the walk with every decision; fcfs: its placements), timed per pass."""
    from scheduling import scaled_cluster

    c = scaled_cluster(gpus)
    sim = Simulator(c, production(queue, seed=7), "has", SimConfig(elastic="all" if elastic else "none"))
    rng = random.Random(0)
    busy = [(name, rng.randint(0, k)) for name, k in sim.pool.free.items()]
    running = [Running(end_s=rng.uniform(60, 36000), nodes=((n, k),)) for n, k in busy if k]
    opts = [sim.policy.options(sim, i) for i in range(queue)]  # type: ignore[union-attr]
    waiting = [Waiting(job=i, seq=i, submitted_s=0.0, predicted_s=o.predicted_s if o else None)
               for i, o in enumerate(opts)]
    reqs = {w.job: o.requests for w, o in zip(waiting, opts, strict=True) if o is not None}
    has: list[list[float]] = []
    rounds: list[float] = []  # one pass over the whole queue (every decision plus the walk's own work), ms
    load0 = os.getloadavg()[0]
    gc.collect()
    gc.disable()  # as timeit does: a collection pause is the interpreter's, not the decision's
    for _ in range(3):
        pool = FreePool(sim.perf.node.values(), dict(sim.pool.free))
        pool.take(busy)
        sizer = Sizer(pool, running, 0.0, ordered(waiting, "shortest", 0.0), reqs)

        def place(w: Waiting, admit: Callable, s: Sizer = sizer, p: FreePool = pool) -> bool:
            got = s.pick(w, admit)
            if got is not None:
                p.take(got[0].nodes)
            return got is not None

        t0 = time.perf_counter()
        walk(waiting, "shortest", 0.0, place, reserve_for=sizer.reserve_for)
        rounds.append((time.perf_counter() - t0) * 1e3)
        has.append(sizer.decision_ms)
    gc.enable()
    fcfs = _fcfs_latency(sim, busy, queue)
    return {"has_round_ms": rounds, "fcfs_round_ms": [sum(p) for p in fcfs],
            "gpus": sum(n.count for n in c.nodes), "queue": queue, "elastic": elastic,
            "loadavg_1min": [load0, os.getloadavg()[0]], **_pcts("has", has), **_pcts("fcfs", fcfs)}


def _fcfs_latency(sim: Simulator, busy: list[tuple[str, int]], queue: int) -> list[list[float]]:
    from cluster.policies import Fcfs

    sim.pool = FreePool(sim.perf.node.values(), dict(sim.pool.free))
    sim.pool.take(busy)
    out = []
    for _ in range(3):
        out.append([])
        for i in range(queue):
            t0 = time.perf_counter()
            Fcfs.place(sim, i)
            out[-1].append((time.perf_counter() - t0) * 1e3)
    return out


def _pcts(name: str, passes: list[list[float]]) -> dict[str, float]:
    """Percentiles over every timed decision of the passes, and over each decision's fastest of the passes (they make
    the same decisions from the same state: the fastest is the decision's own cost, as timeit reports, the rest is
    the machine's other work preempting it)."""
    if len({len(p) for p in passes}) != 1:
        raise ValueError("the passes made different numbers of decisions")
    xs, best = sorted(x for p in passes for x in p), sorted(min(t) for t in zip(*passes, strict=True))
    return {f"{name}_decisions": len(xs), f"{name}_p50_ms": xs[len(xs) // 2], f"{name}_p99_ms": xs[int(len(xs) * 0.99)],
            f"{name}_best_p50_ms": best[len(best) // 2], f"{name}_best_p99_ms": best[int(len(best) * 0.99)]}


FIGURES = {"avg_vs_fcfs": 0.85, "avg_vs_ilp": 0.90, "p50_vs_fcfs": 1.0, "p99_vs_fcfs": 1.0, "makespan_vs_fcfs": 1.05}
"""The issue's figures, as the largest has/baseline ratio (median over the family's windows) that meets each."""


def _ratio(run: dict[str, Any], key: str, base: str) -> float:
    b = run[base][key]
    return run["has"][key] / b if b > 0 else math.inf


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median and range over windows."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def figures(row: dict[str, Any]) -> dict[str, Any]:
    """A row's figures: has against fcfs and the ILP per window (median and range), whether each figure is met on the
    median and in every window, the jobs each policy left unfinished, and the room the lower bound leaves (fcfs over
    the bound: 15% below fcfs needs at least 1/0.85 = 1.18)."""
    runs = row["windows"]
    have = [p for p in POLICIES if p in runs[0]]
    ratio = {"avg_vs_fcfs": [_ratio(r, "avg_jct_s", "fcfs") for r in runs],
             "p50_vs_fcfs": [_ratio(r, "p50_jct_s", "fcfs") for r in runs],
             "p99_vs_fcfs": [_ratio(r, "p99_jct_s", "fcfs") for r in runs],
             "makespan_vs_fcfs": [_ratio(r, "makespan_s", "fcfs") for r in runs]}
    if "ilp" in have:
        ratio["avg_vs_ilp"] = [_ratio(r, "avg_jct_s", "ilp") for r in runs]
    unfinished = {p: sum(r[p]["unfinished"] for r in runs) for p in have}
    met = {k: statistics.median(v) <= FIGURES[k] for k, v in ratio.items()}
    every = {k: max(v) <= FIGURES[k] for k, v in ratio.items()}
    if unfinished.get("has", 0):  # a policy that leaves jobs behind cannot win a row
        met = dict.fromkeys(met, False)
    room = [r["fcfs"]["avg_jct_s"] / r["lower_bound_avg_jct_s"] for r in runs if r["lower_bound_avg_jct_s"] > 0]
    return {"ratios": {k: spread(v) for k, v in ratio.items()}, "met": met, "every_window": every,
            "unfinished": unfinished, "fcfs_over_bound": spread(room) if room else None,
            "demand_over_capacity": spread([r["demand_over_capacity"] for r in runs]),
            "latency": {p: {"decision_p50_ms": statistics.median(r[p]["decision_p50_ms"] for r in runs),
                            "decision_p99_ms": max(r[p]["decision_p99_ms"] for r in runs),
                            "round_p50_ms": statistics.median(r[p]["round_p50_ms"] for r in runs),
                            "round_p99_ms": max(r[p]["round_p99_ms"] for r in runs)} for p in have},
            "absolute": {p: {k: spread([r[p][k] for r in runs]) for k in
                             ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "avg_queue_s")} for p in have}}
