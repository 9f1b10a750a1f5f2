"""The dependency model of a traced training step, built once and shared by every step and DP rank.

A node is one op of one pipeline stage in a step: `(stage, optype, seq_id)`. Every (step, DP rank) must hold the
same node set (steps where some rank does not are dropped and reported); times are matrices `[node, column]`
with column = step_index * dp + dp_index.

Per worker there are these streams, each a chain in start order: the main stream (forward/backward compute, then
the end-of-step ops gc, layernorm / embedding / non-overlapped separate-grads all-reduce, clip-main-grad,
optimizer), four PP streams (forward/backward send/recv) and a DP stream (params all-gather, grads
reduce-scatter, and a separate-grads all-reduce that overlaps the backward pass). Cross-stream edges:
- the k-th send of a stage follows the k-th compute that produces a message (the k-th receive gates the k-th
  compute that consumes one), a chunk's grads reduce-scatter follows its last backward; any other side op is
  issued after the main op before it, or, when it started while a main op was still running (a gradient bucket
  all-reduced in the middle of a backward pass), anchored at the same fraction of that op; an op queued behind
  its stream predecessor is issued where that one was;
- a receive gates the first main op that starts after it ends; a chunk's params all-gather gates that chunk's
  first forward; a send gates the next main op when the trace shows it waited (blocking p2p); every other
  side op that ended before the end-of-step chain began gates that chain (the optimizer waits for gradients);
Collective groups: each p2p send with its receive (the k-th message on each link, stage s to s +- 1, chunk
wrap-around under interleaving), a DP collective with the same op on every DP rank of the step, the
embedding all-reduce of the first and last stage, clip-main-grad over all stages. A communication op ends at
the latest start in its group plus its transfer time.

Where an op was issued is decided by a majority over sampled columns, so one odd step does not change the model;
a wait edge (a side op gating a main op) needs the gated op to start after the side op's end in at least 98%
of all columns: a true dependency always holds, a coincidence (a non-blocking send that happened to finish
before the next compute) does not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from tasks.stragglers.trace import COMPUTE, DP_COMM, OPTYPES, PP_COMM, TAIL, JobMeta, Trace, TraceError

log = logging.getLogger(__name__)

_OT = {name: i for i, name in enumerate(OPTYPES)}
_SEP_AR = _OT["separate-grads-all-reduce"]
_AG = _OT["params-all-gather"]
_RS = _OT["grads-reduce-scatter"]
_FWD = _OT["forward-compute"]


@dataclass
class Level:
    nodes: np.ndarray  # ordered by group
    deps: np.ndarray  # [len(nodes), K] node ids, padded with the sentinel (n)
    anchor: np.ndarray | None  # node id or sentinel
    frac: np.ndarray | None
    offsets: np.ndarray  # reduceat offsets of the groups in `nodes`
    counts: np.ndarray
    dpsync: np.ndarray  # per group
    grouped: bool


@dataclass
class Graph:
    meta: JobMeta
    n: int
    stage: np.ndarray
    optype: np.ndarray
    seq: np.ndarray
    mc: np.ndarray
    steps: np.ndarray  # step numbers of the columns' steps
    dp_ranks: np.ndarray
    start: np.ndarray  # observed [n, C]
    end: np.ndarray
    deps: list[list[int]]
    anchor: np.ndarray  # -1: none
    frac: np.ndarray
    group: np.ndarray  # group id per node
    dpsync: np.ndarray  # per group: a DP collective, synchronised across the step's DP ranks
    levels: list[Level] = field(default_factory=list)
    dropped_steps: list[int] = field(default_factory=list)
    tol: float = 0.0

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def n_dp(self) -> int:
        return len(self.dp_ranks)

    def col_dp(self) -> np.ndarray:
        """The DP index of every column."""
        return np.tile(np.arange(self.n_dp), self.n_steps)


def build(trace: Trace, sample_cols: int = 32) -> Graph:
    """Arrange the trace as [node, column] matrices and infer its dependency model."""
    c = trace.cols
    keep = _one_tp_rank(c)
    stage, optype, seq, dp, step = (c[k][keep] for k in ("stage", "optype", "seq_id", "dp_rank", "step"))
    start, dur, mc = c["start_ts"][keep], c["duration"][keep], c["mc"][keep]
    if len(step) == 0:
        raise TraceError("the trace has no ops")
    steps, step_i = np.unique(step, return_inverse=True)
    dps, dp_i = np.unique(dp, return_inverse=True)
    S, D = len(steps), len(dps)
    # the node set of the first step's first DP rank
    ref = (step_i == 0) & (dp_i == 0)
    n_seq = int(seq.max()) + 1
    if stage.min() < 0 or seq.min() < 0:
        raise TraceError("stage and seq_id must be non-negative")
    key = (stage.astype(np.int64) * len(OPTYPES) + optype) * n_seq + seq
    ref_keys, ref_first = np.unique(key[ref], return_index=True)
    if len(ref_keys) != ref.sum():
        raise TraceError(f"step {steps[0]} of DP rank {dps[0]} has duplicate (stage, optype, seq_id) rows; "
                         "seq_id must number each worker's ops of one type in one step")
    n = len(ref_keys)
    node = np.searchsorted(ref_keys, key)
    node[node >= n] = 0
    known = ref_keys[node] == key
    col = step_i * D + dp_i
    C = S * D
    counts = np.bincount(node[known] * C + col[known], minlength=n * C).reshape(n, C)
    col_ok = (counts == 1).all(axis=0)
    np.logical_and.at(col_ok, col[~known], False)
    step_ok = col_ok.reshape(S, D).all(axis=1)
    if not step_ok.any():
        raise TraceError("no step has the same ops on every DP rank as the first step; is this one job's trace "
                         "with the same schedule in every step?")
    dropped = [int(s) for s in steps[~step_ok]]
    if dropped:
        log.warning("dropping %d of %d steps whose ops differ from step %d: %s", len(dropped), S, steps[0],
                    dropped[:10])
    good_cols = np.flatnonzero(np.repeat(step_ok, D))
    remap = np.full(C, -1)
    remap[good_cols] = np.arange(len(good_cols))
    sel = known & (remap[col] >= 0)
    C2 = len(good_cols)
    st = np.zeros((n, C2))
    en = np.zeros((n, C2))
    st[node[sel], remap[col[sel]]] = start[sel]
    en[node[sel], remap[col[sel]]] = start[sel] + dur[sel]
    idx = np.flatnonzero(ref)[ref_first]
    g = Graph(meta=trace.meta, n=n, stage=stage[idx].astype(np.int64), optype=optype[idx].astype(np.int64),
              seq=seq[idx].astype(np.int64), mc=mc[idx].astype(np.int64), steps=steps[step_ok], dp_ranks=dps,
              start=st, end=en, deps=[[] for _ in range(n)], anchor=np.full(n, -1), frac=np.zeros(n),
              group=np.arange(n), dpsync=np.zeros(0, bool), dropped_steps=dropped)
    step_t = (en.max(axis=0).reshape(-1, D).max(axis=1) - st.min(axis=0).reshape(-1, D).min(axis=1))
    g.tol = max(2e-6, 1e-4 * float(np.median(step_t)))
    samp = np.unique(np.linspace(0, C2 - 1, min(sample_cols, C2)).astype(int))
    for s in np.unique(g.stage):
        _edges(g, np.flatnonzero(g.stage == s), samp)
    _groups(g)
    _levels(g)
    return g


def _one_tp_rank(c: dict[str, np.ndarray]) -> np.ndarray:
    """Rows of the lowest traced rank of each (dp_rank, stage)."""
    dp, stage, rank = c["dp_rank"].astype(np.int64), c["stage"].astype(np.int64), c["rank"].astype(np.int64)
    if len(rank) == 0:
        return np.zeros(0, bool)
    cell = dp * (int(stage.max()) + 1) + stage
    low = np.full(int(cell.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(low, cell, rank)
    keep = rank == low[cell]
    if not keep.all():
        log.warning("more than one rank per (dp_rank, stage): analysing the lowest TP rank of each")
    return keep


WAIT_QUORUM = 0.98


@dataclass
class _Stage:
    """One pipeline stage's ops of the sampled steps: their per-step starts and ends, medians and op types."""

    g: Graph
    nodes: np.ndarray
    S: np.ndarray
    E: np.ndarray
    SA: np.ndarray
    EA: np.ndarray
    ms: np.ndarray
    me: np.ndarray
    ot: np.ndarray

    def waited(self, x: int, m: int) -> bool:
        """Op `m` started after op `x` ended in (nearly) every step: it waited for it."""
        return bool(np.mean(self.EA[x] <= self.SA[m] + self.g.tol) >= WAIT_QUORUM)

    def chain(self, ops: list[int] | np.ndarray) -> None:
        for a, b in zip(ops[:-1], ops[1:], strict=False):
            self.g.deps[self.nodes[b]].append(int(self.nodes[a]))


def _edges(g: Graph, nodes: np.ndarray, samp: np.ndarray) -> None:
    st = _Stage(g=g, nodes=nodes, S=g.start[nodes][:, samp], E=g.end[nodes][:, samp], SA=g.start[nodes],
                EA=g.end[nodes], ms=np.median(g.start[nodes][:, samp], axis=1),
                me=np.median(g.end[nodes][:, samp], axis=1), ot=g.optype[nodes])
    main, is_tail = _main_chain(st)
    st.chain(main)
    side = np.setdiff1d(np.arange(len(nodes)), main)
    streams: dict[str, list[int]] = {}
    for i in side:
        name = OPTYPES[st.ot[i]]
        streams.setdefault(name if name in PP_COMM else "dp", []).append(int(i))
    for members in streams.values():
        members.sort(key=lambda i: (st.ms[i], g.seq[nodes[i]]))
        st.chain(members)
    tail = [i for i in main if is_tail[i]]
    producer, consumer_of = _pp_pairs(g, nodes, main, st.ot)
    issued: dict[int, tuple[str, int, float]] = {}
    pred = {b: a for members in streams.values() for a, b in zip(members[:-1], members[1:], strict=False)}
    for i in sorted(side, key=lambda i: st.ms[i]):
        issued[i] = _issue_point(st, main, i, producer, issued.get(pred[i]) if i in pred else None,
                                 pred.get(i))
        how, m, frac = issued[i]
        if how == "dep":
            g.deps[nodes[i]].append(int(nodes[m]))
        elif how == "anchor":
            g.anchor[nodes[i]] = nodes[m]
            g.frac[nodes[i]] = frac
        consumer = _consumer(st, main, i, how, m, consumer_of, tail[0] if tail else None)
        if consumer is not None:
            g.deps[nodes[consumer]].append(int(nodes[i]))


def _main_chain(st: _Stage) -> tuple[np.ndarray, np.ndarray]:
    """The stage's compute and tail ops in the order they ran (one chain: the worker's compute stream)."""
    g, ot, tol = st.g, st.ot, st.g.tol
    is_comp = np.isin(ot, [_OT[x] for x in COMPUTE])
    comp_end = st.me[is_comp].max() if is_comp.any() else -np.inf
    is_tail = np.isin(ot, [_OT[x] for x in TAIL]) | ((ot == _SEP_AR) & (st.ms >= comp_end - tol))
    main = np.flatnonzero(is_comp | is_tail)
    return main[np.lexsort((g.seq[st.nodes][main], st.ms[main]))], is_tail


def _issue_point(st: _Stage, main: np.ndarray, i: int, producer: dict[int, int],
                 pred_issue: tuple[str, int, float] | None, pred: int | None) -> tuple[str, int, float]:
    """Where side op `i` was issued: after an op (`dep`), part-way through a main op (`anchor`, the fraction), or
    at the start (`none`)."""
    tol = st.g.tol
    if i in producer:  # a send follows the compute that produced it
        return ("dep", producer[i], 0.0)
    if st.ot[i] == _RS and (last := _last_bwd(st.g, st.nodes, main, st.ot, i)) is not None:
        return ("dep", last, 0.0)
    if pred_issue is not None and pred is not None and np.mean(st.S[i] <= st.E[pred] + tol) >= 0.5:
        return pred_issue  # queued behind its stream predecessor: issued no later than it
    k = int(np.searchsorted(st.ms[main], st.ms[i] + tol, side="right")) - 1  # the main op it was issued after
    if k < 0:
        return ("none", -1, 0.0)
    m = main[k]
    span = np.maximum(st.E[m] - st.S[m], 1e-12)
    frac = float(np.clip(np.median((st.S[i] - st.S[m]) / span), 0.0, 1.0))
    if np.mean(st.S[i] >= st.E[m] - tol) >= 0.5:
        return ("dep", m, 0.0)
    if frac >= 0.01:
        return ("anchor", m, frac)
    return ("dep", main[k - 1], 0.0) if k >= 1 else ("none", -1, 0.0)  # issued with the main op's start


def _consumer(st: _Stage, main: np.ndarray, i: int, how: str, m: int, consumer_of: dict[int, int],
              tail0: int | None) -> int | None:
    """The main op that waits for side op `i`: its receiver's compute, a forward that needs a gathered parameter,
    the compute after a blocking send, else the step's tail when it waited."""
    name, tol = OPTYPES[st.ot[i]], st.g.tol
    consumer = None
    if i in consumer_of:
        consumer = consumer_of[i]
    elif name.endswith("-recv") or st.ot[i] == _AG:
        after = [j for j in main if st.ms[j] >= st.me[i] - tol]
        if st.ot[i] == _AG:
            same = [j for j in after if st.ot[j] == _FWD and st.g.mc[st.nodes[j]] == st.g.mc[st.nodes[i]]]
            after = same or after
        consumer = after[0] if after else None
    elif name.endswith("-send") and how == "dep":
        pos = int(np.flatnonzero(main == m)[0])
        if pos + 1 < len(main) and st.waited(i, main[pos + 1]):
            consumer = main[pos + 1]  # a blocking send
    if consumer is None and tail0 is not None and st.waited(i, tail0):
        consumer = tail0
    return consumer


def _pp_pairs(g: Graph, nodes: np.ndarray, main: np.ndarray, ot: np.ndarray) -> tuple[dict[int, int], dict[int, int]]:
    """Sends and the computes that produced them, receives and the computes that consume them, by index.

    The k-th forward send of a stage carries the output of its k-th forward compute that has a next stage; the
    k-th forward receive feeds its k-th forward compute that has a previous stage (likewise backward). Where the
    counts differ (extra no-op records) the timing rules decide instead."""
    P, V = max(g.meta.pp_size, int(g.stage.max()) + 1), max(1, g.meta.vpp_size)
    producer: dict[int, int] = {}
    consumer: dict[int, int] = {}
    for name in PP_COMM:
        fwd, send = name.startswith("forward"), name.endswith("send")
        comp = [int(j) for j in main if ot[j] == _OT["forward-compute" if fwd else "backward-compute"]]

        def valid(j: int, fwd: bool = fwd, send: bool = send) -> bool:
            r, c = int(g.stage[nodes[j]]), int(g.mc[nodes[j]])
            first, last = r == 0 and c == 0, r == P - 1 and c >= V - 1
            return not ((fwd == send and last) or (fwd != send and first))

        comp = [j for j in comp if valid(j)]
        ops = sorted((int(i) for i in np.flatnonzero(ot == _OT[name]) if valid(int(i))),
                     key=lambda i: g.seq[nodes[i]])
        if not ops or len(ops) != len(comp):
            continue
        for i, j in zip(ops, comp, strict=True):
            (producer if send else consumer)[i] = j
    return producer, consumer


def _last_bwd(g: Graph, nodes: np.ndarray, main: np.ndarray, ot: np.ndarray, i: int) -> int | None:
    """The last backward compute of a reduce-scatter's chunk (one reduce-scatter per chunk), else None."""
    rs = np.flatnonzero(ot == _RS)
    if len(np.unique(g.mc[nodes[rs]])) != len(rs):
        return None
    bwd = [int(j) for j in main if ot[j] == _OT["backward-compute"] and g.mc[nodes[j]] == g.mc[nodes[i]]]
    return bwd[-1] if bwd else None


def _groups(g: Graph) -> None:
    P, V = g.meta.pp_size, max(1, g.meta.vpp_size)
    P = max(P, int(g.stage.max()) + 1)
    next_id = g.n
    links: dict[tuple, dict[str, list[int]]] = {}
    for i in range(g.n):
        name, r, c = OPTYPES[g.optype[i]], int(g.stage[i]), int(g.mc[i])
        if name in PP_COMM:
            fwd, send = name.startswith("forward"), name.endswith("send")
            first, last = (r == 0 and c == 0), (r == P - 1 and c >= V - 1)
            if (fwd and send and last) or (fwd and not send and first) or (not fwd and send and first) or \
                    (not fwd and not send and last):
                continue  # a no-op record at the pipeline's ends: local
            if send:
                link = (fwd, r, (r + 1) % P if fwd else (r - 1) % P)
            else:
                link = (fwd, (r - 1) % P if fwd else (r + 1) % P, r)
            links.setdefault(link, {"send": [], "recv": []})["send" if send else "recv"].append(i)
    for link, ends in links.items():
        s = sorted(ends["send"], key=lambda i: g.seq[i])
        r = sorted(ends["recv"], key=lambda i: g.seq[i])
        if len(s) != len(r):
            log.warning("p2p link %s: %d sends but %d receives; treating them as local ops", link, len(s), len(r))
            continue
        for a, b in zip(s, r, strict=True):
            g.group[a] = g.group[b] = next_id
            next_id += 1
    for name in ("embedding-grads-all-reduce", "optimizer-clip-main-grad"):
        ops = np.flatnonzero(g.optype == _OT[name])
        for q in np.unique(g.seq[ops]):
            members = ops[g.seq[ops] == q]
            if len(members) > 1:
                g.group[members] = next_id
                next_id += 1
    # compact group ids; a DP collective (a group of its own) waits for every DP rank of its step
    g.group = np.unique(g.group, return_inverse=True)[1]
    g.dpsync = np.zeros(int(g.group.max()) + 1, bool)
    if g.n_dp > 1:
        g.dpsync[g.group[np.isin(g.optype, [_OT[x] for x in DP_COMM])]] = True


def _levels(g: Graph) -> None:
    G = int(g.group.max()) + 1
    preds: list[set[int]] = [set() for _ in range(G)]
    for i in range(g.n):
        for d in g.deps[i] + ([int(g.anchor[i])] if g.anchor[i] >= 0 else []):
            if g.group[d] == g.group[i]:
                raise TraceError(f"the dependency model has a cycle inside the group of {_name(g, i)}")
            preds[g.group[i]].add(int(g.group[d]))
    indeg = np.array([len(p) for p in preds])
    succ: list[list[int]] = [[] for _ in range(G)]
    for x, p in enumerate(preds):
        for y in p:
            succ[y].append(x)
    level = np.zeros(G, int)
    ready = [x for x in range(G) if indeg[x] == 0]
    seen = 0
    while ready:
        x = ready.pop()
        seen += 1
        for y in succ[x]:
            level[y] = max(level[y], level[x] + 1)
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    if seen != G:
        stuck = [i for i in range(g.n) if indeg[g.group[i]] > 0][:6]
        raise TraceError("the trace's ops form a dependency cycle (ops: " + ", ".join(_name(g, i) for i in stuck)
                         + "); check that seq_id follows each worker's start order")
    node_level = level[g.group]
    for lv in range(int(level.max()) + 1):
        nodes = np.flatnonzero(node_level == lv)
        nodes = nodes[np.argsort(g.group[nodes], kind="stable")]
        grp = g.group[nodes]
        offsets = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]])
        counts = np.diff(np.r_[offsets, len(nodes)])
        K = max(1, max(len(g.deps[i]) for i in nodes))
        deps = np.full((len(nodes), K), g.n)
        for j, i in enumerate(nodes):
            deps[j, :len(g.deps[i])] = g.deps[i]
        anc = g.anchor[nodes]
        has_anchor = bool((anc >= 0).any())
        g.levels.append(Level(nodes=nodes, deps=deps, anchor=np.where(anc >= 0, anc, g.n) if has_anchor else None,
                              frac=g.frac[nodes] if has_anchor else None, offsets=offsets, counts=counts,
                              dpsync=g.dpsync[grp[offsets]], grouped=bool((counts > 1).any())))


def _name(g: Graph, i: int) -> str:
    return f"{OPTYPES[g.optype[i]]}#{g.seq[i]}@stage{g.stage[i]}"

