"""Trace-driven, discrete-event simulator of non-preemptive jobs on a heterogeneous cluster.

The engine here replays arrivals and completions; what runs where is a policy's (`cluster/policies.py`, one class
per policy behind one protocol). A job's work is `steps` optimizer steps; on an allocation it runs `steps x
step_time(layout, slowest GPU of the allocation, its links)`; both models are MARP's (`cluster/jobperf.py`). The same
models decide OOM: a layout whose predicted peak exceeds the memory of the smallest GPU it got fails.

**Jobs keep what the trace says** (`TraceJob.traced`, cluster/traces.py): the steps of a traced job are calibrated so
that its recorded layout (`jobperf.recorded_layout`: data parallel on its recorded GPU count, the largest micro-batch
that fits) takes its recorded run time on its recorded GPU type (the reference GPU where the trace has none). Its user
runs that layout and asks for GPUs that hold it: `num_gpus` GPUs with at least `min_mem` GiB, the smallest memory such
that every cluster type with at least that much holds the layout (a user who ran the job knows what it needs), so no
baseline pays an OOM restart for a job that really ran. A job nothing of the cluster can hold at its count is counted
`unschedulable` at arrival, by each policy for what that policy may run it on.
An untraced job (the NewWorkload generator, whose user does not plan memory) keeps the behaviour of the Frenzy paper's
baseline: its user asks for a count only, runs DDP at global batch / GPUs, and can OOM: the job holds its GPUs for
`oom_after_s` (start-up and the first step), fails, and is resubmitted at the back of the queue by a user who applies
the usual fixes in order: halve the micro-batch (gradient accumulation keeps the global batch) down to 1; then ask for
GPUs with more memory than the one that failed; if no such GPU can hold the job at that count, double the count.
(With `user_lowers_micro_batch=False` the first fix is skipped, the behaviour before 2026-11-22.)

**Elastic or rigid** (`TraceJob.elastic`; `SimConfig.elastic` overrides it for every job): an elastic job may run on
any of MARP's plans (has) or configurations (ilp); a rigid one keeps its GPU count under every policy, on any GPU type
whose memory holds its data-parallel layout at some micro-batch.

**Honest metrics** (`SimResult.summary`): every average and percentile is over all jobs; a job not finished when the
simulation ends (never schedulable, or left waiting) counts with its JCT up to that end (a lower bound) and is
counted (`unfinished`, `unschedulable`) next to the averages. Decision latency is timed with `time.perf_counter`
around the decision function only (per decision), and around each scheduling pass or ILP round (per round).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from cluster.catalog import Catalog
from cluster.inventory import Cluster
from cluster.jobperf import fits, layouts_exact, step_time
from cluster.policies import make_policy
from cluster.sim_engine import Engine, Options, Perf, SimConfig, SimJob, SimResult, SimSummary
from cluster.traces import ALL_POLICIES, PolicyName, TraceJob
from tasks.errors import FrenzyError

__all__ = ["LowerBounds", "Options", "Perf", "SimConfig", "SimJob", "SimResult", "SimSummary", "Simulator",
           "lower_bounds", "simulate"]


class Simulator(Engine):
    """The engine driven by the policy of that name (`ALL_POLICIES`)."""

    def __init__(self, cluster: Cluster, trace: Sequence[TraceJob], policy: PolicyName,
                 config: SimConfig | None = None, catalog: Catalog | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        if policy not in ALL_POLICIES:
            raise FrenzyError(f"unknown policy {policy!r}; choose from {', '.join(ALL_POLICIES)}")
        pol, cfg = make_policy(policy, config or SimConfig())
        super().__init__(cluster, trace, pol, cfg, policy, catalog, progress)


def simulate(cluster: Cluster, trace: Sequence[TraceJob], policy: PolicyName, config: SimConfig | None = None,
             catalog: Catalog | None = None, progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Run one policy over a trace."""
    return Simulator(cluster, trace, policy, config, catalog, progress).run()


def _srpt_flow(release: list[float], size: list[float], rate: float) -> float:
    """Total flow time of preemptive SRPT on one machine of speed `rate` (a lower bound on sum of JCTs)."""
    order = sorted(range(len(release)), key=lambda k: release[k])
    heap: list[tuple[float, int]] = []
    t, total, k = 0.0, 0.0, 0
    while k < len(order) or heap:
        if not heap:
            t = max(t, release[order[k]])
        while k < len(order) and release[order[k]] <= t:
            heapq.heappush(heap, (size[order[k]] / rate, order[k]))
            k += 1
        rem, j = heapq.heappop(heap)
        nxt = release[order[k]] if k < len(order) else math.inf
        if t + rem <= nxt:
            t += rem
            total += t - release[j]
        else:
            heapq.heappush(heap, (rem - (nxt - t), j))
            t = nxt
    return total


@dataclass(frozen=True)
class LowerBounds:
    """What no schedule of the trace can beat under the simulator's models (`lower_bounds`); 0.0 for a trace of
    which no job fits."""

    avg_jct_s: float
    makespan_s: float

    def to_json(self) -> dict[str, float]:
        """The JSON object `frenzy simulate --json` prints as `lower_bounds`."""
        return asdict(self)


def lower_bounds(cluster: Cluster, trace: Sequence[TraceJob], config: SimConfig | None = None,
                 catalog: Catalog | None = None) -> LowerBounds:
    """Lower bounds on average JCT and makespan under the simulator's models (derived here; reported by
    `frenzy simulate` as `lower_bounds`, docs/commands.md).

    A relaxed GPU holds any allocation: the memory of the cluster's largest GPU, the speed of its fastest, its
    best links. d_j* = steps x the fastest memory-feasible layout on 1..G relaxed GPUs (a rigid job: on its own
    count); w_j = steps x the fewest GPU-seconds per step. avg JCT >= max(mean d_j*, SRPT flow time of the w_j on one
    machine as fast as all G GPUs / n); makespan >= max(max_j a_j + d_j*, min_j a_j + sum w_j / G)."""
    sim = Simulator(cluster, trace, "fcfs", config, catalog)
    p = sim.perf
    g_total = sum(p.total.values())
    big = max(p.types, key=lambda t: sim.cat.get(t).memory_gib)
    per_node = max(i.capacity for i in p.node.values())
    intra = max(i.link_gbs for i in p.node.values())
    inter = max(p.inter.values())
    d_star, work, rel = [], [], []
    for j in sim.jobs:
        fast = max(p.types, key=lambda t: p.speed(t, j.key.precision))
        times = []
        for c in range(1, g_total + 1) if j.elastic else [j.num_gpus]:
            for lay in layouts_exact(j.key, c, per_node):
                if fits(j.key, big, lay):
                    times.append((step_time(j.key, fast, lay, intra, inter, per_node), c))
        if not times:
            continue
        d_star.append(j.steps * min(t for t, _ in times))
        work.append(j.steps * min(t * c for t, c in times))
        rel.append(j.trace.submit_s)
    if not d_star:
        return LowerBounds(avg_jct_s=0.0, makespan_s=0.0)
    avg = max(sum(d_star) / len(d_star), _srpt_flow(rel, work, g_total) / len(d_star))
    mk = max(max(a + d for a, d in zip(rel, d_star, strict=True)), min(rel) + sum(work) / g_total) - min(rel)
    return LowerBounds(avg_jct_s=avg, makespan_s=mk)


