"""The default placement policy against the baselines, tuned on some trace families and reported on held-out ones.

Families, split by source (what `frenzy simulate` runs on each, rescaled to offered loads 0.5, 0.7, 0.9 and 1.1 on
`phoebe`: sum of duration x GPUs asked for, over span x cluster GPUs):
- **Tuning** (the policy's constants, `cluster/sizing.py`, were chosen on these only): Pollux's Philly CSV (first
  400 jobs from 2017-10-09 06:00), Sia's Philly and Saturn workload files (first `--files` of each), the Frenzy
  paper's NewWorkload (60 jobs, 3 seeds).
- **Held out** (never run while tuning): Microsoft ITP day 1 (ElasticFlow's trace, 41 jobs), Alibaba PAI 2023
  `openb` GPU pods (165), the production-shaped generator of issue 26 (400 jobs, 99% 1-GPU; seeds 8-10,
  `HELD_SEEDS`) and a mixed-width generator (200 jobs; seeds 8-10) (`cluster/synth_traces.py`; seeds 0-3 of
  `production` were used while tuning). Provenance: examples/traces/PROVENANCE.md. ITP and openb were run once with an
  earlier version of the sizing (commit ca339f5) before its last change; that change was made on what the
  `production` family showed.

Policies: `has` (the default, as `frenzy simulate` runs it), `has-paper` (the previous default: the paper's first
plan that fits, no sizing), `has-arrival` (the default's placement in arrival order), `fcfs`, `fifo` and the
Sia-style `ilp`, every trace at every load. Also the decision latency of the default at 2,048 GPUs, queue 1,000, and,
on the production family, an idealised scheduler that moves running jobs (`ideal_moves`) swept over queue orders on
three seed sets (tuning 0-3, held-out 8-10, fresh 11-13): where the family's 15% is out of reach, and why.

    python benchmarks/placement_load.py               # writes benchmarks/results/placement_load.{json,md}
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from cluster.has import FreePool, decide  # noqa: E402
from cluster.inventory import Cluster, load_cluster  # noqa: E402
from cluster.jobperf import user_layout  # noqa: E402
from cluster.queue import Running, Waiting, ordered, walk  # noqa: E402
from cluster.simulator import SimConfig, Simulator, _srpt_flow, lower_bounds, simulate  # noqa: E402
from cluster.sizing import Sizer  # noqa: E402
from cluster.synth_traces import mixed, production  # noqa: E402
from cluster.traces import TraceJob, load_trace, new_workload  # noqa: E402
from cluster.traces import at_load as rescale_to_load  # noqa: E402

TRACES = ROOT.parent / "examples" / "traces"
LOADS = (0.5, 0.7, 0.9, 1.1)
MACHINE = "2-core x86_64 shared with other work, no GPU"
HELD_SEEDS = (8, 9, 10)
"""Seeds 0-3 of `production` were used for tuning (the queue-depth penalty of cluster/sizing.py, then the response-ratio
aging of cluster/queue.py); seeds 4-6 were reported (and seen) with the additive aging before it was replaced, and seed 7
times decisions, so these seeds are fresh for the order the default runs now."""
DATE = "2026-11-25"


@dataclasses.dataclass
class Family:
    name: str
    role: str  # "held-out" | "tuning"
    source: str
    traces: list[list[TraceJob]]


def families(files: int) -> list[Family]:
    held = TRACES / "heldout"
    out = [Family("itp-day1", "held-out", "Microsoft ITP 2021 (ElasticFlow)", [load_trace(held / "itp-day1.csv")]),
           Family("alibaba-openb", "held-out", "Alibaba PAI 2023 openb pods",
                  [load_trace(held / "alibaba-openb.csv")]),
           Family("production", "held-out", "issue-26 shape, seeds 8-10", [production(400, s) for s in HELD_SEEDS]),
           Family("mixed", "held-out", "mixed widths, seeds 8-10", [mixed(200, s) for s in HELD_SEEDS]),
           Family("philly", "tuning", "Microsoft Philly 2017 (Pollux CSV)",
                  [load_trace(TRACES / "philly.csv", "philly", max_jobs=400)])]
    for kind, src in (("philly", "Philly"), ("saturn", "SenseTime Helios Saturn")):
        paths = sorted((TRACES / "sia-workloads" / kind).glob("workload-*.csv"), key=lambda p: int(p.stem.split("-")[1]))
        out.append(Family(f"sia-{kind}", "tuning", f"{src} (Sia workloads)", [load_trace(p, "sia") for p in paths[:files]]))
    out.append(Family("newworkload", "tuning", "Frenzy NewWorkload, seeds 0-2",
                      [new_workload(60, seed=s, mean_interarrival_s=120.0) for s in range(3)]))
    return out


def at_load(trace: list[TraceJob], cluster: Cluster, load: float) -> list[TraceJob]:
    """The trace with its arrival times stretched or squeezed to the offered load (what `frenzy simulate --load`
    runs: `cluster.traces.at_load`)."""
    return rescale_to_load(trace, sum(n.count for n in cluster.nodes), load)


POLICIES: dict[str, tuple[str, SimConfig]] = {"has": ("has", SimConfig()), "has-paper": ("has", SimConfig(sizing=False)),
                                              "has-arrival": ("has-arrival", SimConfig()), "fcfs": ("fcfs", SimConfig()),
                                              "fifo": ("fifo", SimConfig()), "ilp": ("ilp", SimConfig())}
METRICS = ("avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "utilisation")


def utilisation(summary: dict[str, Any], c: Cluster) -> float:
    """Busy GPU-seconds over GPUs x makespan, the cluster's types weighted by their GPU counts."""
    by_type: dict[str, int] = {}
    for n in c.nodes:
        by_type[n.gpu] = by_type.get(n.gpu, 0) + n.count
    per = summary["utilisation"]
    return sum(per.get(t, 0.0) * k for t, k in by_type.items()) / sum(by_type.values())


def least_gpu_s(sim: Simulator, i: int) -> dict[str, float]:
    """Job `i`'s fewest GPU-seconds per GPU type over MARP's plans (the requests has chooses among)."""
    got = sim._has_requests(i)
    per: dict[str, float] = {}
    for r in got[0] if got else []:
        (t,) = r.types  # type: ignore[misc]
        per[t] = min(per.get(t, math.inf), r.gpus * (r.run_s or math.inf))
    return per


def options(sim: Simulator, i: int) -> list[tuple[str, int, float]]:
    """Every way job `i` can run: (GPU type, GPUs, run seconds), over MARP's plans (as has runs them) and the user's
    own count and layout at the largest micro-batch that fits each type (as fcfs runs them after OOMs)."""
    j = sim.jobs[i]
    got = sim._has_requests(i)
    opts = [(next(iter(r.types or ())), r.gpus, r.run_s or math.inf) for r in (got[0] if got else [])]
    for t in sim.perf.types:  # the user's count, micro-batch halved until it fits (fcfs after OOMs)
        node = max((n for n, x in sim.perf.node.items() if x.gpu_type == t), key=lambda n: sim.perf.node[n].capacity)
        k = j.num_gpus
        if k > sim.perf.node[node].capacity:
            continue
        j.user_mb = None
        while True:
            dur, lay, _ = sim.perf.run_time(j, [(node, k)], None)
            if lay is not None:
                opts.append((t, k, dur))
                break
            mb = user_layout(j.key, k, j.user_mb).micro_batch
            if mb <= 1:
                break
            j.user_mb = mb // 2
    j.user_mb = None
    return [o for o in opts if math.isfinite(o[2])]


def type_options(sim: Simulator, i: int) -> dict[str, tuple[int, float]]:
    """Job `i`'s leanest way to run on each GPU type (`options`): (GPUs, run seconds) with the fewest GPU-seconds."""
    best: dict[str, tuple[int, float]] = {}
    for t, k, d in options(sim, i):
        if t not in best or k * d < best[t][0] * best[t][1]:
            best[t] = (k, d)
    return best


def _work_and_rate(c: Cluster, trace: list[TraceJob]) -> tuple[list[float], list[float], list[float], float]:
    """Per job its fewest GPU-seconds over the cluster's types (`options`), its arrival and its fastest run time; and
    the rate of the cluster as one machine: per type its GPUs x the best fraction of a job's fewest GPU-seconds per
    GPU-second any job gets on it."""
    sim = Simulator(c, trace, "has")
    best_frac: dict[str, float] = {}
    work, rel, fastest = [], [], []
    for i, j in enumerate(sim.jobs):
        opts = options(sim, i)
        w: dict[str, float] = {}
        for t, k, d in opts:
            w[t] = min(w.get(t, math.inf), k * d)
        if not w:
            continue
        u = min(w.values())
        for t, x in w.items():
            best_frac[t] = max(best_frac.get(t, 0.0), u / x)
        work.append(u)
        rel.append(j.trace.submit_s)
        fastest.append(min(d for _, _, d in opts))
    return work, rel, fastest, sum(sim.perf.total[t] * f for t, f in best_frac.items())


def rate_bound(c: Cluster, trace: list[TraceJob]) -> tuple[float, float]:
    """A lower bound on average JCT that keeps the cluster's heterogeneity (lower_bounds() makes every GPU the
    fastest type): each job's work is its fewest GPU-seconds over the cluster's types, and the cluster is one machine
    of `_work_and_rate`'s rate. Preemptive SRPT on that machine, or the mean fastest run time, whichever is larger.
    Returned with the demand over capacity: the work the trace asks for per second of its arrival span over that
    rate (above 1 the queue grows for the whole trace under any policy)."""
    work, rel, fastest, rate = _work_and_rate(c, trace)
    span = max(rel) - min(rel)
    demand = sum(work) / span / rate if span > 0 and rate > 0 else math.inf
    return max(statistics.mean(fastest), _srpt_flow(rel, work, rate) / len(work)), demand


MOVE_S = 120.0
"""What a move between GPU types costs a job in `ideal_moves` (cluster/simulator.py has no moves)."""
AGES = (0.0, 0.1, 0.3, 1.0, 3.0, math.inf)
"""The queue orders `ideal_moves` is swept over on the production family: time left at the fastest option less
`age` x the seconds waited since arrival (0: shortest remaining first; inf: arrival order)."""


def ideal_moves(c: Cluster, trace: list[TraceJob], move_s: float = MOVE_S, preempt: bool = False,
                age: float = 0.0) -> tuple[float, float]:
    """An idealised scheduler that moves running jobs between GPU types, which has does not do: the room such a
    scheduler would have, not a bound. At every arrival and completion the jobs, in order of the time left at their
    fastest option (running ones first unless `preempt`), each take whichever of their leanest options per type
    (`type_options`) finishes soonest on the GPUs still free, counted per type (no node packing); a job that changes
    type loses `move_s`. It knows every job's true run time. With `age` > 0 the order is the time left less `age` x
    the seconds since the job arrived (inf: arrival order), which trades average JCT for the tail. Returns (average
    JCT, p99 JCT)."""
    sim = Simulator(c, trace, "has")
    n = len(sim.jobs)
    opts = [type_options(sim, i) for i in range(n)]
    fastest = [min((d for _, d in o.values()), default=math.inf) for o in opts]
    submit = [j.trace.submit_s for j in sim.jobs]
    arrivals = sorted((i for i in range(n) if opts[i]), key=lambda i: submit[i])
    left = [1.0] * n  # fraction of each job's work not done
    lost = [0.0] * n  # seconds of a move still to pay
    on: dict[int, tuple[str, int, float]] = {}  # running job -> (type, GPUs, run seconds there)
    finish: dict[int, float] = {}
    now, k = 0.0, 0
    while k < len(arrivals) or on:
        ends = [now + lost[i] + left[i] * d for i, (_, _, d) in on.items()]
        nxt = min(ends + ([submit[arrivals[k]]] if k < len(arrivals) else []))
        for i, (_, _, d) in list(on.items()):
            paid = min(lost[i], nxt - now)
            lost[i] -= paid
            left[i] -= (nxt - now - paid) / d
            if left[i] <= 1e-9:
                finish[i] = nxt
                del on[i]
        now = nxt
        while k < len(arrivals) and submit[arrivals[k]] <= now:
            k += 1
        active = [i for i in arrivals[:k] if i not in finish]
        active.sort(key=lambda i: (not preempt and i not in on,
                                   submit[i] if math.isinf(age) else left[i] * fastest[i] - age * (now - submit[i]), i))
        free = dict(sim.perf.total)
        placed: dict[int, tuple[str, int, float]] = {}
        for i in active:
            cur = on.get(i)
            best = None
            for t, (g, d) in opts[i].items():
                if free[t] >= g:
                    end = left[i] * d + (move_s if cur is not None and cur[0] != t else 0.0)
                    if best is None or end < best[0]:
                        best = (end, t, g, d)
            if best is None:
                continue
            _, t, g, d = best
            free[t] -= g
            if cur is not None and cur[0] != t:
                lost[i] = move_s
            placed[i] = (t, g, d)
        for i in on.keys() - placed.keys():  # preempted: its progress is kept, a restart pays the move
            lost[i] = move_s
        on = placed
    jct = sorted(finish[i] - submit[i] for i in finish)
    return statistics.mean(jct), float(np.percentile(jct, 99))


def efficiency(c: Cluster, traces: list[list[TraceJob]], load: float) -> dict[str, dict[str, list[float]]]:
    """Per policy (has, fcfs) and GPU type: [busy GPU-hours, the useful fraction of them (each job's fewest
    GPU-seconds on any type over what it used), the best fraction any job gets on that type (the type's cap)],
    summed over the traces at `load`. Where both policies sit near every type's cap, throughput is spent as well as
    the pools allow and only the order is left to change the average JCT."""
    out: dict[str, dict[str, list[float]]] = {}
    for tr in traces:
        t2 = at_load(tr, c, load)
        sim = Simulator(c, t2, "has")
        least, cap = {}, {}
        for i, j in enumerate(sim.jobs):
            per = least_gpu_s(sim, i)
            if not per:
                continue
            least[j.trace.name] = min(per.values())
            for t, x in per.items():
                cap[t] = max(cap.get(t, 0.0), least[j.trace.name] / x)
        for pol in ("has", "fcfs"):
            for j in simulate(c, t2, pol, SimConfig()).jobs:  # type: ignore[arg-type]
                if j.finish is None or j.trace.name not in least:
                    continue
                used = sum(k for _, k in j.nodes) * j.run_s
                acc = out.setdefault(pol, {}).setdefault(j.gpu_type, [0.0, 0.0, 0.0])
                acc[0] += used / 3600
                acc[1] += least[j.trace.name] / 3600
                acc[2] = max(acc[2], cap.get(j.gpu_type, 0.0))
    return {p: {t: [v[0], v[1] / v[0] if v[0] else 0.0, v[2]] for t, v in by.items()} for p, by in out.items()}


def row_for(c: Cluster, fam: Family, load: float, policies: list[str]) -> dict[str, Any]:
    """Every policy on every trace of the family at `load`; per policy the mean of each metric over the traces."""
    acc: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    lbs, rbs, ideal, over = [], [], [], []
    # on the family that misses the target, the idealised mover is swept over its queue order (the tail's price)
    variants = [(p, a) for p in (False, True) for a in (AGES if fam.name == "production" else (0.0,))]
    for tr in fam.traces:
        t2 = at_load(tr, c, load)
        lbs.append(lower_bounds(c, t2, SimConfig())["avg_jct_s"])
        rb, demand = rate_bound(c, t2)
        rbs.append(rb)
        over.append(demand)
        ideal.append([ideal_moves(c, t2, preempt=p, age=a) for p, a in variants])
        for p in acc:
            pol, cfg = POLICIES[p]
            s = simulate(c, t2, pol, cfg).summary()  # type: ignore[arg-type]
            acc[p].append({**s, "utilisation": utilisation(s, c)})
    row: dict[str, Any] = {"family": fam.name, "role": fam.role, "source": fam.source, "traces": len(fam.traces),
                           "jobs": sum(len(t) for t in fam.traces), "load": load, "lower_bound_avg_jct_s":
                           max(statistics.mean(lbs), statistics.mean(rbs)), "rate_bound_avg_jct_s": statistics.mean(rbs),
                           "ideal_moves": ideal_summary(variants, ideal),
                           "demand_over_capacity": statistics.mean(over)}
    for p, runs in acc.items():
        row[p] = {k: statistics.mean(r[k] for r in runs) for k in METRICS}
        row[p]["idle_violations"] = sum(r.get("idle_violations", 0) for r in runs)
        row[p]["decision_p99_ms"] = max(r["decision_p99_ms"] for r in runs)
        row[p]["unschedulable"] = sum(r["unschedulable"] for r in runs)
        row[p]["per_trace_avg_jct_s"] = [r["avg_jct_s"] for r in runs]
        row[p]["per_trace_p99_jct_s"] = [r["p99_jct_s"] for r in runs]
    return row


def ideal_summary(variants: list[tuple[bool, float]], runs: list[list[tuple[float, float]]]) -> dict[str, Any]:
    """`ideal_moves` over a family's traces (mean per variant): the shortest-remaining-first figures (moves only, and
    with preemption) and, where more orders ran, every one of them as `sweep` (`age` null: arrival order)."""
    mean = [(statistics.mean(r[n][0] for r in runs), statistics.mean(r[n][1] for r in runs))
            for n in range(len(variants))]
    by = dict(zip(variants, mean, strict=True))
    out: dict[str, Any] = {"avg_jct_s": by[(False, 0.0)][0], "p99_jct_s": by[(False, 0.0)][1],
                           "preempt_avg_jct_s": by[(True, 0.0)][0], "preempt_p99_jct_s": by[(True, 0.0)][1]}
    if len(variants) > 2:
        out["sweep"] = [{"preempt": p, "age": None if math.isinf(a) else a, "avg_jct_s": x, "p99_jct_s": y}
                        for (p, a), (x, y) in by.items()]
    return out


TUNING_SEEDS = (0, 1, 2, 3)
FRESH_SEEDS = (11, 12, 13)
"""Seeds of the production generator first run for the sweep of 2026-11-25, after the policy and the sweep's orders
were fixed: a third set, beside the held-out 8-10 that had been seen with the idealised mover."""


def seed_sweep(c: Cluster, load: float, seeds: tuple[int, ...] = TUNING_SEEDS, role: str = "tuning") -> dict[str, Any]:
    """The idealised mover's sweep on the production family's `seeds` at `load` (against fcfs and has on the same
    traces), beside the held-out rows: whether its room holds on other seeds."""
    variants = [(p, a) for p in (False, True) for a in AGES]
    runs, fc, hs = [], [], []
    for s in seeds:
        t2 = at_load(production(400, s), c, load)
        runs.append([ideal_moves(c, t2, preempt=p, age=a) for p, a in variants])
        fc.append(simulate(c, t2, "fcfs", SimConfig()).summary())
        hs.append(simulate(c, t2, *POLICIES["has"]).summary())  # type: ignore[arg-type]
    return {"family": "production", "role": role, "seeds": list(seeds),
            "source": f"issue-26 shape, seeds {seeds[0]}-{seeds[-1]}", "load": load,
            "fcfs": {k: statistics.mean(r[k] for r in fc) for k in ("avg_jct_s", "p99_jct_s")},
            "has": {k: statistics.mean(r[k] for r in hs) for k in ("avg_jct_s", "p99_jct_s")},
            "ideal_moves": ideal_summary(variants, runs)}


def latency(gpus: int, queue: int) -> dict[str, float]:
    """Decision latency of the default (one `Sizer.pick` per queued job, in one pass) at `gpus` GPUs: half the GPUs
    busy in random per-node amounts with random predicted ends."""
    from scheduling import scaled_cluster

    c = scaled_cluster(gpus)
    trace = production(queue, seed=7)
    sim = Simulator(c, trace, "has")
    rng = random.Random(0)
    busy = [(name, rng.randint(0, k)) for name, k in sim.pool.free.items()]
    running = [Running(end_s=rng.uniform(60, 36000), nodes=((n, k),)) for n, k in busy if k]
    lat: list[float] = []
    paper: list[float] = []
    gc.collect()
    gc.disable()  # as timeit does: a collection pause is the interpreter's, not the decision's
    for _ in range(3):
        pool = FreePool(sim.perf.node.values(), dict(sim.pool.free))
        pool.take(busy)
        waiting = [Waiting(job=i, seq=i, submitted_s=0.0, predicted_s=sim._predicted_s(i)) for i in range(queue)]
        reqs = {w.job: sim._has_requests(int(w.job))[0] for w in waiting}  # type: ignore[index, call-overload]
        sizer = Sizer(pool, running, 0.0, ordered(waiting, "shortest", 0.0), reqs)

        def place(w: Waiting, admit: Callable, s: Sizer = sizer, p: FreePool = pool) -> bool:
            got = s.pick(w, admit)
            if got is not None:
                p.take(got[0].nodes)
            return got is not None

        before = FreePool(sim.perf.node.values(), dict(pool.free))
        walk(waiting, "shortest", 0.0, place, reserve_for=sizer.reserve_for)
        lat += sizer.decision_ms
        for w in waiting:  # the paper's HAS decision (first plan that fits) on the same pool, for the ratio
            t0 = time.perf_counter()
            decide(before, reqs[w.job])
            paper.append((time.perf_counter() - t0) * 1e3)
    gc.enable()
    lat.sort()
    paper.sort()
    return {"gpus": sum(n.count for n in c.nodes), "queue": queue, "decisions": len(lat),
            "p50_ms": lat[len(lat) // 2], "p99_ms": lat[int(len(lat) * 0.99)],
            "paper_p50_ms": paper[len(paper) // 2], "paper_p99_ms": paper[int(len(paper) * 0.99)]}


def pct(x: float, y: float) -> str:
    return f"{(x / y - 1) * 100:+.1f}%"


def per_trace(h: dict[str, Any], f: dict[str, Any], key: str = "avg") -> list[float]:
    """has against fcfs on each trace of the family (`key`: avg or p99 JCT), as fractions (negative: has better)."""
    k = f"per_trace_{key}_jct_s"
    return [x / y - 1 for x, y in zip(h.get(k, []), f.get(k, []), strict=True)]


def spread(h: dict[str, Any], f: dict[str, Any], key: str = "avg") -> str:
    """has against fcfs on each trace of the family, the best and worst (the seed-to-seed noise)."""
    each = per_trace(h, f, key)
    return f"{min(each) * 100:+.1f}..{max(each) * 100:+.1f}%" if len(each) > 1 else ""


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per family and load: the default against each baseline (negative: the default is better)."""
    lines = ["| family | source | traces (jobs) | load | has avg JCT s | vs fcfs: avg | per trace | p50 | p99 | p99 per trace | "
             "vs fifo | vs ilp | vs has-paper | vs has-arrival | idle violations | has / lower bound | "
             "fcfs / lower bound |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        h, f = r["has"], r["fcfs"]
        vs = {p: pct(h["avg_jct_s"], r[p]["avg_jct_s"]) if p in r else "" for p in ("fifo", "ilp", "has-paper",
                                                                                       "has-arrival")}
        lines.append(f"| {r['family']} | {r['source']} | {r['traces']} ({r['jobs']}) | {r['load']} | "
                     f"{h['avg_jct_s']:.0f} | {pct(h['avg_jct_s'], f['avg_jct_s'])} | {spread(h, f)} | "
                     f"{pct(h['p50_jct_s'], f['p50_jct_s'])} | {pct(h['p99_jct_s'], f['p99_jct_s'])} | "
                     f"{spread(h, f, 'p99')} | "
                     f"{vs['fifo']} | {vs['ilp']} | {vs['has-paper']} | {vs['has-arrival']} | {h['idle_violations']} | "
                     f"{h['avg_jct_s'] / r['lower_bound_avg_jct_s']:.2f}x | {f['avg_jct_s'] / r['lower_bound_avg_jct_s']:.2f}x |")
    return lines


def ideal_vs(r: dict[str, Any]) -> str:
    """`ideal_moves` against fcfs: average JCT (p99 JCT)."""
    m, f = r.get("ideal_moves"), r["fcfs"]
    return f"{pct(m['avg_jct_s'], f['avg_jct_s'])} ({pct(m['p99_jct_s'], f['p99_jct_s'])})" if m else ""


def detail(rows: list[dict[str, Any]]) -> list[str]:
    """The absolute figures: per family, load and policy, JCT avg/p50/p99, average queueing and GPU utilisation."""
    lines = ["| family | load | policy | avg JCT s | p50 JCT s | p99 JCT s | avg queue s | utilisation |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for p in ("has", "fcfs", "fifo", "ilp"):
            if p in r:
                m = r[p]
                lines.append(f"| {r['family']} | {r['load']} | {p} | {m['avg_jct_s']:.0f} | {m['p50_jct_s']:.0f} | "
                             f"{m['p99_jct_s']:.0f} | {m['avg_queue_s']:.0f} | {m['utilisation']:.3f} |")
    return lines


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, row by row: which rows miss which."""
    miss: dict[str, list[str]] = {"avg JCT not >= 15% below fcfs": [], "avg JCT worse than fcfs": [],
                                  "p99 JCT worse than fcfs": [], "avg JCT not >= 10% below ilp": [],
                                  "idle violations": [], "a trace of the family worse than fcfs on average": [],
                                  "a trace of the family worse than fcfs at the p99": []}
    for r in rows:
        tag = f"{r['family']}@{r['load']}"
        h, f = r["has"], r["fcfs"]
        if h["avg_jct_s"] > 0.85 * f["avg_jct_s"]:
            miss["avg JCT not >= 15% below fcfs"].append(f"{tag} ({pct(h['avg_jct_s'], f['avg_jct_s'])})")
        if h["avg_jct_s"] > f["avg_jct_s"]:
            miss["avg JCT worse than fcfs"].append(tag)
        if h["p99_jct_s"] > f["p99_jct_s"]:
            miss["p99 JCT worse than fcfs"].append(f"{tag} ({pct(h['p99_jct_s'], f['p99_jct_s'])})")
        if "ilp" in r and h["avg_jct_s"] > 0.9 * r["ilp"]["avg_jct_s"]:
            miss["avg JCT not >= 10% below ilp"].append(f"{tag} ({pct(h['avg_jct_s'], r['ilp']['avg_jct_s'])})")
        if h["idle_violations"]:
            miss["idle violations"].append(f"{tag} ({h['idle_violations']})")
        for key, name in (("avg", "on average"), ("p99", "at the p99")):
            worse = [x for x in per_trace(h, f, key) if x > 0]
            if worse:
                miss[f"a trace of the family worse than fcfs {name}"].append(
                    f"{tag} ({len(worse)} of {r['traces']}, up to {max(worse) * 100:+.1f}%)")
    return [f"- {k}: {len(v)} of {len(rows)} rows" + (f": {', '.join(v)}" if v else "") for k, v in miss.items()]


def losses(rows: list[dict[str, Any]]) -> list[str]:
    """Rows where the default's average JCT is above fcfs's, split into queueing and run time (JCT - queueing)."""
    out = []
    for r in rows:
        h, f = r["has"], r["fcfs"]
        if h["avg_jct_s"] <= f["avg_jct_s"]:
            continue
        out.append(f"- {r['family']} ({r['role']}) at load {r['load']}: has {pct(h['avg_jct_s'], f['avg_jct_s'])}; "
                   f"queueing {h['avg_queue_s']:.0f} s against {f['avg_queue_s']:.0f} s, run "
                   f"{h['avg_jct_s'] - h['avg_queue_s']:.0f} s against {f['avg_jct_s'] - f['avg_queue_s']:.0f} s, "
                   f"utilisation {h['utilisation']:.3f} against {f['utilisation']:.3f}.")
    return out or ["- none"]


def demand_text(rows: list[dict[str, Any]]) -> str:
    """What the held-out production traces ask for against what phoebe's pools give back at best, per load."""
    got = [r for r in rows if r["family"] == "production" and r["role"] == "held-out" and "demand_over_capacity" in r]
    if not got:
        return ""
    return ("The work these traces ask for over what the pools give back at best (each job's fewest GPU-seconds "
            "on any type, per second of the arrival span, over the GPUs of each type x the best fraction any job gets "
            "there: the rate of the lower bound) is " + ", ".join(f"{r['demand_over_capacity']:.2f}x at {r['load']}"
                                                                  for r in got) +
            ": above 1x the queue grows for the whole trace under every policy. The load of the table counts GPUs "
            "as equal, but for these jobs the older types do a fraction of an A100's useful work (the caps above).")


def why_production(eff: dict[str, dict[str, list[float]]], rows: list[dict[str, Any]],
                   others: list[dict[str, Any]]) -> list[str]:
    """Where the production family stands against the 15% target: the per-type efficiency, and what a scheduler that
    moves running jobs between GPU types (`ideal_moves`) would reach."""
    if not eff:
        return []
    out = ["How the GPU pools were used on the held-out production seeds at load 0.9 (busy GPU-hours; useful: each "
           "job's fewest GPU-seconds on any type over what it used; cap: the best useful fraction any job of the "
           "family gets on that type):", "", "| policy | GPU type | busy GPU-h | useful fraction | the type's cap |",
           "|---|---|---|---|---|"]
    for p, by in eff.items():
        for t, (h, u, cap) in sorted(by.items()):
            out.append(f"| {p} | {t} | {h:.0f} | {u:.2f} | {cap:.2f} |")
    total = {p: sum(h * u for h, u, _ in by.values()) / sum(h for h, _, _ in by.values()) for p, by in eff.items()}
    room = {p: sum(h * cap for h, _, cap in by.values()) / sum(h * u for h, u, _ in by.values()) - 1
            for p, by in eff.items()}
    out += ["", "Useful fraction over all GPUs: " + ", ".join(f"{p} {v:.3f}" for p, v in total.items()) + "; every "
            "type at its cap for the same busy hours would add at most " + ", ".join(f"{room[p] * 100:.0f}% ({p})"
                                                                                   for p in room) +
            " useful work. " + demand_text(rows), "",
            f"Throughput is not all that is left, though. An idealised scheduler that moves running jobs between GPU "
            f"types (`ideal_moves` in this script: at every arrival and completion, jobs in order of the time left at "
            f"their fastest option take the option that finishes soonest on what is free, a running job moving up to "
            f"a faster type as one frees for {MOVE_S:.0f} s per move; it knows the true run times and ignores node "
            "packing, so it is an estimate of the room, not a bound) reaches, against fcfs (average JCT, p99 JCT):",
            "", "| load | has | idealised, moves only | idealised, moves and preemption |", "|---|---|---|---|"]
    for r in rows:
        if r["family"] != "production" or r["role"] != "held-out" or "ideal_moves" not in r:
            continue
        h, f, m = r["has"], r["fcfs"], r["ideal_moves"]
        out.append(f"| {r['load']} | {pct(h['avg_jct_s'], f['avg_jct_s'])} ({pct(h['p99_jct_s'], f['p99_jct_s'])}) | "
                   f"{ideal_vs(r)} | {pct(m['preempt_avg_jct_s'], f['avg_jct_s'])} "
                   f"({pct(m['preempt_p99_jct_s'], f['p99_jct_s'])}) |")
    sweep = [r for r in rows if r["family"] == "production" and r["role"] == "held-out"
             and "sweep" in r.get("ideal_moves", {})]
    out += ["", "Moving a job up to a faster GPU as one frees is what has does not do: it places a job once, and a "
            "job that started on an RTX-2080Ti because every A100 was busy stays there for hours. Frenzy's checkpoints "
            "resume on any layout, so the trainer could move. A first version of moves inside has (tried on tuning "
            "seeds 0-1 of this family only, load 0.9, with widening off) reached -9.8% against fcfs where has reaches "
            "-5.2% on those seeds, but its p99 JCT was 28-34% above fcfs's: the jobs last in the queue's order waited "
            "longer while moved jobs took the A100s that came free. It is not in has; the sweep below says why.",
            "", *ideal_tail(sweep, others)]
    return out


def ideal_tail(rows: list[dict[str, Any]], others: list[dict[str, Any]]) -> list[str]:
    """The idealised mover's price in the tail: its average and p99 JCT against fcfs for each queue order it was swept
    over (held-out seeds), and per seed set (held-out, then `others`: the `seed_sweep` rows of the tuning and fresh
    seeds) and load the best average it reaches with a p99 no worse than fcfs's, against what has reaches."""
    if not rows:
        return []
    def order(a: float | None) -> str:
        return "arrival order" if a is None else "shortest remaining first" if a == 0 else f"remaining - {a:g} x waited"
    out = ["The idealised scheduler's shortest-remaining-first order buys its average with the tail. Aging trades one "
           "for the other: ordered by the time left less `age` x the seconds waited, against fcfs (average JCT, p99 "
           "JCT; held-out seeds 8-10):", "",
           "| queue order | moves | " + " | ".join(f"load {r['load']}" for r in rows) + " |",
           "|---|---|" + "---|" * len(rows)]
    for n, v in enumerate(rows[0]["ideal_moves"]["sweep"]):
        cells = []
        for r in rows:
            x, f = r["ideal_moves"]["sweep"][n], r["fcfs"]
            cells.append(f"{pct(x['avg_jct_s'], f['avg_jct_s'])} ({pct(x['p99_jct_s'], f['p99_jct_s'])})")
        out.append(f"| {order(v['age'])} | {'and preemption' if v['preempt'] else 'only'} | " + " | ".join(cells) + " |")
    def kept_tail(r: dict[str, Any]) -> dict[str, Any] | None:  # the best average among orders with p99 <= fcfs's
        ok = [x for x in r["ideal_moves"]["sweep"] if x["p99_jct_s"] <= r["fcfs"]["p99_jct_s"]]
        return min(ok, key=lambda x: x["avg_jct_s"]) if ok else None

    def best(rs: list[dict[str, Any]]) -> str:
        parts = []
        for r in rs:
            b, f = kept_tail(r), r["fcfs"]
            parts.append(f"{r['load']}: " + (f"{pct(b['avg_jct_s'], f['avg_jct_s'])} ({order(b['age'])}"
                                              f"{', with preemption' if b['preempt'] else ''})" if b else "none"))
        return "; ".join(parts)

    def meets(r: dict[str, Any]) -> bool:
        b = kept_tail(r)
        return b is not None and b["avg_jct_s"] <= 0.85 * r["fcfs"]["avg_jct_s"]
    out += ["", f"The best average any of these reaches with a p99 no worse than fcfs's, per load: {best(rows)}.", ""]
    sets = [("held-out 8-10", rows)]
    for role in dict.fromkeys(r["role"] for r in others):
        rs = [r for r in others if r["role"] == role]
        sets.append((f"{role} {rs[0]['source'].split('seeds ')[-1]}", rs))
    loads = [r["load"] for r in rows]
    out += ["Per seed set (tuning 0-3 chose the policy; held-out 8-10 were seen with the idealised mover; fresh 11-13 "
            "were first run after the policy and this sweep's orders were fixed): has against fcfs, and the best "
            "idealised order whose p99 is no worse than fcfs's (average JCT against fcfs; its order's `age`, as "
            "above; **bold**: both figures met, 15% below and the p99 no worse):", "",
            "| seeds | " + " | ".join(f"has, load {x}" for x in loads) + " | " +
            " | ".join(f"idealised, load {x}" for x in loads) + " |", "|---|" + "---|" * (2 * len(loads))]
    for name, rs in sets:
        by = {r["load"]: r for r in rs}
        hs = [f"{pct(by[x]['has']['avg_jct_s'], by[x]['fcfs']['avg_jct_s'])} "
              f"({pct(by[x]['has']['p99_jct_s'], by[x]['fcfs']['p99_jct_s'])})" if x in by else "" for x in loads]
        ids = []
        for x in loads:
            if x not in by:
                ids.append("")
                continue
            b, f = kept_tail(by[x]), by[x]["fcfs"]
            if b is None:
                ids.append("none")
                continue
            how = "arrival order" if b["age"] is None else f"age {b['age']:g}"
            cell = f"{pct(b['avg_jct_s'], f['avg_jct_s'])} ({how}{', preempting' if b['preempt'] else ''})"
            ids.append(f"**{cell}**" if meets(by[x]) else cell)
        out.append(f"| {name} | " + " | ".join(hs) + " | " + " | ".join(ids) + " |")
    high = [r for _, rs in sets for r in rs if r["load"] >= 0.7]
    met = {x: sum(meets(r) for r in high if r["load"] == x) for x in loads if x >= 0.7}
    has_avg = [100 * (r["has"]["avg_jct_s"] / r["fcfs"]["avg_jct_s"] - 1) for r in high]
    has_p99 = [100 * (r["has"]["p99_jct_s"] / r["fcfs"]["p99_jct_s"] - 1) for r in high]
    out += ["", "Where the 15% is out of reach, and why. The idealised scheduler meets both figures at load " + ", ".join(
        f"{x} on {n} of {len(sets)} seed sets" for x, n in met.items()) + ", though it knows every run time, ignores "
        f"node packing, pays only {MOVE_S:.0f} s a move and is given the best of its orders on those very seeds; a "
        "real scheduler has less. Where this family asks for more work than phoebe's GPUs give back (above), the "
        "queue grows for the whole trace under every policy, and the average JCT is then set by the order in which "
        "the queue is served. An order short enough to be 15% below fcfs on average makes "
        "the last jobs wait longer than under fcfs (the sweep above), which the issue's second figure rules out. has "
        "keeps its p99 near or below fcfs's instead: from load 0.7 on these seed sets it is "
        f"{max(has_avg):+.1f}% to {min(has_avg):+.1f}% against fcfs on average with the p99 {min(has_p99):+.1f}% to "
        f"{max(has_p99):+.1f}%; the benchmark flags those rows rather than trading the tail for the average.", ""]
    out.append("(On the other families the idealised scheduler is no guide: it never widens a job and ignores node "
               "packing, and on ITP's wide jobs it is several times worse than fcfs; the JSON has its "
               "shortest-remaining-first figures for every row.)")
    return out


def report(meta: dict[str, Any], rows: list[dict[str, Any]], lat: dict[str, float],
           eff: dict[str, dict[str, list[float]]] | None = None, sweep: list[dict[str, Any]] | None = None
           ) -> list[str]:
    held = [r for r in rows if r["role"] == "held-out"]
    tuned = [r for r in rows if r["role"] == "tuning"]
    arrival_worse = sum(r["has-arrival"]["avg_jct_s"] > r["has"]["avg_jct_s"] for r in rows)
    return [f"# Placement under load, held-out trace families first ({DATE}, {MACHINE}, cluster phoebe)", "",
            f"`{meta['command']}`, wall {meta['wall_s']:.0f} s. `has` is the default as `frenzy simulate` runs it "
            "(MARP plans; queue shortest-predicted-first with aging and a reservation for its head; per job the plan "
            "chosen by cluster/sizing.py: earliest predicted finish, throughput per GPU weighed by the queue behind it "
            "while jobs wait, wider when GPUs would idle). `has-paper` is the previous default (the paper's first plan "
            "that fits), `has-arrival` the default's placement in arrival order, `fcfs` and `fifo` place what the "
            "trace asked for in arrival order (fifo: strict head-of-line), `ilp` is the Sia-style ILP. Figures are "
            "means over the family's traces; percentages are has against the policy named (negative: has is better). "
            "Idle violations: after a scheduling pass, a waiting job that could have started on idle GPUs with a plan "
            "predicted to finish sooner than the one it waits for, where the head's reservation did not need them "
            "(0 is the invariant). Utilisation: busy GPU-seconds over GPUs x makespan. Lower bound: the larger of "
            "cluster/simulator.py's lower_bounds (every GPU relaxed to the fastest type) and this script's rate_bound "
            "(heterogeneity kept: each type contributes its GPUs x the best fraction of a job's least GPU-seconds it "
            "gets per GPU-second; preemptive SRPT on that rate). fcfs / lower bound is how much room any policy has: "
            "at 1.15x no schedule can be 15% below fcfs.",
            "", "## Held-out families (never run while tuning)", "",
            "How held out: the constants of cluster/sizing.py and the queue's aging were chosen on the tuning families "
            "below and on seeds 0-3 of the `production` generator. The queue's order changed last (additive aging to "
            "the response ratio of cluster/queue.py, 2026-11-24), chosen on those alone; ITP, openb and the mixed "
            "family had been reported (seen) with earlier versions, never run while choosing it; the production and "
            "mixed rows use seeds 8-10, first run for the report of 2026-11-24 (4-6 were reported with the additive "
            "aging). The policy has not changed since those rows were seen; this report adds an idealised "
            "scheduler that moves jobs (its last section).", "",
            *table(held), "", *verdict(held), "",
            "## Tuning families (the constants of cluster/sizing.py and the aging were chosen on these)", "",
            *table(tuned), "", *verdict(tuned), "", "## has-arrival", "",
            f"`has-arrival` has a higher average JCT than `has` in {arrival_worse} of {len(rows)} rows; it is not in "
            "the default policy list of `frenzy simulate`.",
            "", "## Decision latency", "",
            f"One `Sizer.pick` per queued job in one pass (the code the ledger and the simulator run), "
            f"{lat['gpus']} GPUs (phoebe's mix scaled up), queue {lat['queue']} production-shaped jobs, half the "
            f"GPUs busy with random predicted ends, 3 passes, garbage collection off while timing: p50 "
            f"{lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms over {lat['decisions']} decisions (target p99 < 1 ms). "
            f"In the same run the paper's decision (first plan that fits, no sizing) on the same pools: p50 "
            f"{lat['paper_p50_ms']:.3f} ms, p99 {lat['paper_p99_ms']:.3f} ms; sizing costs "
            f"{lat['p99_ms'] / lat['paper_p99_ms']:.1f}x at the p99. The machine was shared with other work: compare "
            "the two in this run, not across runs.",
            "", "## Where has loses to fcfs", "", *losses(rows),
            "", "## Why the production family stays short of 15%", "", *why_production(eff or {}, rows, sweep or []),
            "", "## Absolute figures, held-out families", "", *detail(held),
            "", "## Absolute figures, tuning families", "", *detail(tuned)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=3, help="Sia workload files per kind (default 3)")
    ap.add_argument("--no-ilp", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json of the last run")
    a = ap.parse_args()
    out = ROOT / "results"
    if a.report_only:
        doc = json.loads((out / "placement_load.json").read_text())
        (out / "placement_load.md").write_text("\n".join(report(doc["meta"], doc["rows"], doc["latency"],
                                                                doc.get("efficiency", {}),
                                                                doc.get("tuning_sweep", []) + doc.get("fresh_sweep", [])))
                                               + "\n")
        return 0
    c = load_cluster("phoebe")
    t_start = time.time()
    rows = []
    for fam in families(a.files):
        for load in LOADS:
            rows.append(row_for(c, fam, load, [p for p in POLICIES if p != "ilp" or not a.no_ilp]))
            r = rows[-1]
            print(f"{fam.role} {fam.name} load {load}: has {r['has']['avg_jct_s']:.0f} fcfs {r['fcfs']['avg_jct_s']:.0f} "
                  f"fifo {r['fifo']['avg_jct_s']:.0f} ilp {r.get('ilp', {}).get('avg_jct_s', math.nan):.0f}",
                  file=sys.stderr, flush=True)
    sweep = [seed_sweep(c, load) for load in LOADS]
    fresh = [seed_sweep(c, load, FRESH_SEEDS, "fresh") for load in LOADS]
    lat = latency(2048, 1000)
    prod = next(f for f in families(a.files) if f.name == "production")
    eff = efficiency(c, prod.traces, 0.9)
    meta = {"machine": MACHINE, "date": DATE, "cluster": "phoebe", "wall_s": time.time() - t_start,
            "command": "python benchmarks/placement_load.py" + (" --no-ilp" if a.no_ilp else "")}
    (out / "placement_load.json").write_text(json.dumps({"meta": meta, "rows": rows, "latency": lat,
                                                                 "efficiency": eff, "tuning_sweep": sweep,
                                                                 "fresh_sweep": fresh}, indent=1))
    lines = report(meta, rows, lat, eff, sweep + fresh)
    (out / "placement_load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
