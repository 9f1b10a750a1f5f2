"""The simulator's engine: the event loop, the jobs and the bookkeeping every policy shares (cluster/simulator.py
documents the model; cluster/policies.py holds the policies)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from cluster.catalog import Catalog, default_catalog
from cluster.has import FreePool, GpuRequest, NodeInfo
from cluster.inventory import Cluster
from cluster.jobperf import (
    INTER_NODE_GBS,
    SIM_STEP_MODEL,
    JobKey,
    fits,
    layout_step_time,
    min_memory_that_holds,
    recorded_layout,
    reference_step_time,
    step_time,
    user_layout,
)
from cluster.queue import DEFAULT_AGING, DEFAULT_ORDER, QueueOrder, Running
from cluster.sizing import MIN_SCALING, RESERVE_AFTER
from cluster.traces import REFERENCE_GPU, TraceJob
from tasks.planning.layout import Layout
from tasks.planning.plans import InfeasibleJobError, RankBy, ResourcePlan, plan_resources


@dataclass
class SimConfig:
    reference_gpu: str = REFERENCE_GPU
    oom_after_s: float = 120.0
    round_s: float = 60.0
    queue_order: QueueOrder = DEFAULT_ORDER
    """HAS's queue order (cluster/queue.py): shortest predicted first with aging (default), backfill, strict."""
    aging: float = DEFAULT_AGING
    """Aging of the shortest-first order (cluster/queue.py)."""
    reservation: bool = True
    """HAS reserves GPUs for the head of its queue; backfilling cannot delay it (cluster/queue.py)."""
    reserve_after: float = RESERVE_AFTER
    """...once the head has waited this many times its predicted run time (cluster/sizing.py)."""
    ilp_p: float = -0.5
    ilp_time_limit_s: float = 30.0
    max_plans: int | None = None
    rank_by: RankBy = "balanced"
    user_lowers_micro_batch: bool = True
    baseline_order: Literal["arrival", "shortest"] = "arrival"
    sizing: bool = True
    """HAS sizes each job by load and keeps GPUs busy (cluster/sizing.py); False: the paper's first plan that fits."""
    min_scaling: float = MIN_SCALING
    elastic: Literal["trace", "all", "none"] = "trace"
    """Whether jobs may change their GPU count: as each trace job says (default), all, or none."""


@dataclass
class SimJob:
    trace: TraceJob
    key: JobKey
    steps: float
    num_gpus: int
    seq: int
    min_mem: float = 0.0
    start: float | None = None
    finish: float | None = None
    run_s: float = 0.0
    nodes: list[tuple[str, int]] = field(default_factory=list)
    gpu_type: str = ""
    layout: str = ""
    ooms: int = 0
    unschedulable: str = ""
    user_mb: int | None = None
    """The micro-batch the user runs (a traced job's recorded one; an untraced job's after OOMs); None = global
    batch / GPUs."""
    decision: str = ""
    """has: which plan it ran and why (cluster/sizing.py's record)."""
    elastic: bool = True
    """May a policy run it on another GPU count."""


@dataclass
class SimResult:
    policy: str
    jobs: list[SimJob]
    decisions_ms: list[float]
    rounds_ms: list[float]
    busy_gpu_s: dict[str, float]
    gpus_by_type: dict[str, int]
    backfills_refused: int = 0
    """Placements refused because they would have delayed the queue head past its reservation."""
    idle_violations: int = 0
    """Work-conservation violations (has): after a pass, a waiting job that could have started on idle GPUs and
    finished sooner than by waiting, where no reservation needed those GPUs (cluster/sizing.py)."""
    end_s: float = 0.0
    """When the simulation ended (the last event): unfinished jobs count their JCT up to here."""

    def jcts(self) -> np.ndarray:
        """Every job's JCT; an unfinished job's up to the end of the simulation (a lower bound)."""
        end = max(self.end_s, max((j.finish for j in self.jobs if j.finish is not None), default=0.0))
        return np.array([(j.finish if j.finish is not None else max(end, j.trace.submit_s)) - j.trace.submit_s
                         for j in self.jobs] or [0.0])

    def summary(self) -> SimSummary:
        done = [j for j in self.jobs if j.finish is not None]
        jct = self.jcts()
        queue = np.array([j.finish - j.trace.submit_s - j.run_s for j in done]) if done else np.zeros(1)
        first = min(j.trace.submit_s for j in self.jobs)
        makespan = max((j.finish for j in done), default=first) - first
        dec = np.array(self.decisions_ms or [0.0])
        rnd = np.array(self.rounds_ms or [0.0])
        return SimSummary(
            jobs=len(self.jobs), completed=len(done), unfinished=len(self.jobs) - len(done),
            avg_jct_s=float(jct.mean()), p50_jct_s=float(np.percentile(jct, 50)),
            p99_jct_s=float(np.percentile(jct, 99)), avg_queue_s=float(queue.mean()), max_queue_s=float(queue.max()),
            makespan_s=float(makespan),
            decision_p50_ms=float(np.percentile(dec, 50)), decision_p99_ms=float(np.percentile(dec, 99)),
            decisions=len(self.decisions_ms),
            round_p50_ms=float(np.percentile(rnd, 50)), round_p99_ms=float(np.percentile(rnd, 99)),
            rounds=len(self.rounds_ms),
            oom_failures=sum(j.ooms for j in self.jobs),
            backfills_refused=self.backfills_refused,
            idle_violations=self.idle_violations,
            unschedulable=sum(1 for j in self.jobs if j.unschedulable),
            utilisation={t: round(self.busy_gpu_s.get(t, 0.0) / (n * makespan), 4) if makespan > 0 else 0.0
                         for t, n in self.gpus_by_type.items()},
        )


@dataclass(frozen=True)
class SimSummary:
    """One policy's headline figures over a trace (`frenzy simulate`'s `policies.<name>`, docs/commands.md). JCTs
    count an unfinished job up to the end of the simulation; queue times are over the jobs that finished."""

    jobs: int
    completed: int
    unfinished: int
    avg_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    max_queue_s: float
    makespan_s: float
    decision_p50_ms: float
    decision_p99_ms: float
    decisions: int
    round_p50_ms: float
    round_p99_ms: float
    rounds: int
    oom_failures: int
    backfills_refused: int
    idle_violations: int
    unschedulable: int
    """Jobs no node of the cluster could ever hold."""
    utilisation: dict[str, float]
    """GPU type -> busy GPU-seconds / (its GPUs x makespan), rounded to 4 places."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object `frenzy simulate --json` prints for the policy (fields in declaration order)."""
        return asdict(self)


@dataclass(frozen=True)
class Options:
    """What `has` may run a job on: its requests, the layout of each, and the job's predicted run time (queue order)."""

    requests: list[GpuRequest]
    layouts: list[Layout]
    predicted_s: float


class Perf:
    """Per-cluster caches of plans and per-type node facts."""

    def __init__(self, cluster: Cluster, catalog: Catalog, rank_by: RankBy = "balanced") -> None:
        self.cluster, self.cat, self.rank_by = cluster, catalog, rank_by
        self.node: dict[str, NodeInfo] = {}
        self.inter: dict[str, float] = {}
        for n in cluster.nodes:
            g = catalog.get(n.gpu)
            self.node[n.name] = NodeInfo(n.name, g.name, g.memory_gib, cluster.link_gbs(n, catalog), n.count)
            self.inter[n.name] = n.inter_node_gbs
        self.types = {i.gpu_type for i in self.node.values()}
        self.total = {t: sum(i.capacity for i in self.node.values() if i.gpu_type == t) for t in self.types}
        self.per_node = {t: max(i.capacity for i in self.node.values() if i.gpu_type == t) for t in self.types}
        self.intra = {t: min(i.link_gbs for i in self.node.values() if i.gpu_type == t and i.capacity == self.per_node[t])
                      for t in self.types}
        self._plans: dict[tuple[JobKey, float], list[ResourcePlan] | None] = {}

    def plans(self, key: JobKey, margin: float = 0.05) -> list[ResourcePlan] | None:
        k = (key, margin)
        if k not in self._plans:
            try:
                self._plans[k] = plan_resources(key.spec(), self.cluster, margin=margin, catalog=self.cat,
                                                rank_by=self.rank_by, step_model=SIM_STEP_MODEL)
            except InfeasibleJobError:
                self._plans[k] = None
        return self._plans[k]

    def speed(self, gpu_type: str, precision: str) -> float:
        return self.cat.get(gpu_type).tflops(precision)

    def rigid(self, job: SimJob) -> list[tuple[str, Layout, float]]:
        """(GPU type, layout, run seconds) per type that holds the rigid job at its GPU count: its data-parallel
        layout at the largest micro-batch that fits the type, fastest first."""
        out = []
        for t in sorted(self.types):
            lay = recorded_layout(job.key, t, job.num_gpus)
            if lay is None or job.num_gpus > self.total[t]:
                continue
            per_node = min(job.num_gpus, self.per_node[t])
            out.append((t, lay, job.steps * step_time(job.key, t, lay, self.intra[t], INTER_NODE_GBS, per_node)))
        return sorted(out, key=lambda x: (x[2], x[0]))

    def split_run(self, job: SimJob, gpu_type: str, layout: Layout) -> float | None:
        """The rigid job's run on `gpu_type` when its gang spans nodes (`run_time`'s figure for any split: the data
        parallel all-reduce then crosses the slowest inter-node link of that type); None where one node of the type
        cannot hold it (`rigid`'s run already counts the split) or it needs one GPU."""
        if not 1 < job.num_gpus <= self.per_node[gpu_type]:
            return None
        inter = min(self.inter[n] for n, i in self.node.items() if i.gpu_type == gpu_type)
        return job.steps * step_time(job.key, gpu_type, layout, self.intra[gpu_type], inter, job.num_gpus - 1)

    def mem_gib(self, gpu_type: str) -> float:
        return self.cat.get(gpu_type).memory_gib

    def admits(self, min_mem: float) -> int:
        """GPUs of the cluster with at least `min_mem` GiB."""
        return sum(n for t, n in self.total.items() if self.mem_gib(t) >= min_mem)

    def run_time(self, job: SimJob, nodes: Sequence[tuple[str, int]], layout: Layout | None
                 ) -> tuple[float, Layout | None, str]:
        """(duration, layout, slowest type); layout None = OOM (the user's count does not fit)."""
        infos = [self.node[n] for n, _ in nodes]
        slow = min(infos, key=lambda i: (self.speed(i.gpu_type, job.key.precision), i.gpu_type)).gpu_type
        small = min(infos, key=lambda i: (i.mem_gib, i.gpu_type)).gpu_type
        per_node = max(c for _, c in nodes)
        intra = min(i.link_gbs for i in infos)
        inter = min(self.inter[n] for n, _ in nodes)
        if layout is None:  # the user's own layout on the count they asked for
            layout = user_layout(job.key, sum(c for _, c in nodes), job.user_mb)
        if not fits(job.key, small, layout):
            return 0.0, None, slow
        return job.steps * step_time(job.key, slow, layout, intra, inter, per_node), layout, slow


class Policy(Protocol):
    """A placement policy as the engine drives it (cluster/policies.py has one class per policy)."""

    def never_runs(self, sim: Engine, i: int) -> str:
        """Why job `i` can never run under this policy on this cluster ("" when it can); asked at arrival."""
        ...

    def on_change(self, sim: Engine, now: float) -> None:
        """Jobs arrived or GPUs freed at `now`: place what the policy places (or schedule a round)."""
        ...

    def on_round(self, sim: Engine, now: float) -> None:
        """A round the policy scheduled with `sim.push(t, "round", -1)` is due."""
        ...


class Engine:
    """The event loop and the bookkeeping every policy shares; the policy decides (cluster/policies.py)."""

    def __init__(self, cluster: Cluster, trace: Sequence[TraceJob], policy: Policy, config: SimConfig,
                 name: str, catalog: Catalog | None = None, progress: Callable[[int, int], None] | None = None) -> None:
        self.name, self.policy, self.cfg = name, policy, config
        self.cat = catalog or default_catalog()
        self.perf = Perf(cluster, self.cat, self.cfg.rank_by)
        self.progress = progress
        self.pool = FreePool(self.perf.node.values())
        # arrival order is submit time (a trace file need not be sorted), then position in the file
        arrival = {k: n for n, k in enumerate(sorted(range(len(trace)), key=lambda k: (trace[k].submit_s, k)))}
        self.jobs = [self._job(t, arrival[i]) for i, t in enumerate(trace)]
        self.queue: list[int] = []
        self.events: list[tuple[float, int, str, int]] = []
        self._eseq = 0
        self.decisions_ms: list[float] = []
        self.rounds_ms: list[float] = []
        self.busy: dict[str, float] = {}
        self.running: dict[int, Running] = {}
        """Jobs started with a predicted run time (has): their predicted end, for the reservation and the backlog."""
        self.arrived: list[float] = []
        """Submit times of the jobs that have arrived (the sizer's arrival rate)."""
        self.backfills_refused = 0
        self.idle_violations = 0
        self.now = 0.0

    def _job(self, t: TraceJob, seq: int) -> SimJob:
        """The simulated job: its steps (module docstring) and, for a traced job, the layout its user runs."""
        key = JobKey.of(t)
        elastic = {"trace": t.elastic, "all": True, "none": False}[self.cfg.elastic]
        ref = self.cat.get(self.cfg.reference_gpu).name
        if not t.traced:
            return SimJob(trace=t, key=key, num_gpus=t.num_gpus, seq=seq, elastic=elastic,
                          steps=t.duration_s / reference_step_time(key, ref, t.num_gpus))
        recorded = self.cat.get(t.gpu_type).name if t.gpu_type else ref
        lay = recorded_layout(key, recorded, t.num_gpus)
        if lay is None:
            job = SimJob(trace=t, key=key, num_gpus=t.num_gpus, seq=seq, elastic=elastic,
                         steps=t.duration_s / reference_step_time(key, ref, t.num_gpus))
            job.unschedulable = f"{t.model} does not fit its recorded {t.num_gpus} x {recorded} (the trace says it ran)"
            return job
        job = SimJob(trace=t, key=key, num_gpus=t.num_gpus, seq=seq, elastic=elastic, user_mb=lay.micro_batch,
                     steps=t.duration_s / layout_step_time(key, recorded, lay))
        self._user_request(job)
        return job

    def _user_request(self, job: SimJob) -> None:
        """A traced job's user asks for GPUs that hold its layout (module docstring); where no type of this cluster
        holds the recorded micro-batch, the user lowers it until one does."""
        mb = job.user_mb
        while mb:
            low = min_memory_that_holds(job.key, user_layout(job.key, job.num_gpus, mb), self.perf.types)
            if low is not None:
                job.user_mb, job.min_mem = mb, low
                return
            mb = mb // 2
        job.min_mem = math.inf

    # -- events --------------------------------------------------------------------------------------------
    def push(self, t: float, kind: str, j: int) -> None:
        self._eseq += 1
        heapq.heappush(self.events, (t, self._eseq, kind, j))

    def run(self) -> SimResult:
        for i, j in enumerate(self.jobs):
            self.push(j.trace.submit_s, "arrive", i)
        while self.events:
            self.now = now = self.events[0][0]
            changed = False
            while self.events and self.events[0][0] == now:
                _, _, kind, i = heapq.heappop(self.events)
                if kind == "round":
                    self.policy.on_round(self, now)
                else:
                    changed = self._handle(kind, i, now) or changed
            if changed:
                self.policy.on_change(self, now)
        return SimResult(self.name, self.jobs, self.decisions_ms, self.rounds_ms, self.busy, dict(self.perf.total),
                         self.backfills_refused, self.idle_violations, self.now)

    def _handle(self, kind: str, i: int, now: float) -> bool:
        """An arrival, a finish or an OOM; True when the queue or the free GPUs changed."""
        job = self.jobs[i]
        if kind == "arrive":
            self.arrived.append(now)
            job.unschedulable = job.unschedulable or self.policy.never_runs(self, i)
            if job.unschedulable:
                return False
            self.queue.append(i)
            return True
        self.pool.give(job.nodes)
        self.running.pop(i, None)
        if kind == "finish":
            job.finish = now
            if self.progress:
                self.progress(sum(j.finish is not None for j in self.jobs), len(self.jobs))
        else:
            self._resubmit(i)
        return True

    def start(self, i: int, now: float, nodes: list[tuple[str, int]], layout: Layout | None,
              predicted_s: float | None = None) -> None:
        """Job `i` takes `nodes` now with `layout` (None: its user's own); `predicted_s` feeds the reservation."""
        job = self.jobs[i]
        self.pool.take(nodes)
        if predicted_s is not None:
            self.running[i] = Running(end_s=now + predicted_s, nodes=tuple(nodes))
        job.nodes = nodes
        dur, lay, slow = self.perf.run_time(job, nodes, layout)
        for n, c in nodes:
            t = self.perf.node[n].gpu_type
            self.busy[t] = self.busy.get(t, 0.0) + c * (dur if lay is not None else self.cfg.oom_after_s)
        if lay is None:
            self.push(now + self.cfg.oom_after_s, "oom", i)
            return
        job.start, job.run_s, job.gpu_type, job.layout = now, dur, slow, lay.label()
        self.push(now + dur, "finish", i)

    def _resubmit(self, i: int) -> None:
        """The user's reaction to an OOM (module docstring)."""
        job = self.jobs[i]
        job.ooms += 1
        failed_mem = min(self.perf.node[n].mem_gib for n, _ in job.nodes)
        failed_mb = user_layout(job.key, sum(c for _, c in job.nodes), job.user_mb).micro_batch
        job.nodes = []
        if self.cfg.user_lowers_micro_batch and failed_mb > 1:
            job.user_mb = failed_mb // 2
            self.requeue(i)
            return
        mems = sorted({self.cat.get(t).memory_gib: t for t in self.perf.types}.items())
        n, total = job.num_gpus, sum(self.perf.total.values())
        choice = None
        while n <= total and choice is None:
            for mem, t in mems:  # smallest memory that holds the user's layout at n GPUs (bigger than failed at N)
                if (n > job.num_gpus or mem > failed_mem) and fits(job.key, t, user_layout(job.key, n, job.user_mb)) and \
                        self.perf.admits(mem) >= n:
                    choice = (n, mem)
                    break
            else:
                n *= 2
        if choice is None:
            job.unschedulable = f"no GPU count up to {total} of any type holds {job.trace.model} with DDP"
            return
        job.num_gpus, job.min_mem = choice
        self.requeue(i)

    def requeue(self, i: int) -> None:
        job = self.jobs[i]
        self._eseq += 1
        job.seq = len(self.jobs) + self._eseq  # back of the queue
        self.queue.append(i)
        self.queue.sort(key=lambda k: self.jobs[k].seq)

    # -- what `has` and `ilp` may run a job on --------------------------------------------------------------
    def rigid_options(self, i: int) -> list[tuple[str, Layout, float]]:
        return self.perf.rigid(self.jobs[i])


def silent_highs(highspy: Any) -> Any:
    """A HiGHS instance that prints nothing on stdout. HiGHS 1.16 writes its banner from C in the constructor, before
    any option can be set (output_flag and log_to_console do not stop it: ERGO-Code/HiGHS#2749), so fd 1 points at
    stderr for that call: a `--json` document on stdout stays one document."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h
