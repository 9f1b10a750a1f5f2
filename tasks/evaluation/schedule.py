"""Prior-based elastic scheduling of evaluation trials (Acme section 6.2), its naive baseline and a lower bound.

A trial is one model load plus inference over a list of dataset chunks on one GPU. The naive schedule runs one
trial per dataset in suite order, each loading the model from remote storage and computing its metric on the
GPU after inference. The elastic schedule:

1. copies the model to every node's shared memory once (a precursor per node) and loads each trial from there;
2. splits datasets into chunks of about `W / (M * k)` GPU seconds (W total inference, M GPUs) and packs small
   chunks first-fit-decreasing into trials of that size, so load overheads are amortised and GPUs balance;
3. dispatches trials longest-first (LPT list scheduling) with trials that carry long CPU metrics first, so their
   metrics overlap other trials' inference;
4. hands every chunk's predictions to the node's CPU pool the moment they land: no barrier between stages.

It tries a few granularities `k` and orders and keeps the best predicted makespan. `simulate` is the event model
both schedules are predicted with; the real runner (`runner.py`) dispatches trials the same way.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from tasks.errors import FrenzyError
from tasks.evaluation.suite import Suite

GRANULARITIES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
ORDERS = ("cpu-first", "lpt")


class ChunkPlan(BaseModel):
    """Examples [start, stop) of one dataset, with their prior costs."""

    dataset: str
    start: int
    stop: int
    infer_s: float
    metric_s: float
    landed_s: float | None = None
    """Predicted time the chunk's predictions land (end of its inference)."""
    metric_end_s: float | None = None

    @property
    def label(self) -> str:
        return f"{self.dataset}[{self.start}:{self.stop}]"


class TrialPlan(BaseModel):
    """One model load plus inference over its chunks on one GPU."""

    id: int
    chunks: list[ChunkPlan]
    load: Literal["remote", "shm"]
    metrics_on: Literal["gpu", "cpu"]
    node: int | None = None
    gpu: int | None = None
    start_s: float | None = None
    end_s: float | None = None

    @property
    def infer_s(self) -> float:
        return sum(c.infer_s for c in self.chunks)

    @property
    def metric_s(self) -> float:
        return sum(c.metric_s for c in self.chunks)


class Schedule(BaseModel):
    """A trial plan and its predicted timeline."""

    kind: Literal["naive", "partitioned", "elastic", "direct"]
    """`direct`: what the elastic schedule runs where copying the model first does not pay (`plan_elastic_or_direct`):
    one trial per dataset loading from storage, metrics on the CPU pools, no copy."""
    nodes: int
    gpus_per_node: int
    cpu_workers_per_node: int
    trials: list[TrialPlan]
    makespan_s: float
    precursor_s: float
    """Per-node time to copy the model to shared memory (0 for naive)."""
    granularity: float | None = None
    order: str | None = None
    gpu_busy_s: float
    """GPU-seconds spent loading and computing (the idle rest is waste)."""


class EvalPlan(BaseModel):
    """Both schedules of a suite on a cluster shape and the lower bound (`frenzy eval-plan --json`)."""

    suite: str
    nodes: int
    gpus_per_node: int
    cpu_workers_per_node: int
    naive_makespan_s: float
    elastic_makespan_s: float
    lower_bound_s: float
    speedup: float
    gap_to_bound: float
    """elastic / lower bound - 1."""
    granularity: float
    order: str
    trials: list[TrialPlan]
    """The elastic schedule's trials, in dispatch order, with predicted node, GPU and times."""
    naive_trials: list[TrialPlan]


# ---------------------------------------------------------------------------------------------------- trials

def _chunks(suite: Suite, pieces: dict[str, int]) -> list[ChunkPlan]:
    out = []
    for d in suite.datasets:
        q = max(1, min(d.examples, pieces.get(d.name, 1)))
        bounds = [round(i * d.examples / q) for i in range(q + 1)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            n = b - a
            out.append(ChunkPlan(dataset=d.name, start=a, stop=b, infer_s=n * d.infer_s_per_example,
                                 metric_s=n * d.metric_s_per_example))
    return out


def naive_trials(suite: Suite) -> list[TrialPlan]:
    """One trial per dataset, in suite order, loading from remote storage, metrics on the GPU."""
    return [TrialPlan(id=i, chunks=[c], load="remote", metrics_on="gpu")
            for i, c in enumerate(_chunks(suite, {}))]


def elastic_trials(suite: Suite, gpus: int, cpu_workers: int, granularity: float = 2.0,
                   order: str = "cpu-first") -> list[TrialPlan]:
    """Split, pack and order the suite's datasets into trials for `gpus` GPUs and `cpu_workers` CPU workers."""
    work = sum(d.examples * d.infer_s_per_example for d in suite.datasets)
    target = work / (gpus * granularity)
    metric_total = sum(d.examples * d.metric_s_per_example for d in suite.datasets)
    # a metric piece longer than a trial would outlast the inference it should hide behind
    metric_target = max(target / 2, metric_total / cpu_workers / 4, 1e-9)
    pieces = {}
    for d in suite.datasets:
        a, b = d.examples * d.infer_s_per_example, d.examples * d.metric_s_per_example
        pieces[d.name] = max(math.ceil(a / target - 1e-9), math.ceil(b / metric_target - 1e-9), 1)
    chunks = sorted(_chunks(suite, pieces), key=lambda c: (-c.infer_s, c.dataset, c.start))
    bins: list[list[ChunkPlan]] = []
    loads: list[float] = []
    for c in chunks:  # first-fit decreasing into trials of about `target` GPU seconds
        for i, load in enumerate(loads):
            if load + c.infer_s <= target * 1.0001:
                bins[i].append(c)
                loads[i] += c.infer_s
                break
        else:
            bins.append([c])
            loads.append(c.infer_s)
    trials = []
    for b in bins:
        b.sort(key=lambda c: -c.metric_s)  # long metrics land first within a trial
        trials.append(TrialPlan(id=0, chunks=b, load="shm", metrics_on="cpu"))
    if order == "cpu-first":
        # trials whose metric outweighs their inference first (longest metric first), then LPT
        trials.sort(key=lambda t: (0, -t.metric_s) if t.metric_s > t.infer_s else (1, -t.infer_s))
    else:
        trials.sort(key=lambda t: -t.infer_s)
    for i, t in enumerate(trials):
        t.id = i
    return trials


# ------------------------------------------------------------------------------------------------ simulation

@dataclass
class _Gpu:
    node: int
    index: int
    trial: TrialPlan | None = None
    phase: int = 0  # 0 load, 1..k chunk inference, k+1 metrics on the GPU


@dataclass
class _Remote:
    gpu: _Gpu
    left: float


@dataclass
class _Node:
    ready_s: float
    free_cpus: int
    queue: list = field(default_factory=list)
    remotes: list[_Remote] = field(default_factory=list)
    synced_s: float = 0.0
    """When `remotes[*].left` was last brought up to date (they progress lazily, at the node's sharing rate)."""
    version: int = 0
    """Bumped whenever `remotes` changes: finish-time entries of an older version are stale."""


class _Sim:
    """The event model's state: a heap of fixed-time events, per node its remote loads in flight (processor
    sharing), its CPU metric queue and free CPUs, and the trials not yet dispatched."""

    def __init__(self, trials: list[TrialPlan], suite: Suite, nodes: int, gpus_per_node: int, pre: float, cpus: int,
                 barrier: bool) -> None:
        self.ml, self.barrier = suite.model_load_s, barrier
        self.nd = [_Node(ready_s=pre, free_cpus=cpus) for _ in range(nodes)]
        self.held: list[tuple[int, ChunkPlan]] = []  # CPU metrics waiting for the barrier
        self.queue = list(trials)
        self.heap: list[tuple[float, int, str, object]] = []
        self.loads: list[tuple[float, int, int]] = []  # (finish of a node's first remote load, node, version)
        self.seq = 0
        self.now = 0.0
        self.end = pre if trials else 0.0
        gpus = [_Gpu(n, g) for n in range(nodes) for g in range(gpus_per_node)]
        for n in range(nodes):
            for g in gpus[n * gpus_per_node:(n + 1) * gpus_per_node]:
                self.push(self.nd[n].ready_s, "idle", g)

    def push(self, t: float, kind: str, obj: object) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, obj))
        self.seq += 1

    def start_cpu(self, node: _Node, n: int, t: float) -> None:
        while node.free_cpus and node.queue:
            c = node.queue.pop(0)
            node.free_cpus -= 1
            c.metric_end_s = t + c.metric_s
            self.push(c.metric_end_s, "cpu", n)

    def advance(self, g: _Gpu, t: float) -> None:
        """Start the next phase of g's trial at t, or the next trial."""
        tr = g.trial
        if tr is None:
            return
        k = len(tr.chunks)
        if g.phase <= k - 1:
            c = tr.chunks[g.phase]
            g.phase += 1
            self.push(t + c.infer_s, "chunk", (g, c))
        elif g.phase == k and tr.metrics_on == "gpu" and tr.metric_s > 0:
            g.phase += 1
            self.push(t + tr.metric_s, "gpu-metric", g)
        else:
            tr.end_s = t
            g.trial = None
            self.dispatch(g, t)

    def dispatch(self, g: _Gpu, t: float) -> None:
        if not self.queue:
            return
        tr = self.queue.pop(0)
        tr.node, tr.gpu, tr.start_s = g.node, g.index, t
        g.trial, g.phase = tr, 0
        if tr.load == "remote":
            node = self.nd[g.node]
            self._sync(node)
            node.remotes.append(_Remote(g, self.ml.remote))
            self._changed(g.node)
        else:
            self.push(t + self.ml.shm, "loaded", g)

    def release_barrier(self) -> None:
        """Every inference is done: the held CPU metrics start."""
        for n, c in self.held:
            self.nd[n].queue.append(c)
        self.held.clear()
        for n, node in enumerate(self.nd):
            self.start_cpu(node, n, self.now)

    def _rate(self, node: _Node) -> float:
        return min(1.0, self.ml.remote_streams_per_node / len(node.remotes))

    def _sync(self, node: _Node) -> None:
        """Bring the node's remote loads up to `now` (they share its NIC at one rate until the set changes)."""
        if node.remotes and self.now > node.synced_s:
            done = (self.now - node.synced_s) * self._rate(node)
            for r in node.remotes:
                r.left -= done
        node.synced_s = self.now

    def _changed(self, n: int) -> None:
        """The node's set of remote loads changed (synced to `now`): schedule its next finish."""
        node = self.nd[n]
        node.version += 1
        if node.remotes:
            first = min(r.left for r in node.remotes)
            heapq.heappush(self.loads, (self.now + first / self._rate(node), n, node.version))

    def _loading(self) -> bool:
        """Whether a remote load is in flight (stale finish entries dropped first)."""
        while self.loads and self.loads[0][2] != self.nd[self.loads[0][1]].version:
            heapq.heappop(self.loads)  # that node's loads changed since the entry was made
        return bool(self.loads)

    def step_remotes(self) -> int | None:
        """Move the clock to the next event: a fixed-time one or a remote load finishing at its node's sharing rate
        (that node's index returned, synced, else None). Remote loads progress lazily: a node is brought up to date
        only when its set of loads changes or one of them finishes, so a step costs O(log nodes), not O(nodes)."""
        t_next = self.heap[0][0] if self.heap else math.inf
        which = None
        if self._loading() and self.loads[0][0] < t_next:
            t_next, which, _ = heapq.heappop(self.loads)
        self.now = t_next
        self.end = max(self.end, t_next)
        if which is not None:
            self._sync(self.nd[which])
        return which

    def on_chunk(self, g: _Gpu, c: ChunkPlan) -> None:
        """A chunk's predictions landed: its metric goes to the node's CPUs (or waits for the barrier)."""
        now = self.now
        c.landed_s = now
        if g.trial.metrics_on == "cpu" and c.metric_s > 0 and self.barrier:
            self.held.append((g.node, c))
        elif g.trial.metrics_on == "cpu" and c.metric_s > 0:
            self.nd[g.node].queue.append(c)
            self.start_cpu(self.nd[g.node], g.node, now)
        elif g.trial.metrics_on == "cpu":
            c.metric_end_s = now
        self.advance(g, now)

    def handle(self, kind: str, obj: object) -> None:
        now = self.now
        if kind == "idle":
            if obj.trial is None:
                self.dispatch(obj, now)
        elif kind == "loaded":
            self.advance(obj, now)
        elif kind == "chunk":
            self.on_chunk(*obj)
        elif kind == "gpu-metric":
            for c in obj.trial.chunks:
                c.metric_end_s = now
            self.advance(obj, now)
        elif kind == "cpu":
            self.nd[obj].free_cpus += 1
            self.start_cpu(self.nd[obj], obj, now)

    def run(self) -> float:
        while self.heap or self._loading() or self.held:
            if self.held and not self.heap and not self._loading():
                self.release_barrier()
                continue
            n = self.step_remotes()
            if n is not None:
                node = self.nd[n]
                rate = self._rate(node)  # a load whose rest is below the clock's resolution here is done too
                done = [r for r in node.remotes if r.left <= 1e-9 or self.now + r.left / rate <= self.now]
                node.remotes = [r for r in node.remotes if r not in done]
                self._changed(n)
                for r in done:
                    self.advance(r.gpu, self.now)
                continue
            _, _, kind, obj = heapq.heappop(self.heap)
            self.handle(kind, obj)
        return self.end


def simulate(trials: list[TrialPlan], suite: Suite, nodes: int, gpus_per_node: int, precursor: bool,
             cpu_workers_per_node: int | None = None, barrier: bool = False) -> float:
    """Predict the timeline of `trials` dispatched in list order to whichever GPU frees first; fills the trials'
    node, gpu, start/end and the chunks' landing and metric end times. Returns the makespan.

    Remote loads on one node share its storage NIC (processor sharing beyond `remote_streams_per_node`);
    shared-memory loads, inference and metrics take their prior times. A node's trials start after its
    precursor (one remote load) when `precursor` is set. With `barrier`, CPU metrics start only after every
    trial's inference ended (OpenCompass's default infer-then-eval).
    """
    cpus = cpu_workers_per_node or suite.cpu_workers_per_node
    pre = suite.model_load_s.remote if precursor else 0.0
    return _Sim(trials, suite, nodes, gpus_per_node, pre, cpus, barrier).run()


def lower_bound(suite: Suite, nodes: int, gpus_per_node: int, cpu_workers_per_node: int | None = None) -> float:
    """A lower bound on the makespan of any schedule that preloads once per node and loads trials from shm.

    Every GPU that works first waits for its node's precursor and one shm load, so the GPU work W needs at least
    remote + shm + W/M. The CPU work B starts no earlier than the first prediction lands: remote + shm + the
    cheapest example + B/C. No dataset finishes before one example of it is inferred and scored.
    """
    ml = suite.model_load_s
    cpus = (cpu_workers_per_node or suite.cpu_workers_per_node) * nodes
    m = nodes * gpus_per_node
    work = sum(d.examples * d.infer_s_per_example for d in suite.datasets)
    metric = sum(d.examples * d.metric_s_per_example for d in suite.datasets)
    setup = ml.remote + ml.shm
    first = min(d.infer_s_per_example for d in suite.datasets)
    one = max(d.infer_s_per_example + d.metric_s_per_example for d in suite.datasets)
    return max(setup + work / m, setup + first + metric / cpus, setup + one)


def _busy(trials: list[TrialPlan], suite: Suite) -> float:
    ml = suite.model_load_s
    return sum((ml.remote if t.load == "remote" else ml.shm) + t.infer_s +
               (t.metric_s if t.metrics_on == "gpu" else 0.0) for t in trials)


def plan_naive(suite: Suite, nodes: int, gpus_per_node: int, cpu_workers_per_node: int | None = None) -> Schedule:
    cpus = cpu_workers_per_node or suite.cpu_workers_per_node
    trials = naive_trials(suite)
    span = simulate(trials, suite, nodes, gpus_per_node, precursor=False, cpu_workers_per_node=cpus)
    return Schedule(kind="naive", nodes=nodes, gpus_per_node=gpus_per_node, cpu_workers_per_node=cpus,
                    trials=trials, makespan_s=span, precursor_s=0.0, gpu_busy_s=_busy(trials, suite))


def plan_partitioned(suite: Suite, nodes: int, gpus_per_node: int, max_task_s: float,
                     cpu_workers_per_node: int | None = None) -> Schedule:
    """OpenCompass's default, for comparison: SizePartitioner (split datasets above `max_task_s` of inference,
    pack the rest next-fit decreasing up to it), every task loading from remote storage, metrics on CPUs after
    all inference (the barrier), tasks started in partition order."""
    cpus = cpu_workers_per_node or suite.cpu_workers_per_node
    pieces = {d.name: math.ceil(d.examples * d.infer_s_per_example / max_task_s - 1e-9) for d in suite.datasets}
    chunks = sorted(_chunks(suite, pieces), key=lambda c: -c.infer_s)
    groups: list[list[ChunkPlan]] = []
    size = math.inf
    for c in chunks:
        if size + c.infer_s > max_task_s:
            groups.append([])
            size = 0.0
        groups[-1].append(c)
        size += c.infer_s
    trials = [TrialPlan(id=i, chunks=g, load="remote", metrics_on="cpu") for i, g in enumerate(groups)]
    span = simulate(trials, suite, nodes, gpus_per_node, precursor=False, cpu_workers_per_node=cpus, barrier=True)
    return Schedule(kind="partitioned", nodes=nodes, gpus_per_node=gpus_per_node, cpu_workers_per_node=cpus,
                    trials=trials, makespan_s=span, precursor_s=0.0, gpu_busy_s=_busy(trials, suite))


def plan_elastic(suite: Suite, nodes: int, gpus_per_node: int, cpu_workers_per_node: int | None = None,
                 granularities: tuple[float, ...] = GRANULARITIES, orders: tuple[str, ...] = ORDERS) -> Schedule:
    """The elastic schedule with the best predicted makespan over a few granularities and orders; of the plans
    within `SPLIT_TOLERANCE` of the best, the one with the fewest trials (see there)."""
    cpus = cpu_workers_per_node or suite.cpu_workers_per_node
    plans: list[Schedule] = []
    for k in granularities:
        for order in orders:
            trials = elastic_trials(suite, nodes * gpus_per_node, nodes * cpus, k, order)
            span = simulate(trials, suite, nodes, gpus_per_node, precursor=True, cpu_workers_per_node=cpus)
            plans.append(Schedule(kind="elastic", nodes=nodes, gpus_per_node=gpus_per_node, cpu_workers_per_node=cpus,
                                  trials=trials, makespan_s=span, precursor_s=suite.model_load_s.remote,
                                  granularity=k, order=order, gpu_busy_s=_busy(trials, suite)))
    return fewest_trials_near_best(plans)


SPLIT_TOLERANCE = 0.02
"""A plan with more trials is kept only if it is predicted more than 2% faster than every plan with fewer. Each trial
pays a fixed cost the priors know only as an average (a process start that a warm process may or may not have hidden,
its exit, and on a CPU machine the CPU its imports take from the metric jobs): where the metric jobs or one long
dataset set the makespan, finer splits tie in the model and lose in the run (on this 2-core machine, 10 trials of
about 1 s measured 0.86x the naive schedule while predicted 1.4x faster; benchmarks/results/evaluation.md)."""


def fewest_trials_near_best(plans: list[Schedule], tolerance: float = SPLIT_TOLERANCE) -> Schedule:
    """Of `plans`, those predicted within `tolerance` of the best makespan; of these the one with the fewest trials
    (ties: the faster, then the first given)."""
    assert plans, "no plan to choose from"
    best = min(p.makespan_s for p in plans)
    near = [p for p in plans if p.makespan_s <= best * (1 + tolerance) + 1e-9]
    return min(near, key=lambda p: (len(p.trials), p.makespan_s))


def plan_elastic_or_direct(suite: Suite, nodes: int, gpus_per_node: int, cpu_workers_per_node: int | None = None
                           ) -> Schedule:
    """The plan the elastic schedule runs: the elastic plan, or, where it is predicted faster, `direct`: one trial per
    dataset loading straight from storage with its metrics on the CPU pools (as the elastic plan's), and no copy of the
    model to shared memory. The copy is paid before the first trial; where a suite's work is small next to it (a few
    short datasets, each about a trial's worth) it never pays back (a red team of 9 user scenarios found three that
    ran an elastic plan predicted 1.2-2.2x slower than naive: benchmarks/results/evaluation_redteam.md)."""
    el = plan_elastic(suite, nodes, gpus_per_node, cpu_workers_per_node)
    cpus = cpu_workers_per_node or suite.cpu_workers_per_node
    trials = [TrialPlan(id=i, chunks=[c], load="remote", metrics_on="cpu") for i, c in enumerate(_chunks(suite, {}))]
    trials.sort(key=lambda t: (0, -t.metric_s) if t.metric_s > t.infer_s else (1, -t.infer_s))  # as `cpu-first`
    for i, t in enumerate(trials):
        t.id = i
    span = simulate(trials, suite, nodes, gpus_per_node, precursor=False, cpu_workers_per_node=cpus)
    if span >= el.makespan_s:
        return el
    return Schedule(kind="direct", nodes=nodes, gpus_per_node=gpus_per_node, cpu_workers_per_node=cpus, trials=trials,
                    makespan_s=span, precursor_s=0.0, order="cpu-first", gpu_busy_s=_busy(trials, suite))


def plan(suite: Suite, nodes: int, gpus_per_node: int, cpu_workers_per_node: int | None = None) -> EvalPlan:
    """Naive and elastic schedules of `suite` on `nodes` x `gpus_per_node` GPUs, with the lower bound."""
    if nodes < 1 or gpus_per_node < 1:
        raise FrenzyError(f"need at least one node and one GPU per node (got {nodes} x {gpus_per_node})")
    if suite.lmeval is not None:  # lm-eval tasks: their documents are counted by loading them
        from tasks.evaluation.lmeval.source import expand

        suite = expand(suite)
    naive = plan_naive(suite, nodes, gpus_per_node, cpu_workers_per_node)
    el = plan_elastic(suite, nodes, gpus_per_node, cpu_workers_per_node)
    lb = lower_bound(suite, nodes, gpus_per_node, cpu_workers_per_node)
    return EvalPlan(suite=suite.name, nodes=nodes, gpus_per_node=gpus_per_node,
                    cpu_workers_per_node=el.cpu_workers_per_node, naive_makespan_s=naive.makespan_s,
                    elastic_makespan_s=el.makespan_s, lower_bound_s=lb, speedup=naive.makespan_s / el.makespan_s,
                    gap_to_bound=el.makespan_s / lb - 1, granularity=el.granularity or 0.0, order=el.order or "",
                    trials=el.trials, naive_trials=naive.trials)
