"""Placement figures: HAS against fcfs, fifo and a Sia-style ILP on NewWorkload and the Sia workload files, and
decision latency as the cluster and the queue grow.

    python benchmarks/scheduling.py [--quick]

Writes benchmarks/results/scheduling.md and .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from cluster.catalog import default_catalog
from cluster.has import FreePool, decide, requests_from_plans
from cluster.inventory import Cluster, Node, load_cluster
from cluster.simulator import SimConfig, Simulator, lower_bounds, simulate
from cluster.traces import load_trace, new_workload

ROOT = Path(__file__).resolve().parent
TRACES = ROOT.parent / "examples" / "traces" / "sia-workloads"
VARIANTS: dict[str, tuple[str, SimConfig]] = {
    "has": ("has", SimConfig()),
    "has-sjf": ("has", SimConfig(queue_order="shortest")),
    "has-gpus": ("has", SimConfig(rank_by="gpu_seconds")),
    "fcfs": ("fcfs", SimConfig()),
    "fifo": ("fifo", SimConfig()),
    "ilp": ("ilp", SimConfig()),
}


def run_all(cluster: Cluster, trace: list, names: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in names:
        pol, cfg = VARIANTS[name]
        out[name] = simulate(cluster, trace, pol, cfg).summary()  # type: ignore[arg-type]
    return out


def part_a(seeds: int) -> dict[str, Any]:
    """NewWorkload queues of 30 and 60 jobs on frenzy-testbed."""
    c = load_cluster("frenzy-testbed")
    res: dict[str, Any] = {}
    for n in (30, 60):
        runs = []
        for seed in range(seeds):
            trace = new_workload(n, seed=seed)
            r = run_all(c, trace, list(VARIANTS))
            r["lower_bound"] = lower_bounds(c, trace)
            runs.append(r)
            print(f"  newworkload {n} seed {seed}: " + ", ".join(
                f"{k} {v['avg_jct_s']:.0f}" for k, v in r.items() if k != "lower_bound"), file=sys.stderr)
        res[str(n)] = runs
    return res


def part_b(limit: int | None) -> dict[str, Any]:
    """The Sia Philly and Saturn workload files on phoebe."""
    c = load_cluster("phoebe")
    res: dict[str, Any] = {}
    for kind in ("philly", "saturn"):
        files = sorted((TRACES / kind).glob("workload-*.csv"), key=lambda p: int(p.stem.split("-")[1]))[:limit]
        runs = []
        for f in files:
            trace = load_trace(f, "sia")
            t0 = time.perf_counter()
            r = run_all(c, trace, ["has", "has-sjf", "fcfs", "fifo", "ilp"])
            r["lower_bound"] = lower_bounds(c, trace)
            runs.append({"file": f.name, **r})
            print(f"  {kind}/{f.name} ({time.perf_counter() - t0:.0f} s): " + ", ".join(
                f"{k} {v['avg_jct_s']:.0f}" for k, v in r.items() if k != "lower_bound"), file=sys.stderr)
        res[kind] = runs
    return res


def scaled_cluster(gpus: int) -> Cluster:
    """phoebe's mix of types scaled up: 3/5.5 RTX nodes, 2/5.5 A100 nodes, 0.5/5.5 Quadro nodes (8 GPUs each)."""
    nodes, k = [], 0
    pattern = ["RTX-2080Ti", "A100-40GB-SXM", "RTX-2080Ti", "A100-40GB-SXM", "RTX-2080Ti", "Quadro-RTX-6000"]
    while sum(n.count for n in nodes) < gpus:
        g = pattern[k % len(pattern)]
        nodes.append(Node(name=f"n{k:04d}", gpu=g, count=8, interconnect="nvlink" if "A100" in g else "pcie"))
        k += 1
    return Cluster(name=f"scaled-{gpus}", nodes=nodes)


def part_c(sizes: list[int], queues: list[int]) -> list[dict[str, Any]]:
    """Decision latency of HAS (one decide per queued job) and of one ILP round, same cluster, same queue."""
    rows = []
    cat = default_catalog()
    for gpus in sizes:
        c = scaled_cluster(gpus)
        for q in queues:
            trace = new_workload(q, seed=7)
            sim = Simulator(c, trace, "ilp")
            rng = random.Random(0)
            busy = []
            for name, k in sim.pool.free.items():  # half the cluster busy, in random per-node amounts
                take = rng.randint(0, k)
                busy.append((name, take))
            sim.pool.take(busy)
            sim.queue = list(range(len(trace)))
            # HAS: the plan list of each queued job, then one decision per job (no state change between them)
            reqs = []
            for job in sim.jobs:
                plans = sim.perf.plans(job.key)
                reqs.append(requests_from_plans(plans, cat, job.key.precision)[0] if plans else [])
            pool = FreePool(sim.perf.node.values(), dict(sim.pool.free))
            lat = []
            for _ in range(3):
                for r in reqs:
                    t0 = time.perf_counter()
                    decide(pool, r)
                    lat.append((time.perf_counter() - t0) * 1e3)
            lat.sort()
            has_round = sum(lat) / 3
            # ILP: one round over the same queue (configurations precomputed, as Sia's profiles are)
            for i in sim.queue:
                sim._configs(i)
            ilp = []
            for _ in range(3):
                sim.decisions_ms.clear()
                snapshot = dict(sim.pool.free)
                sim._round_pending = False
                sim.events.clear()
                sim._ilp_round(0.0)
                ilp.append(sim.decisions_ms[0])
                sim.pool = FreePool(sim.perf.node.values(), snapshot)  # undo the placements
                sim.queue = list(range(len(trace)))
            row = {"gpus": sum(n.count for n in c.nodes), "queue": q,
                   "has_decision_p50_ms": lat[len(lat) // 2], "has_decision_p99_ms": lat[int(len(lat) * 0.99)],
                   "has_queue_pass_ms": has_round, "ilp_round_ms": statistics.median(ilp)}
            row["ilp_over_has_p99"] = row["ilp_round_ms"] / row["has_decision_p99_ms"]
            rows.append(row)
            print(f"  latency {row}", file=sys.stderr)
    return rows


def mean_range(vals: list[float]) -> str:
    return f"{statistics.mean(vals):.0f} ({min(vals):.0f}-{max(vals):.0f})"


def report(a: dict, b: dict, c: list, meta: dict) -> str:
    lines = ["# Placement benchmark (HAS vs fcfs, fifo, Sia-style ILP)", "",
             f"Machine: {meta['machine']}; {meta['date']}; command: `{meta['command']}`; wall {meta['wall_s']:.0f} s.", "",
             "Policies: `has` = MARP plans (balanced ranking) + HAS, arrival order with backfilling (the ledger's "
             "default); `has-sjf` = the same with the queue ordered by MARP's predicted duration; `has-gpus` = "
             "plans ranked by GPU-seconds; `fcfs` = opportunistic FCFS (user's GPU count, highest-compute nodes "
             "first, skip what does not fit); `fifo` = strict; `ilp` = Sia-style per-round MILP (HiGHS). "
             "Averages are over completed jobs; `done` counts them (fcfs/fifo can leave jobs no DDP layout fits).",
             "", "## A. NewWorkload on frenzy-testbed (mean over seeds; avg JCT s, reduction vs fcfs)", ""]
    for n, runs in a.items():
        lines += [f"### {n} jobs, {len(runs)} seeds", "", "| policy | avg JCT s | p99 JCT s | done | OOM | vs fcfs |",
                  "|---|---|---|---|---|---|"]
        fc = statistics.mean(r["fcfs"]["avg_jct_s"] for r in runs)
        for k in VARIANTS:
            avg = statistics.mean(r[k]["avg_jct_s"] for r in runs)
            lines.append(f"| {k} | {avg:.0f} | {statistics.mean(r[k]['p99_jct_s'] for r in runs):.0f} | "
                         f"{statistics.mean(r[k]['completed'] for r in runs):.1f}/{n} | "
                         f"{statistics.mean(r[k]['oom_failures'] for r in runs):.1f} | {(avg / fc - 1) * 100:+.1f}% |")
        lb = statistics.mean(r["lower_bound"]["avg_jct_s"] for r in runs)
        lines += [f"| lower bound | {lb:.0f} | | | | |", ""]
    lines += ["## B. Sia workload files on phoebe (mean (min-max) across files)", ""]
    for kind, runs in b.items():
        lines += [f"### {kind} ({len(runs)} files)", "", "| policy | avg JCT s | p99 JCT s | done | OOM |", "|---|---|---|---|---|"]
        for k in runs[0]:
            if k in ("file", "lower_bound"):
                continue
            lines.append(f"| {k} | {mean_range([r[k]['avg_jct_s'] for r in runs])} | "
                         f"{mean_range([r[k]['p99_jct_s'] for r in runs])} | "
                         f"{statistics.mean(r[k]['completed'] for r in runs):.1f} | "
                         f"{statistics.mean(r[k]['oom_failures'] for r in runs):.1f} |")
        lines += [f"| lower bound | {mean_range([r['lower_bound']['avg_jct_s'] for r in runs])} | | | |", ""]
    lines += ["## C. Decision latency (half-busy cluster; HAS: one `decide` per queued job; ILP: one round)", "",
              "| GPUs | queue | HAS p50 ms | HAS p99 ms | HAS whole queue ms | ILP round ms | ILP round / HAS p99 |",
              "|---|---|---|---|---|---|---|"]
    for r in c:
        lines.append(f"| {r['gpus']} | {r['queue']} | {r['has_decision_p50_ms']:.3f} | {r['has_decision_p99_ms']:.3f} | "
                     f"{r['has_queue_pass_ms']:.1f} | {r['ilp_round_ms']:.1f} | {r['ilp_over_has_p99']:.0f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="2 seeds, 2 files per kind, small latency grid")
    args = ap.parse_args()
    t0 = time.time()
    seeds, files = (2, 2) if args.quick else (5, None)
    print("A: NewWorkload", file=sys.stderr)
    a = part_a(seeds)
    print("B: Sia workloads", file=sys.stderr)
    b = part_b(files)
    print("C: decision latency", file=sys.stderr)
    sizes, queues = ([44, 512], [100]) if args.quick else ([44, 512, 2048], [100, 1000])
    c = part_c(sizes, queues)
    meta = {"machine": f"{platform.machine()} {platform.processor() or ''} Python {platform.python_version()}, "
                       "2 cores, no GPU", "date": str(date.today()),
            "command": "python benchmarks/scheduling.py" + (" --quick" if args.quick else ""), "wall_s": time.time() - t0}
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    (out / "scheduling.json").write_text(json.dumps({"meta": meta, "newworkload": a, "sia": b, "latency": c}, indent=1))
    (out / "scheduling.md").write_text(report(a, b, c, meta))
    print((out / "scheduling.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
