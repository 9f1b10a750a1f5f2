"""Trace-driven, discrete-event simulator of rigid jobs on a heterogeneous cluster, with four placement policies.

Jobs are rigid and non-preemptive. A job's work is `steps` optimizer steps, fixed from its trace duration: the
trace duration divided by the step time of its fastest layout on `num_gpus` reference GPUs. On an allocation
it runs `steps x step_time(layout, slowest GPU of the allocation, its links)`; both models are MARP's
(`cluster/jobperf.py`). The same models decide OOM: a layout whose predicted peak exceeds the memory of the
smallest GPU it got fails.

Policies
- `has`: MARP plans (ranked `balanced` by default, `rank_by`) placed by HAS (`cluster/has.py`); queue in
  arrival order with backfilling (`queue_order="strict"` for head-of-line blocking, `"shortest"` for MARP's
  predicted run time, shortest first, with backfilling). `has-sjf` is `has` with `queue_order="shortest"`.
- `fcfs`: opportunistic scheduling as the Frenzy paper defines it: the user's GPU count, nodes with the highest
  compute first (then most free, then name), first come first served; a job that does not fit now is skipped.
  Memory-unaware, so a job can OOM.
- `fifo`: the same placement, strict arrival order (a job that does not fit blocks those behind it).
- `baseline_order="shortest"` orders the fcfs/fifo queue by the trace's run time (an oracle the user does not
  have): the same-order ablation that separates HAS's placement from its queue order.
- `ilp`: in the style of Sia: every `round_s` seconds after a change, one MILP over (waiting job x GPU type x
  GPU count) chooses at most one configuration per job to maximise the sum of Sia's goodput utility
  `1 + (1 - g^p) / -p` (p = -0.5, g = the configuration's speed-up over the job's smallest configuration),
  subject to the free GPUs per type; solved with HiGHS. Chosen configurations are packed on nodes of that type
  by best fit; one that does not pack waits for the next round. Configurations are memory-feasible (Sia profiles
  its jobs), counts are powers of two up to twice the user's request.

The user's layout (fcfs, fifo): DDP on the GPUs asked for, micro-batch = global batch / GPUs (no gradient
accumulation, no TP/PP), as a user who sizes by GPU count runs it (`jobperf.user_layout`).

OOM and resubmission (fcfs, fifo): a job whose layout does not fit holds its GPUs for `oom_after_s` (start-up
and the first step), fails, and is resubmitted at the back of the queue by a user who applies the usual fixes
in order: halve the micro-batch (gradient accumulation keeps the global batch) down to 1; then ask for GPUs
with more memory than the one that failed; if no such GPU can hold the job at that count, double the count.
(With `user_lowers_micro_batch=False` the first fix is skipped, the behaviour before 2026-11-22.) A job nothing
can ever hold is counted `unschedulable`.

Decision latency is timed with `time.perf_counter` around the decision function only: one HAS `decide` (or
fcfs placement) per job tried, one MILP build+solve per `ilp` round.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from cluster.catalog import Catalog, default_catalog
from cluster.has import FreePool, GpuRequest, NodeInfo, decide, place, requests_from_plans
from cluster.inventory import Cluster
from cluster.jobperf import INTER_NODE_GBS, JobKey, best_layout, fits, layouts_exact, reference_step_time, step_time, user_layout
from cluster.queue import DEFAULT_AGING, DEFAULT_ORDER, Admit, QueueOrder, Reservation, Running, Waiting, ordered, reserve, walk
from cluster.sizing import MIN_SCALING, Sizer, exact_type_requests
from cluster.traces import ALL_POLICIES, REFERENCE_GPU, PolicyName, TraceJob
from tasks.errors import FrenzyError
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
    ilp_p: float = -0.5
    ilp_time_limit_s: float = 30.0
    max_plans: int | None = None
    rank_by: RankBy = "balanced"
    user_lowers_micro_batch: bool = True
    baseline_order: Literal["arrival", "shortest"] = "arrival"
    sizing: bool = True
    """HAS sizes each job by load and keeps GPUs busy (cluster/sizing.py); False: the paper's first plan that fits."""
    min_scaling: float = MIN_SCALING


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
    """The micro-batch the user lowered to after OOMs (fcfs/fifo); None = global batch / GPUs."""
    decision: str = ""
    """has: which plan it ran and why (cluster/sizing.py's record)."""


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

    def summary(self) -> dict[str, Any]:
        done = [j for j in self.jobs if j.finish is not None]
        jct = np.array([j.finish - j.trace.submit_s for j in done]) if done else np.zeros(1)
        queue = np.array([j.finish - j.trace.submit_s - j.run_s for j in done]) if done else np.zeros(1)
        first = min(j.trace.submit_s for j in self.jobs)
        makespan = max((j.finish for j in done), default=first) - first
        dec = np.array(self.decisions_ms or [0.0])
        rnd = np.array(self.rounds_ms or [0.0])
        return {
            "jobs": len(self.jobs), "completed": len(done),
            "avg_jct_s": float(jct.mean()), "p50_jct_s": float(np.percentile(jct, 50)),
            "p99_jct_s": float(np.percentile(jct, 99)), "avg_queue_s": float(queue.mean()),
            "max_queue_s": float(queue.max()),
            "makespan_s": float(makespan),
            "decision_p50_ms": float(np.percentile(dec, 50)), "decision_p99_ms": float(np.percentile(dec, 99)),
            "decisions": len(self.decisions_ms),
            "round_p50_ms": float(np.percentile(rnd, 50)), "round_p99_ms": float(np.percentile(rnd, 99)),
            "oom_failures": sum(j.ooms for j in self.jobs),
            "backfills_refused": self.backfills_refused,
            "idle_violations": self.idle_violations,
            "unschedulable": sum(1 for j in self.jobs if j.unschedulable),
            "utilisation": {t: round(self.busy_gpu_s.get(t, 0.0) / (n * makespan), 4) if makespan > 0 else 0.0
                            for t, n in self.gpus_by_type.items()},
        }


class _Perf:
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
                                                rank_by=self.rank_by)
            except InfeasibleJobError:
                self._plans[k] = None
        return self._plans[k]

    def speed(self, gpu_type: str, precision: str) -> float:
        return self.cat.get(gpu_type).tflops(precision)

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


class Simulator:
    def __init__(self, cluster: Cluster, trace: Sequence[TraceJob], policy: PolicyName,
                 config: SimConfig | None = None, catalog: Catalog | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        if policy not in ALL_POLICIES:
            raise FrenzyError(f"unknown policy {policy!r}; choose from {', '.join(ALL_POLICIES)}")
        self.cfg = config or SimConfig()
        self.name = policy
        if policy == "has-sjf":  # the old name of the default
            policy, self.cfg = "has", dataclasses.replace(self.cfg, queue_order="shortest")
        elif policy == "has-arrival":
            policy, self.cfg = "has", dataclasses.replace(self.cfg, queue_order="backfill")
        self.cat = catalog or default_catalog()
        self.perf = _Perf(cluster, self.cat, self.cfg.rank_by)
        self.policy = policy
        self.progress = progress
        self.pool = FreePool(self.perf.node.values())
        ref = self.cat.get(self.cfg.reference_gpu).name
        keys = [JobKey.of(t) for t in trace]
        # arrival order is submit time (a trace file need not be sorted), then position in the file
        arrival = {k: n for n, k in enumerate(sorted(range(len(trace)), key=lambda k: (trace[k].submit_s, k)))}
        self.jobs = [SimJob(trace=t, key=k, num_gpus=t.num_gpus, seq=arrival[i],
                            steps=t.duration_s / reference_step_time(k, ref, t.num_gpus))
                     for i, (t, k) in enumerate(zip(trace, keys, strict=True))]
        self.queue: list[int] = []
        self.events: list[tuple[float, int, str, int]] = []
        self._eseq = 0
        self.decisions_ms: list[float] = []
        self.rounds_ms: list[float] = []
        self.busy: dict[str, float] = {}
        self._round_pending = False
        self._reqs: dict[int, tuple[list[GpuRequest], list[int], list[ResourcePlan]] | None] = {}
        self._ilp_cfgs: dict[int, list[tuple[str, int, Layout, float]]] = {}
        self._running: dict[int, Running] = {}
        self.backfills_refused = 0  # HAS's running jobs with their predicted end, for the reservation
        self.idle_violations = 0

    # -- events --------------------------------------------------------------------------------------------
    def _push(self, t: float, kind: str, j: int) -> None:
        self._eseq += 1
        heapq.heappush(self.events, (t, self._eseq, kind, j))

    def run(self) -> SimResult:
        for i, j in enumerate(self.jobs):
            self._push(j.trace.submit_s, "arrive", i)
        done = 0
        while self.events:
            now = self.events[0][0]
            changed = False
            while self.events and self.events[0][0] == now:
                _, _, kind, i = heapq.heappop(self.events)
                if kind == "arrive":
                    job, total = self.jobs[i], sum(self.perf.total.values())
                    if self.policy in ("fcfs", "fifo") and job.num_gpus > total:
                        # the user's count can never start: a real scheduler rejects it, fifo must not block on it
                        job.unschedulable = f"asks for {job.num_gpus} GPUs; the cluster has {total}"
                        continue
                    self.queue.append(i)
                    changed = True
                elif kind in ("finish", "oom"):
                    job = self.jobs[i]
                    self.pool.give(job.nodes)
                    self._running.pop(i, None)
                    changed = True
                    if kind == "finish":
                        job.finish = now
                        done += 1
                        if self.progress:
                            self.progress(done, len(self.jobs))
                    else:
                        self._resubmit(i, now)
                elif kind == "round":
                    self._round_pending = False
                    self._ilp_round(now)
            if changed:
                if self.policy == "ilp":
                    if not self._round_pending and self.queue:
                        self._round_pending = True
                        self._push(math.floor(now / self.cfg.round_s + 1) * self.cfg.round_s, "round", -1)
                else:
                    self._schedule(now)
        return SimResult(self.name, self.jobs, self.decisions_ms, self.rounds_ms, self.busy, dict(self.perf.total),
                         self.backfills_refused, self.idle_violations)

    def _start(self, i: int, now: float, nodes: list[tuple[str, int]], layout: Layout | None,
               predicted_s: float | None = None) -> None:
        job = self.jobs[i]
        self.pool.take(nodes)
        if predicted_s is not None:
            self._running[i] = Running(end_s=now + predicted_s, nodes=tuple(nodes))
        job.nodes = nodes
        dur, lay, slow = self.perf.run_time(job, nodes, layout)
        for n, c in nodes:
            t = self.perf.node[n].gpu_type
            self.busy[t] = self.busy.get(t, 0.0) + c * (dur if lay is not None else self.cfg.oom_after_s)
        if lay is None:
            self._push(now + self.cfg.oom_after_s, "oom", i)
            return
        job.start, job.run_s, job.gpu_type, job.layout = now, dur, slow, lay.label()
        self._push(now + dur, "finish", i)

    def _resubmit(self, i: int, now: float) -> None:
        """The user's reaction to an OOM (module docstring)."""
        job = self.jobs[i]
        job.ooms += 1
        failed_mem = min(self.perf.node[n].mem_gib for n, _ in job.nodes)
        failed_mb = user_layout(job.key, sum(c for _, c in job.nodes), job.user_mb).micro_batch
        job.nodes = []
        if self.cfg.user_lowers_micro_batch and failed_mb > 1:
            job.user_mb = failed_mb // 2
            self._requeue(i)
            return
        mems = sorted({self.cat.get(t).memory_gib: t for t in self.perf.types}.items())
        n, total = job.num_gpus, sum(self.perf.total.values())
        choice = None
        while n <= total and choice is None:
            for mem, t in mems:  # smallest memory that holds the user's layout at n GPUs (bigger than failed at N)
                if (n > job.num_gpus or mem > failed_mem) and fits(job.key, t, user_layout(job.key, n, job.user_mb)) and \
                        sum(c for tt, c in self.perf.total.items() if self.cat.get(tt).memory_gib >= mem) >= n:
                    choice = (n, mem)
                    break
            else:
                n *= 2
        if choice is None:
            job.unschedulable = f"no GPU count up to {total} of any type holds {job.trace.model} with DDP"
            return
        job.num_gpus, job.min_mem = choice
        self._requeue(i)

    def _requeue(self, i: int) -> None:
        job = self.jobs[i]
        self._eseq += 1
        job.seq = len(self.jobs) + self._eseq  # back of the queue
        self.queue.append(i)
        self.queue.sort(key=lambda k: self.jobs[k].seq)

    # -- has / fcfs / fifo ---------------------------------------------------------------------------------
    def _has_requests(self, i: int) -> tuple[list[GpuRequest], list[int], list[ResourcePlan]] | None:
        if i not in self._reqs:
            job = self.jobs[i]
            plans = self.perf.plans(job.key)
            if plans is None:
                self._reqs[i] = None
            else:
                plans = plans[: self.cfg.max_plans] if self.cfg.max_plans else plans
                if self.cfg.sizing:
                    reqs, idx = exact_type_requests(plans, job.steps)
                else:
                    reqs, idx = requests_from_plans(plans, self.cat, job.key.precision, job.steps)
                self._reqs[i] = (reqs, idx, plans)
        return self._reqs[i]

    def _fcfs_place(self, job: SimJob) -> list[tuple[str, int]] | None:
        prec = job.key.precision
        nodes = [i for i in self.perf.node.values() if i.mem_gib >= job.min_mem and self.pool.free[i.name] > 0]
        if sum(self.pool.free[i.name] for i in nodes) < job.num_gpus:
            return None
        nodes.sort(key=lambda i: (-self.perf.speed(i.gpu_type, prec), -self.pool.free[i.name], i.name))
        out, need = [], job.num_gpus
        for i in nodes:
            k = min(need, self.pool.free[i.name])
            out.append((i.name, k))
            need -= k
            if need == 0:
                break
        return out

    def _predicted_s(self, i: int) -> float:
        reqs = self._has_requests(i)
        return math.inf if reqs is None else self.jobs[i].steps * reqs[2][0].est_step_time_s

    def _schedule(self, now: float) -> None:
        """One pass over the queue with cluster/queue.py's discipline: the code the live ledger runs."""
        t0 = time.perf_counter()
        if self.policy == "has":
            order: QueueOrder = self.cfg.queue_order
            aging = self.cfg.aging
        else:  # fcfs skips what does not fit (backfill); fifo blocks; the oracle ablation orders by true run time
            order = "strict" if self.policy == "fifo" else \
                "shortest" if self.cfg.baseline_order == "shortest" else "backfill"
            aging = 0.0
        waiting = []
        for i in self.queue:
            job = self.jobs[i]
            if job.unschedulable:
                continue
            pred = (self._predicted_s(i) if self.policy == "has" else job.trace.duration_s) if order == "shortest" \
                else None
            waiting.append(Waiting(job=i, seq=job.seq, submitted_s=job.trace.submit_s,
                                   predicted_s=None if pred is None or math.isinf(pred) else pred))

        def try_place(w: Waiting, admit: Admit) -> bool:
            i = int(w.job)  # type: ignore[call-overload]
            job = self.jobs[i]
            if self.pool.total_free() == 0:
                return False
            if self.policy == "has":
                reqs = self._has_requests(i)
                if reqs is None:
                    job.unschedulable = "MARP: no layout fits any GPU of the cluster"
                    return False
                d0 = time.perf_counter()
                d = decide(self.pool, reqs[0])
                self.decisions_ms.append((time.perf_counter() - d0) * 1e3)
                if d is None:
                    return False
                run_s = d.request.run_s  # the chosen plan's prediction (the run itself may take longer)
                if not admit(d.nodes, run_s):
                    self.backfills_refused += 1
                    return False
                self._start(i, now, d.nodes, reqs[2][reqs[1][d.plan_index]].layout, run_s)
                return True
            d0 = time.perf_counter()
            nodes = self._fcfs_place(job)
            self.decisions_ms.append((time.perf_counter() - d0) * 1e3)
            if nodes is None:
                return False
            self._start(i, now, nodes, None)
            return True

        def reserve_for(w: Waiting) -> Reservation | None:
            reqs = self._has_requests(int(w.job))  # type: ignore[call-overload]
            if reqs is None:
                return None
            return reserve(w.job, self.pool, self._running.values(), now, lambda at: decide(at, reqs[0]) is not None)

        use_res = self.policy == "has" and self.cfg.reservation
        if self.policy == "has" and self.cfg.sizing:
            left = self._walk_sized(waiting, order, aging, now)
        else:
            _, left, _ = walk(waiting, order, now, try_place, aging, reserve_for=reserve_for if use_res else None)
        self.queue = [int(w.job) for w in left if not self.jobs[int(w.job)].unschedulable]  # type: ignore[call-overload]
        self.rounds_ms.append((time.perf_counter() - t0) * 1e3)

    def _walk_sized(self, waiting: list[Waiting], order: QueueOrder, aging: float, now: float) -> list[Waiting]:
        """HAS with cluster/sizing.py's choice per job (the ledger's code path); counts idle-GPU violations."""
        reqs_of = {w.job: r[0] for w in waiting if (r := self._has_requests(int(w.job))) is not None}  # type: ignore[call-overload]
        for w in waiting:
            if w.job not in reqs_of:
                self.jobs[int(w.job)].unschedulable = "MARP: no layout fits any GPU of the cluster"  # type: ignore[call-overload]
        sizer = Sizer(self.pool, list(self._running.values()), now, ordered(waiting, order, now, aging), reqs_of,
                      self.cfg.min_scaling)

        def try_place(w: Waiting, admit: Admit) -> bool:
            i = int(w.job)  # type: ignore[call-overload]
            picked = sizer.pick(w, admit)
            if picked is None:
                return False
            d, why = picked
            entry = self._reqs[i]
            assert entry is not None
            self._start(i, now, d.nodes, entry[2][entry[1][d.plan_index]].layout, d.request.run_s)
            self.jobs[i].decision = why
            return True

        _, left, res = walk(waiting, order, now, try_place, aging,
                            reserve_for=sizer.reserve_for if self.cfg.reservation else None)
        self.decisions_ms += sizer.decision_ms
        self.backfills_refused += sizer.refused
        self.idle_violations += sizer.violations(left, res)
        for w in left:
            if w.job in sizer.records:
                self.jobs[int(w.job)].decision = sizer.records[w.job]  # type: ignore[call-overload]
        return left

    # -- ilp -----------------------------------------------------------------------------------------------
    def _configs(self, i: int) -> list[tuple[str, int, Layout, float]]:
        if i not in self._ilp_cfgs:
            job, p = self.jobs[i], self.perf
            cap = max(2 * job.num_gpus, 1)

            def configs(t: str, lo: int, hi: int, first_only: bool) -> list[tuple[str, int, Layout, float]]:
                found, c = [], lo
                while c <= hi and not (first_only and found):
                    per_node = min(c, p.per_node[t])
                    res = best_layout(job.key, t, c, per_node, p.intra[t], INTER_NODE_GBS, per_node)
                    if res is not None:
                        found.append((t, c, res[0], job.steps * res[1]))
                    c *= 2
                return found

            out = [x for t in sorted(p.types) for x in configs(t, 1, min(cap, p.total[t]), False)]
            if not out:  # nothing up to twice the request: the smallest power of two above it that fits, per type
                out = [x for t in sorted(p.types) for x in configs(t, 2 * cap, p.total[t], True)]
            self._ilp_cfgs[i] = out
        return self._ilp_cfgs[i]

    def _ilp_round(self, now: float) -> None:
        import highspy

        t0 = time.perf_counter()
        free_t = {t: 0 for t in self.perf.types}
        for name, k in self.pool.free.items():
            free_t[self.perf.node[name].gpu_type] += k
        cols: list[tuple[int, str, int, Layout]] = []
        cost: list[float] = []
        for i in self.queue:
            cfgs = [c for c in self._configs(i) if c[1] <= free_t[c[0]]]
            if not cfgs:
                if not self._configs(i):
                    self.jobs[i].unschedulable = "no memory-feasible configuration"
                continue
            base = max(d for _, c, _, d in cfgs if c == min(x[1] for x in cfgs))
            for t, c, lay, d in cfgs:
                g = base / d
                cols.append((i, t, c, lay))
                cost.append(1 + (1 - g ** self.cfg.ilp_p) / -self.cfg.ilp_p - 1e-4 * c)
        chosen: list[tuple[int, str, int, Layout]] = []
        if cols:
            jobs = sorted({c[0] for c in cols})
            jrow = {j: r for r, j in enumerate(jobs)}
            types = sorted(self.perf.types)
            trow = {t: len(jobs) + r for r, t in enumerate(types)}
            starts, index, value = [0], [], []
            for i, t, c, _ in cols:
                index += [jrow[i], trow[t]]
                value += [1.0, float(c)]
                starts.append(len(index))
            h = _silent_highs(highspy)
            h.setOptionValue("time_limit", self.cfg.ilp_time_limit_s)
            lp = highspy.HighsLp()
            lp.num_col_, lp.num_row_ = len(cols), len(jobs) + len(types)
            lp.col_cost_ = np.array(cost)
            lp.col_lower_ = np.zeros(len(cols))
            lp.col_upper_ = np.ones(len(cols))
            lp.row_lower_ = np.full(lp.num_row_, -highspy.kHighsInf)
            lp.row_upper_ = np.array([1.0] * len(jobs) + [float(free_t[t]) for t in types])
            lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
            lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
            lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
            lp.a_matrix_.value_ = np.array(value)
            lp.sense_ = highspy.ObjSense.kMaximize
            lp.integrality_ = [highspy.HighsVarType.kInteger] * len(cols)
            h.passModel(lp)
            h.run()
            x = h.getSolution().col_value
            chosen = [cols[k] for k in range(len(cols)) if x[k] > 0.5]
        self.decisions_ms.append((time.perf_counter() - t0) * 1e3)
        self.rounds_ms.append(self.decisions_ms[-1])
        chosen.sort(key=lambda c: self.jobs[c[0]].seq)
        started = set()
        for i, t, c, lay in chosen:
            nodes = place(self.pool, GpuRequest(c, 0.0, lay.tp, frozenset({t})))
            if nodes is not None:
                self._start(i, now, nodes, lay)
                started.add(i)
        self.queue = [i for i in self.queue if i not in started and not self.jobs[i].unschedulable]
        if self.queue and started:
            self._round_pending = True
            self._push(now + self.cfg.round_s, "round", -1)


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


def lower_bounds(cluster: Cluster, trace: Sequence[TraceJob], config: SimConfig | None = None,
                 catalog: Catalog | None = None) -> dict[str, float]:
    """Lower bounds on average JCT and makespan under the simulator's models (notes/scheduling.md section 4).

    A relaxed GPU holds any allocation: the memory of the cluster's largest GPU, the speed of its fastest, its
    best links. d_j* = steps x the fastest memory-feasible layout on 1..G relaxed GPUs; w_j = steps x the fewest
    GPU-seconds per step. avg JCT >= max(mean d_j*, SRPT flow time of the w_j on one machine as fast as all G
    GPUs / n); makespan >= max(max_j a_j + d_j*, min_j a_j + sum w_j / G)."""
    sim = Simulator(cluster, trace, "has", config, catalog)
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
        for c in range(1, g_total + 1):
            for lay in layouts_exact(j.key, c, per_node):
                if fits(j.key, big, lay):
                    times.append((step_time(j.key, fast, lay, intra, inter, per_node), c))
        if not times:
            continue
        d_star.append(j.steps * min(t for t, _ in times))
        work.append(j.steps * min(t * c for t, c in times))
        rel.append(j.trace.submit_s)
    if not d_star:
        return {"avg_jct_s": 0.0, "makespan_s": 0.0}
    avg = max(sum(d_star) / len(d_star), _srpt_flow(rel, work, g_total) / len(d_star))
    mk = max(max(a + d for a, d in zip(rel, d_star, strict=True)), min(rel) + sum(work) / g_total) - min(rel)
    return {"avg_jct_s": avg, "makespan_s": mk}


def _silent_highs(highspy: Any) -> Any:
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
