"""The simulator's placement policies, one class each behind `sim_engine.Policy`.

- `Has` (`has`, and `has-arrival` / `has-sjf` as queue-order variants): MARP plans (ranked `balanced` by default,
  `rank_by`) placed by HAS (`cluster/has.py`), each job's plan chosen by `cluster/sizing.py` (the ledger's code) or,
  with `sizing=False`, the paper's first plan that fits; the queue in `queue_order` (cluster/queue.py: shortest
  predicted first with aging by default, backfilling, a reservation for the head). An elastic job may run on any of
  its plans; a rigid one on its own GPU count on any type that holds it (`Perf.rigid`): where one node of the type
  holds the gang, as two requests, one node (per-node unit = the count) at its speed and spread over nodes at the
  inter-node link's (`Perf.split_run`), so sizing weighs waiting for a node against the slower spread run (one
  request predicted at the one-node speed spread 8-GPU Philly jobs 1.7x slower than predicted: round 10).
- `Fcfs` (`fcfs`, and `fifo` with `strict=True`): opportunistic scheduling as the Frenzy paper defines it: the user's
  GPU count (on GPUs with at least the memory the user asks for, `SimJob.min_mem`), nodes with the highest compute
  first (then most free, then name), first come first served; a job that does not fit now is skipped (`fifo`: it
  blocks those behind it). `baseline_order="shortest"` orders the queue by the trace's run time (an oracle the user
  does not have): the same-order ablation that separates HAS's placement from its queue order.
- `Ilp` (`ilp`): in the style of Sia: every `round_s` seconds after a change, one MILP over (waiting job x GPU type x
  GPU count) chooses at most one configuration per job to maximise the sum of Sia's goodput utility
  `1 + (1 - g^p) / -p` (p = -0.5, g = the configuration's speed-up over the job's smallest configuration), subject to
  the free GPUs per type; solved with HiGHS. Chosen configurations are packed on nodes of that type by best fit; one
  that does not pack waits for the next round. Configurations are memory-feasible (Sia profiles its jobs): for an
  elastic job powers of two up to twice the user's request, for a rigid one its own count.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING

import numpy as np

from cluster.has import GpuRequest, decide, place, requests_from_plans
from cluster.jobperf import INTER_NODE_GBS, best_layout
from cluster.queue import Admit, QueueOrder, Reservation, Waiting, ordered, reserve, walk
from cluster.sim_engine import Options, Policy, silent_highs
from cluster.sizing import Sizer, arrival_rate, exact_type_requests, prepare

if TYPE_CHECKING:
    from cluster.sim_engine import Engine, SimConfig
    from tasks.planning.layout import Layout


def _waiting(sim: Engine, predicted: dict[int, float | None]) -> list[Waiting]:
    """The queue as cluster/queue.py sees it; `predicted`: run-time predictions where the order needs them."""
    return [Waiting(job=i, seq=sim.jobs[i].seq, submitted_s=sim.jobs[i].trace.submit_s, predicted_s=predicted.get(i))
            for i in sim.queue if not sim.jobs[i].unschedulable]


def _leave(sim: Engine, left: list[Waiting]) -> None:
    sim.queue = [int(w.job) for w in left if not sim.jobs[int(w.job)].unschedulable]  # type: ignore[call-overload]


class Fcfs:
    """`fcfs` (skip what does not fit) or, `strict`, `fifo` (head-of-line blocking); module docstring."""

    def __init__(self, cfg: SimConfig, strict: bool = False) -> None:
        self.order: QueueOrder = "strict" if strict else "shortest" if cfg.baseline_order == "shortest" else "backfill"

    def never_runs(self, sim: Engine, i: int) -> str:
        job = sim.jobs[i]
        total = sum(sim.perf.total.values())
        if job.num_gpus > total:  # a real scheduler rejects it; fifo must not block on it
            return f"asks for {job.num_gpus} GPUs; the cluster has {total}"
        if math.isinf(job.min_mem):
            return f"no GPU of the cluster holds {job.trace.model} with DDP on {job.num_gpus} GPUs"
        if job.min_mem and sim.perf.admits(job.min_mem) < job.num_gpus:
            return (f"asks for {job.num_gpus} GPUs with >= {job.min_mem:.0f} GiB; the cluster has "
                    f"{sim.perf.admits(job.min_mem)}")
        return ""

    def on_change(self, sim: Engine, now: float) -> None:
        t0 = time.perf_counter()
        pred = {i: sim.jobs[i].trace.duration_s for i in sim.queue} if self.order == "shortest" else {}

        def try_place(w: Waiting, admit: Admit) -> bool:
            i = int(w.job)  # type: ignore[call-overload]
            if sim.pool.total_free() == 0:
                return False
            d0 = time.perf_counter()
            nodes = self.place(sim, i)
            sim.decisions_ms.append((time.perf_counter() - d0) * 1e3)
            if nodes is None:
                return False
            sim.start(i, now, nodes, None)
            return True

        _, left, _ = walk(_waiting(sim, pred), self.order, now, try_place, 0.0)
        _leave(sim, left)
        sim.rounds_ms.append((time.perf_counter() - t0) * 1e3)

    def on_round(self, sim: Engine, now: float) -> None:
        """fcfs and fifo schedule no rounds."""

    @staticmethod
    def place(sim: Engine, i: int) -> list[tuple[str, int]] | None:
        """The user's count on the fastest nodes with the memory asked for (most free first, then name)."""
        job = sim.jobs[i]
        prec = job.key.precision
        nodes = [x for x in sim.perf.node.values() if x.mem_gib >= job.min_mem and sim.pool.free[x.name] > 0]
        if sum(sim.pool.free[x.name] for x in nodes) < job.num_gpus:
            return None
        nodes.sort(key=lambda x: (-sim.perf.speed(x.gpu_type, prec), -sim.pool.free[x.name], x.name))
        out, need = [], job.num_gpus
        for x in nodes:
            k = min(need, sim.pool.free[x.name])
            out.append((x.name, k))
            need -= k
            if need == 0:
                break
        return out


class Has:
    """Frenzy's HAS (module docstring)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self._options: dict[int, Options | None] = {}

    def options(self, sim: Engine, i: int) -> Options | None:
        """What job `i` may run on (cached); None: nothing of the cluster holds it."""
        if i not in self._options:
            opts = self._options[i] = self._elastic(sim, i) if sim.jobs[i].elastic else self._rigid(sim, i)
            if opts is not None and self.cfg.sizing:
                prepare(opts.requests)  # once per job, as its plans are: not part of each decision
        return self._options[i]

    def _elastic(self, sim: Engine, i: int) -> Options | None:
        job = sim.jobs[i]
        plans = sim.perf.plans(job.key)
        if plans is None:
            return None
        plans = plans[: self.cfg.max_plans] if self.cfg.max_plans else plans
        if self.cfg.sizing:
            reqs, idx = exact_type_requests(plans, job.steps)
        else:
            reqs, idx = requests_from_plans(plans, sim.cat, job.key.precision, job.steps)
        return Options(reqs, [plans[k].layout for k in idx], job.steps * plans[0].est_step_time_s)

    @staticmethod
    def _rigid(sim: Engine, i: int) -> Options | None:
        opts = sim.rigid_options(i)
        if not opts:
            return None
        job = sim.jobs[i]
        n = job.num_gpus
        reqs: list[GpuRequest] = []
        lays: list[Layout] = []
        for t, lay, run in opts:
            split = sim.perf.split_run(job, t, lay)
            if split is not None:  # one node of the type holds the gang: on one node (unit = the count) at its speed,
                # or spread over nodes at the inter-node link's (sizing weighs waiting for a node against the split)
                reqs.append(GpuRequest(n, sim.perf.mem_gib(t), n, frozenset({t}), run_s=run))
                lays.append(lay)
            reqs.append(GpuRequest(n, sim.perf.mem_gib(t), 1, frozenset({t}), run_s=run if split is None else split))
            lays.append(lay)
        return Options(reqs, lays, opts[0][2])

    def never_runs(self, sim: Engine, i: int) -> str:
        if self.options(sim, i) is not None:
            return ""
        job = sim.jobs[i]
        return ("MARP: no layout fits any GPU of the cluster" if job.elastic else
                f"no GPU type of the cluster holds {job.trace.model} on {job.num_gpus} GPUs")

    def on_change(self, sim: Engine, now: float) -> None:
        """One pass over the queue with cluster/queue.py's discipline: the code the live ledger runs."""
        t0 = time.perf_counter()
        order = self.cfg.queue_order
        pred: dict[int, float | None] = {}
        if order == "shortest":
            for i in sim.queue:
                o = self.options(sim, i)
                pred[i] = None if o is None or math.isinf(o.predicted_s) else o.predicted_s
        waiting = _waiting(sim, pred)
        left = self._sized(sim, waiting, now) if self.cfg.sizing else self._first_fit(sim, waiting, now)
        _leave(sim, left)
        sim.rounds_ms.append((time.perf_counter() - t0) * 1e3)

    def on_round(self, sim: Engine, now: float) -> None:
        """has schedules no rounds."""

    def _first_fit(self, sim: Engine, waiting: list[Waiting], now: float) -> list[Waiting]:
        """The paper's decision: the first plan that fits, in rank order (`sizing=False`)."""

        def try_place(w: Waiting, admit: Admit) -> bool:
            i = int(w.job)  # type: ignore[call-overload]
            o = self.options(sim, i)
            if o is None or sim.pool.total_free() == 0:
                return False
            d0 = time.perf_counter()
            d = decide(sim.pool, o.requests)
            sim.decisions_ms.append((time.perf_counter() - d0) * 1e3)
            if d is None:
                return False
            if not admit(d.nodes, d.request.run_s):
                sim.backfills_refused += 1
                return False
            sim.start(i, now, d.nodes, o.layouts[d.plan_index], d.request.run_s)
            return True

        def reserve_for(w: Waiting) -> Reservation | None:
            o = self.options(sim, int(w.job))  # type: ignore[call-overload]
            if o is None:
                return None
            return reserve(w.job, sim.pool, sim.running.values(), now, lambda at: decide(at, o.requests) is not None)

        _, left, _ = walk(waiting, self.cfg.queue_order, now, try_place, self.cfg.aging,
                          reserve_for=reserve_for if self.cfg.reservation else None)
        return left

    def _sized(self, sim: Engine, waiting: list[Waiting], now: float) -> list[Waiting]:
        """HAS with cluster/sizing.py's choice per job (the ledger's code path); counts idle-GPU violations."""
        opts = {w.job: self.options(sim, int(w.job)) for w in waiting}  # type: ignore[call-overload]
        reqs_of = {j: o.requests for j, o in opts.items() if o is not None}
        asked = {w.job: sim.jobs[int(w.job)].trace.num_gpus for w in waiting}  # type: ignore[call-overload]
        sizer = Sizer(sim.pool, list(sim.running.values()), now,
                      ordered(waiting, self.cfg.queue_order, now, self.cfg.aging), reqs_of, self.cfg.min_scaling,
                      arrival_rate(sim.arrived, now), asked, self.cfg.reserve_after)

        def try_place(w: Waiting, admit: Admit) -> bool:
            i = int(w.job)  # type: ignore[call-overload]
            picked = sizer.pick(w, admit)
            if picked is None:
                return False
            d, why = picked
            o = opts[w.job]
            assert o is not None
            sim.start(i, now, d.nodes, o.layouts[d.plan_index], d.request.run_s)
            sim.jobs[i].decision = why
            return True

        _, left, res = walk(waiting, self.cfg.queue_order, now, try_place, self.cfg.aging,
                            reserve_for=sizer.reserve_for if self.cfg.reservation else None)
        sim.decisions_ms += sizer.decision_ms
        sim.backfills_refused += sizer.refused
        sim.idle_violations += sizer.violations(left, res)
        for w in left:
            if w.job in sizer.records:
                sim.jobs[int(w.job)].decision = sizer.records[w.job]  # type: ignore[call-overload]
        return left


Config = tuple[str, int, "Layout", float]
"""An ILP configuration: (GPU type, GPUs, layout, run seconds)."""


class Ilp:
    """The Sia-style per-round MILP (module docstring)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self._configs: dict[int, list[Config]] = {}
        self.pending = False

    def configs(self, sim: Engine, i: int) -> list[Config]:
        if i not in self._configs:
            job = sim.jobs[i]
            if job.elastic:
                self._configs[i] = self._elastic(sim, i)
            else:
                self._configs[i] = [(t, job.num_gpus, lay, run) for t, lay, run in sim.rigid_options(i)]
        return self._configs[i]

    @staticmethod
    def _elastic(sim: Engine, i: int) -> list[Config]:
        job, p = sim.jobs[i], sim.perf
        cap = max(2 * job.num_gpus, 1)

        def configs(t: str, lo: int, hi: int, first_only: bool) -> list[Config]:
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
        return out

    def never_runs(self, sim: Engine, i: int) -> str:
        return "" if self.configs(sim, i) else "no memory-feasible configuration"

    def on_change(self, sim: Engine, now: float) -> None:
        if not self.pending and sim.queue:
            self.pending = True
            sim.push(math.floor(now / self.cfg.round_s + 1) * self.cfg.round_s, "round", -1)

    def on_round(self, sim: Engine, now: float) -> None:
        self.pending = False
        t0 = time.perf_counter()
        chosen = self.solve(sim)
        sim.decisions_ms.append((time.perf_counter() - t0) * 1e3)
        sim.rounds_ms.append(sim.decisions_ms[-1])
        chosen.sort(key=lambda c: sim.jobs[c[0]].seq)
        started = set()
        for i, t, c, lay in chosen:
            nodes = place(sim.pool, GpuRequest(c, 0.0, lay.tp, frozenset({t})))
            if nodes is not None:
                sim.start(i, now, nodes, lay)
                started.add(i)
        sim.queue = [i for i in sim.queue if i not in started and not sim.jobs[i].unschedulable]
        if sim.queue and started:
            self.pending = True
            sim.push(now + self.cfg.round_s, "round", -1)

    def _columns(self, sim: Engine) -> tuple[list[tuple[int, str, int, Layout]], list[float], dict[str, int]]:
        """One column per (waiting job, configuration that fits the free GPUs of its type), with Sia's utility."""
        free_t = dict.fromkeys(sim.perf.types, 0)
        for name, k in sim.pool.free.items():
            free_t[sim.perf.node[name].gpu_type] += k
        cols: list[tuple[int, str, int, Layout]] = []
        cost: list[float] = []
        for i in sim.queue:
            cfgs = [c for c in self.configs(sim, i) if c[1] <= free_t[c[0]]]
            if not cfgs:
                continue
            base = max(d for _, c, _, d in cfgs if c == min(x[1] for x in cfgs))
            for t, c, lay, d in cfgs:
                g = base / d
                cols.append((i, t, c, lay))
                cost.append(1 + (1 - g ** self.cfg.ilp_p) / -self.cfg.ilp_p - 1e-4 * c)
        return cols, cost, free_t

    def solve(self, sim: Engine) -> list[tuple[int, str, int, Layout]]:
        """The MILP of one round over the waiting jobs; the chosen (job, type, GPUs, layout)."""
        import highspy

        cols, cost, free_t = self._columns(sim)
        if not cols:
            return []
        jobs = sorted({c[0] for c in cols})
        jrow = {j: r for r, j in enumerate(jobs)}
        types = sorted(sim.perf.types)
        trow = {t: len(jobs) + r for r, t in enumerate(types)}
        starts, index, value = [0], [], []
        for i, t, c, _ in cols:
            index += [jrow[i], trow[t]]
            value += [1.0, float(c)]
            starts.append(len(index))
        h = silent_highs(highspy)
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
        return [cols[k] for k in range(len(cols)) if x[k] > 0.5]


def make_policy(name: str, cfg: SimConfig) -> tuple[Policy, SimConfig]:
    """The policy called `name` (cluster/traces.py `ALL_POLICIES`) and the configuration it runs with."""
    if name == "has-sjf":  # the old name of the default
        cfg = dataclasses.replace(cfg, queue_order="shortest")
    elif name == "has-arrival":
        cfg = dataclasses.replace(cfg, queue_order="backfill")
    if name.startswith("has"):
        return Has(cfg), cfg
    if name in ("fcfs", "fifo"):
        return Fcfs(cfg, strict=name == "fifo"), cfg
    if name == "ilp":
        return Ilp(cfg), cfg
    raise ValueError(f"unknown policy {name!r}")
