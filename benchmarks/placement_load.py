"""The default placement policy against the baselines, tuned on some trace families and reported on held-out ones.

Families, split by source (what `frenzy simulate` runs on each, rescaled to offered loads 0.5, 0.7, 0.9 and 1.1 on
`phoebe`: sum of duration x GPUs asked for, over span x cluster GPUs):
- **Tuning** (the policy's constants, `cluster/sizing.py`, were chosen on these only): Pollux's Philly CSV (first
  400 jobs from 2017-10-09 06:00), Sia's Philly and Saturn workload files (first `--files` of each), the Frenzy
  paper's NewWorkload (60 jobs, 3 seeds).
- **Held out** (never run while tuning): Microsoft ITP day 1 (ElasticFlow's trace, 41 jobs), Alibaba PAI 2023
  `openb` GPU pods (165), the production-shaped generator of issue 26 (400 jobs, 99% 1-GPU; seeds 1-3) and a
  mixed-width generator (200 jobs; seeds 1-3) (`cluster/synth_traces.py`). Provenance: examples/traces/PROVENANCE.md.

Policies: `has` (the default, as `frenzy simulate` runs it), `has-paper` (the previous default: the paper's first
plan that fits, no sizing), `has-arrival` (the default's placement in arrival order), `fcfs`, the Sia-style `ilp`
at load 0.9 (first trace of each family). Also the decision latency of the default at 2,048 GPUs, queue 1,000.

    python benchmarks/placement_load.py               # writes benchmarks/results/placement_load.{json,md}
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from cluster.has import FreePool, decide  # noqa: E402
from cluster.inventory import Cluster, load_cluster  # noqa: E402
from cluster.queue import Running, Waiting, ordered, walk  # noqa: E402
from cluster.simulator import SimConfig, Simulator, lower_bounds, simulate  # noqa: E402
from cluster.sizing import Sizer  # noqa: E402
from cluster.synth_traces import mixed, production  # noqa: E402
from cluster.traces import TraceJob, load_trace, new_workload  # noqa: E402

TRACES = ROOT.parent / "examples" / "traces"
LOADS = (0.5, 0.7, 0.9, 1.1)
MACHINE = "2-core x86_64, shared with other work, no GPU"
DATE = "2026-11-24"


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
           Family("production", "held-out", "issue-26 shape, seeds 1-3", [production(400, s) for s in (1, 2, 3)]),
           Family("mixed", "held-out", "mixed widths, seeds 1-3", [mixed(200, s) for s in (1, 2, 3)]),
           Family("philly", "tuning", "Microsoft Philly 2017 (Pollux CSV)",
                  [load_trace(TRACES / "philly.csv", "philly", max_jobs=400)])]
    for kind, src in (("philly", "Philly"), ("saturn", "SenseTime Helios Saturn")):
        paths = sorted((TRACES / "sia-workloads" / kind).glob("workload-*.csv"), key=lambda p: int(p.stem.split("-")[1]))
        out.append(Family(f"sia-{kind}", "tuning", f"{src} (Sia workloads)", [load_trace(p, "sia") for p in paths[:files]]))
    out.append(Family("newworkload", "tuning", "Frenzy NewWorkload, seeds 0-2",
                      [new_workload(60, seed=s, mean_interarrival_s=120.0) for s in range(3)]))
    return out


def at_load(trace: list[TraceJob], cluster: Cluster, load: float) -> list[TraceJob]:
    """The trace with its arrival times stretched or squeezed to the offered load."""
    gpus = sum(n.count for n in cluster.nodes)
    work = sum(t.duration_s * t.num_gpus for t in trace)
    t0, t1 = min(t.submit_s for t in trace), max(t.submit_s for t in trace)
    f = (work / (load * gpus)) / max(t1 - t0, 1.0)
    return [dataclasses.replace(t, submit_s=(t.submit_s - t0) * f) for t in trace]


POLICIES: dict[str, tuple[str, SimConfig]] = {"has": ("has", SimConfig()), "has-paper": ("has", SimConfig(sizing=False)),
                                              "has-arrival": ("has-arrival", SimConfig()), "fcfs": ("fcfs", SimConfig()),
                                              "ilp": ("ilp", SimConfig())}


def row_for(c: Cluster, fam: Family, load: float, with_ilp: bool) -> dict[str, Any]:
    acc: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES if p != "ilp" or with_ilp}
    lbs = []
    for k, tr in enumerate(fam.traces):
        t2 = at_load(tr, c, load)
        lbs.append(lower_bounds(c, t2, SimConfig())["avg_jct_s"])
        for p in acc:
            if p == "ilp" and k > 0:
                continue
            pol, cfg = POLICIES[p]
            acc[p].append(simulate(c, t2, pol, cfg).summary())  # type: ignore[arg-type]
    row: dict[str, Any] = {"family": fam.name, "role": fam.role, "source": fam.source, "traces": len(fam.traces),
                           "jobs": sum(len(t) for t in fam.traces), "load": load, "lower_bound_avg_jct_s":
                           statistics.mean(lbs)}
    for p, runs in acc.items():
        row[p] = {k: statistics.mean(r[k] for r in runs) for k in ("avg_jct_s", "p99_jct_s", "avg_queue_s")}
        row[p]["idle_violations"] = sum(r.get("idle_violations", 0) for r in runs)
        row[p]["decision_p99_ms"] = max(r["decision_p99_ms"] for r in runs)
    if with_ilp:  # the ILP ran on the first trace only: compare the default on that one
        t2 = at_load(fam.traces[0], c, load)
        row["has_first"] = simulate(c, t2, "has", SimConfig()).summary()["avg_jct_s"]
    return row


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


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| family | source | traces (jobs) | load | has avg JCT s | vs fcfs | p99 vs fcfs | vs has-paper | "
             "vs has-arrival | vs ilp (first trace) | idle violations | has / lower bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        h, f = r["has"], r["fcfs"]
        ilp = pct(r["has_first"], r["ilp"]["avg_jct_s"]) if "ilp" in r else ""
        lines.append(f"| {r['family']} | {r['source']} | {r['traces']} ({r['jobs']}) | {r['load']} | "
                     f"{h['avg_jct_s']:.0f} | {pct(h['avg_jct_s'], f['avg_jct_s'])} | "
                     f"{pct(h['p99_jct_s'], f['p99_jct_s'])} | {pct(h['avg_jct_s'], r['has-paper']['avg_jct_s'])} | "
                     f"{pct(h['avg_jct_s'], r['has-arrival']['avg_jct_s'])} | {ilp} | {h['idle_violations']} | "
                     f"{h['avg_jct_s'] / r['lower_bound_avg_jct_s']:.2f}x |")
    return lines


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, row by row: which rows miss which."""
    miss = {"avg JCT not >= 15% below fcfs": [], "avg JCT worse than fcfs": [], "p99 JCT worse than fcfs": [],
            "avg JCT not >= 10% below ilp (0.9)": [], "idle violations": []}
    for r in rows:
        tag = f"{r['family']}@{r['load']}"
        h, f = r["has"], r["fcfs"]
        if h["avg_jct_s"] > 0.85 * f["avg_jct_s"]:
            miss["avg JCT not >= 15% below fcfs"].append(f"{tag} ({pct(h['avg_jct_s'], f['avg_jct_s'])})")
        if h["avg_jct_s"] > f["avg_jct_s"]:
            miss["avg JCT worse than fcfs"].append(tag)
        if h["p99_jct_s"] > f["p99_jct_s"]:
            miss["p99 JCT worse than fcfs"].append(f"{tag} ({pct(h['p99_jct_s'], f['p99_jct_s'])})")
        if "ilp" in r and r["has_first"] > 0.9 * r["ilp"]["avg_jct_s"]:
            miss["avg JCT not >= 10% below ilp (0.9)"].append(f"{tag} ({pct(r['has_first'], r['ilp']['avg_jct_s'])})")
        if h["idle_violations"]:
            miss["idle violations"].append(f"{tag} ({h['idle_violations']})")
    return [f"- {k}: {len(v)} of {len(rows)} rows" + (f": {', '.join(v)}" if v else "") for k, v in miss.items()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=3, help="Sia workload files per kind (default 3)")
    ap.add_argument("--no-ilp", action="store_true")
    a = ap.parse_args()
    c = load_cluster("phoebe")
    t_start = time.time()
    rows = []
    for fam in families(a.files):
        for load in LOADS:
            rows.append(row_for(c, fam, load, with_ilp=load == 0.9 and not a.no_ilp))
            r = rows[-1]
            print(f"{fam.role} {fam.name} load {load}: has {r['has']['avg_jct_s']:.0f} fcfs {r['fcfs']['avg_jct_s']:.0f} "
                  f"paper {r['has-paper']['avg_jct_s']:.0f} arrival {r['has-arrival']['avg_jct_s']:.0f}",
                  file=sys.stderr, flush=True)
    lat = latency(2048, 1000)
    meta = {"machine": MACHINE, "date": DATE, "cluster": "phoebe", "wall_s": time.time() - t_start,
            "command": "python benchmarks/placement_load.py" + (" --no-ilp" if a.no_ilp else "")}
    out = ROOT / "results"
    (out / "placement_load.json").write_text(json.dumps({"meta": meta, "rows": rows, "latency": lat}, indent=1))
    held = [r for r in rows if r["role"] == "held-out"]
    tuned = [r for r in rows if r["role"] == "tuning"]
    arrival_worse = sum(r["has-arrival"]["avg_jct_s"] > r["has"]["avg_jct_s"] for r in rows)
    lines = [f"# Placement under load, held-out trace families first ({DATE}, {MACHINE}, cluster phoebe)", "",
             f"`{meta['command']}`, wall {meta['wall_s']:.0f} s. `has` is the default as `frenzy simulate` runs it "
             "(MARP plans; queue shortest-predicted-first with aging and a reservation for its head; per job the plan "
             "chosen by cluster/sizing.py: earliest predicted finish, best throughput per GPU while jobs wait, wider "
             "when GPUs would idle). `has-paper` is the previous default (the paper's first plan that fits). Averages "
             "over the family's traces; the ILP ran on each family's first trace at load 0.9 and is compared with the "
             "default on that trace. Idle violations: after a scheduling pass, a waiting job that could have started "
             "on idle GPUs and finished sooner than by waiting, where no reservation needed them (0 is the invariant).",
             "", "## Held-out families (never run while tuning)", "", *table(held), "", *verdict(held), "",
             "## Tuning families (the constants of cluster/sizing.py were chosen on these)", "", *table(tuned), "",
             *verdict(tuned), "", "## has-arrival", "",
             f"`has-arrival` (the default's placement in arrival order) has a higher average JCT than `has` in "
             f"{arrival_worse} of {len(rows)} rows; it is no longer in the default policy list of `frenzy simulate`.",
             "", "## Decision latency", "",
             f"One `Sizer.pick` per queued job in one pass (the code the ledger and the simulator run), "
             f"{lat['gpus']} GPUs (phoebe's mix scaled up), queue {lat['queue']} production-shaped jobs, half the "
             f"GPUs busy with random predicted ends, 3 passes, garbage collection off while timing: p50 {lat['p50_ms']:.3f} ms, "
             f"p99 {lat['p99_ms']:.3f} ms over {lat['decisions']} decisions (target p99 < 1 ms). In the same run the "
             f"paper's decision (first plan that fits, no sizing) on the same pools: p50 {lat['paper_p50_ms']:.3f} ms, "
             f"p99 {lat['paper_p99_ms']:.3f} ms; sizing costs {lat['p99_ms'] / lat['paper_p99_ms']:.1f}x at the p99. "
             "The machine was shared with other work: compare the two in this run, not across runs."]
    (out / "placement_load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
