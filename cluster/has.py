"""HAS, the Frenzy paper's heterogeneity-aware scheduler (section IV-B, Algorithm 1), made precise.

A job arrives as MARP's ranked plans. Each plan becomes a `GpuRequest`: `gpus` GPUs, each with at least
`min_mem_gib` of memory, in per-node counts that are multiples of `unit` (the plan's tensor-parallel degree, so
no TP group spans nodes). A decision has two steps:

1. **Plan retrieval.** Take the first plan the free GPUs can satisfy *now*: count, per node, only GPUs whose
   memory is at least the plan's minimum, rounded down to a multiple of `unit` (gang semantics: per-node counts,
   never aggregate totals).
2. **Best fit.** Among the nodes with suitable GPUs: a node whose usable free count equals the need exactly;
   else the node with the least leftover among those that can hold the whole need; else greedily take the
   node with the most usable free GPUs and repeat step 2 with the remainder.

Ties are broken deterministically: the faster intra-node link first, then the smaller GPU memory (big GPUs stay
free for jobs that need them), then the node name.

`FreePool` keeps free GPUs bucketed by (node class, free count), so a decision costs O(plans x classes) for the
retrieval and O(classes x max node size) per best-fit step, independent of the number of nodes in a class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.catalog import Catalog
    from tasks.planning.plans import ResourcePlan


@dataclass(frozen=True)
class GpuRequest:
    """One plan as HAS sees it: `gpus` GPUs with at least `min_mem_gib` each, per-node multiples of `unit`."""

    gpus: int
    min_mem_gib: float
    unit: int = 1
    types: frozenset[str] | None = None
    """Restrict to these GPU types (None: any type with enough memory)."""
    run_s: float | None = field(default=None, compare=False)
    """The job's predicted run time on this plan (for the queue head's reservation); not part of its identity."""

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.unit < 1 or self.gpus % self.unit:
            raise ValueError(f"invalid request {self}: gpus must be a positive multiple of unit")

    def admits(self, mem_gib: float, gpu_type: str) -> bool:
        return mem_gib >= self.min_mem_gib and (self.types is None or gpu_type in self.types)


@dataclass(frozen=True)
class NodeInfo:
    """What placement needs to know about a node."""

    name: str
    gpu_type: str
    mem_gib: float
    link_gbs: float
    capacity: int


@dataclass
class Decision:
    """The chosen plan (index into the request list) and how many GPUs each node gives."""

    plan_index: int
    request: GpuRequest
    nodes: list[tuple[str, int]]

    @property
    def gpus(self) -> int:
        return sum(c for _, c in self.nodes)


@dataclass
class _Class:
    """Nodes sharing GPU type, memory and link: interchangeable for placement except for their name."""

    key: tuple[float, float, str]  # (-link_gbs, mem_gib, gpu_type): sort order = tie-break order
    mem_gib: float
    buckets: list[set[str]] = field(default_factory=list)  # buckets[k] = nodes with exactly k free GPUs
    usable: dict[int, int] = field(default_factory=dict)  # unit -> sum over nodes of floor(free/unit)*unit


_UNITS = (1, 2, 4, 8, 16)


class FreePool:
    """Free GPUs per node, indexed for fast HAS decisions. Mutated only by `take` and `give`."""

    def __init__(self, nodes: Iterable[NodeInfo], free: dict[str, int] | None = None) -> None:
        self.info: dict[str, NodeInfo] = {}
        self.free: dict[str, int] = {}
        self._cls: dict[tuple[float, float, str], _Class] = {}
        self._node_cls: dict[str, _Class] = {}
        self._tables: dict[tuple[frozenset[str] | None, int], tuple[list[float], list[int]]] = {}  # until a change
        for n in nodes:
            self.info[n.name] = n
            key = (-n.link_gbs, n.mem_gib, n.gpu_type)
            c = self._cls.get(key)
            if c is None:
                c = self._cls[key] = _Class(key=key, mem_gib=n.mem_gib, usable=dict.fromkeys(_UNITS, 0))
            while len(c.buckets) <= n.capacity:
                c.buckets.append(set())
            self._node_cls[n.name] = c
            k = n.capacity if free is None else free.get(n.name, 0)
            if not 0 <= k <= n.capacity:
                raise ValueError(f"node {n.name}: {k} free GPUs out of {n.capacity}")
            self.free[n.name] = k
            c.buckets[k].add(n.name)
            for u in _UNITS:
                c.usable[u] += k // u * u
        self._order = sorted(self._cls.values(), key=lambda c: c.key)
        self._max_cap = max((n.capacity for n in self.info.values()), default=0)

    # -- bookkeeping -------------------------------------------------------------------------------------
    def _set(self, name: str, k: int) -> None:
        c, old = self._node_cls[name], self.free[name]
        self._tables.clear()
        c.buckets[old].discard(name)
        c.buckets[k].add(name)
        for u in _UNITS:
            c.usable[u] += k // u * u - old // u * u
        self.free[name] = k

    def take(self, nodes: Sequence[tuple[str, int]]) -> None:
        """Mark GPUs as allocated; raises (and changes nothing) when a node has too few free."""
        for name, k in nodes:
            if k > self.free[name]:
                raise ValueError(f"node {name} has {self.free[name]} free GPUs, {k} requested")
        for name, k in nodes:
            self._set(name, self.free[name] - k)

    def give(self, nodes: Sequence[tuple[str, int]]) -> None:
        """Return GPUs to the pool."""
        for name, k in nodes:
            if self.free[name] + k > self.info[name].capacity:
                raise ValueError(f"node {name}: returning {k} GPUs would exceed its {self.info[name].capacity}")
        for name, k in nodes:
            self._set(name, self.free[name] + k)

    def total_free(self) -> int:
        return sum(self.free.values())

    # -- queries -----------------------------------------------------------------------------------------
    def usable(self, req: GpuRequest) -> int:
        """GPUs the request could use now, counted per node in multiples of its unit."""
        u = req.unit
        if u in _UNITS:
            return sum(c.usable[u] for c in self._order if req.admits(c.mem_gib, c.key[2]))
        return sum(self.free[n] // u * u for n, i in self.info.items() if req.admits(i.mem_gib, i.gpu_type))

    def fits(self, req: GpuRequest) -> bool:
        return self.usable(req) >= req.gpus

    def usable_by_memory(self, types: frozenset[str] | None, unit: int) -> tuple[list[float], list[int]] | None:
        """`usable` for every memory floor at once, for requests of `types` and `unit`: the GPU memories present
        (ascending) and, at index i, the GPUs usable on nodes with at least the i-th memory (one more entry: 0).
        A request asking `m` GiB gets the entry at `bisect_left(mems, m)`. None for a unit not kept per class. Kept
        until the pool changes: read the lists, never change them."""
        if unit not in _UNITS:
            return None
        got = self._tables.get((types, unit))
        if got is None:
            rows = sorted((c.mem_gib, c.usable[unit]) for c in self._order if types is None or c.key[2] in types)
            suffix = [0] * (len(rows) + 1)
            for i in range(len(rows) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + rows[i][1]
            got = self._tables[(types, unit)] = ([m for m, _ in rows], suffix)
        return got


def _best_single(pool: FreePool, classes: list[_Class], need: int, taken: dict[str, int]) -> str | None:
    """The node that holds `need` with the least leftover (exact fit = leftover 0); ties by class order, name."""
    for k in range(need, pool._max_cap + 1):  # free count k; leftover = k - need, smallest first
        for c in classes:  # already in tie-break order
            if k < len(c.buckets) and c.buckets[k]:
                cands = [n for n in c.buckets[k] if n not in taken]
                if cands:
                    return min(cands)
    return None


def _most_idle(pool: FreePool, classes: list[_Class], unit: int, taken: dict[str, int]) -> tuple[str, int] | None:
    """The node with the most usable free GPUs (a multiple of unit); ties by class order, name."""
    best: tuple[int, int, str] | None = None  # (-usable, class position, name)
    for pos, c in enumerate(classes):
        for k in range(len(c.buckets) - 1, 0, -1):
            use = k // unit * unit
            if use == 0 or (best is not None and -use > best[0]):
                break
            cands = [n for n in c.buckets[k] if n not in taken]
            if cands:
                cand = (-use, pos, min(cands))
                if best is None or cand < best:
                    best = cand
                break
    return None if best is None else (best[2], -best[0])


def place(pool: FreePool, req: GpuRequest) -> list[tuple[str, int]] | None:
    """Best-fit placement of one request (step 2); None when the free GPUs cannot hold it."""
    if not pool.fits(req):
        return None
    classes = [c for c in pool._order if req.admits(c.mem_gib, c.key[2])]
    taken: dict[str, int] = {}
    remaining = req.gpus
    while remaining > 0:
        # the single node that can hold all that remains; its free count must be >= remaining (a multiple of unit)
        node = _best_single(pool, classes, remaining, taken)
        if node is not None:
            taken[node] = remaining
            break
        greedy = _most_idle(pool, classes, req.unit, taken)
        if greedy is None:  # cannot happen when fits() held; guard against a corrupted pool
            return None
        taken[greedy[0]] = greedy[1]
        remaining -= greedy[1]
    return list(taken.items())


def decide(pool: FreePool, requests: Sequence[GpuRequest]) -> Decision | None:
    """Algorithm 1: the first request the pool can satisfy now, placed by best fit. Does not mutate the pool."""
    for i, req in enumerate(requests):
        if pool.fits(req):
            nodes = place(pool, req)
            if nodes is not None:
                return Decision(plan_index=i, request=req, nodes=nodes)
    return None


def requests_from_plans(plans: Sequence[ResourcePlan], catalog: Catalog, precision: str = "bf16-mixed",
                        steps: float | None = None) -> tuple[list[GpuRequest], list[int]]:
    """MARP plans as HAS requests, and for each request the index of its plan.

    A plan was sized and timed for one GPU type; its request admits every type with enough memory that is at
    least as fast for the job's precision, so the plan's estimated time holds wherever HAS puts it (slower
    types are reached through their own, lower-ranked plans). Duplicate requests keep the best-ranked plan.
    """
    types = {p.gpu_type for p in plans} | {t for p in plans for t in p.acceptable_gpu_types}
    speed = {t: catalog.get(t).tflops(precision) for t in types}
    out: list[GpuRequest] = []
    index: list[int] = []
    seen: set[GpuRequest] = set()
    for i, p in enumerate(plans):
        ok = frozenset(t for t in p.acceptable_gpu_types if speed[t] >= speed[p.gpu_type]) | {p.gpu_type}
        req = GpuRequest(p.gpus, p.min_gpu_memory_gib, p.layout.tp, ok,
                         run_s=steps * p.est_step_time_s if steps else None)
        if req not in seen:
            seen.add(req)
            out.append(req)
            index.append(i)
    return out, index
