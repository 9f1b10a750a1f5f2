"""What-if analysis: simulate the straggler-free timeline of a trace and attribute the slowdown.

Timelines (all simulated on the dependency model of `model.py`, vectorised over every step and DP rank):
- original: the trace's durations and transfer times, with its launch delays (the simulator's error is
  measured against the trace on this one);
- no-delay: the same without launch delays (CPU-side gaps the model does not explain);
- ideal: every op at its op type's ideal duration (the mean for compute, the median transfer time for
  communication, over all ranks and steps) and no launch delays.
S = mean no-delay step time / mean ideal step time; the launch slowdown = mean trace step time / mean no-delay
step time. S_t for an op type, stage or DP rank: the ideal timeline with that group's original durations put
back, over the ideal step time. Worker (dp, stage) slowdowns are simulated too (the paper's artifact
approximates them by min(S_dp, S_stage) beyond a few workers; `exact_workers` still selects that).

Linear in DP size: in the ideal timeline every DP rank runs the same durations, so "rank k original, the others
ideal" needs two columns per step, rank k and one ideal rank standing for the D - 1 identical ones (they meet
rank k only at the DP collectives, where the max over D ranks is the max over those two). All D ranks are
simulated in one batched run of 2 columns per (rank, step): twice the cost of one timeline, not D times.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

from tasks.stragglers.model import Graph, build
from tasks.stragglers.trace import LOCAL, OPTYPES, Trace

#: PP communication is attributed as two groups, as in the paper
ATTR_GROUP = {"forward-send": "forward-pp-comm", "forward-recv": "forward-pp-comm",
              "backward-send": "backward-pp-comm", "backward-recv": "backward-pp-comm"}


def simulate(g: Graph, dur: np.ndarray, delay: np.ndarray | None = None, shape: tuple[int, int] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every node in every column; `dur` is [n, C] (transfer time for communication), its
    columns (step, DP rank) of `shape` (default: the trace's steps x DP ranks)."""
    n, C = dur.shape
    S, D = shape or (g.n_steps, g.n_dp)
    start = np.zeros((n + 1, C))
    end = np.zeros((n + 1, C))
    for lv in g.levels:
        nodes = lv.nodes
        ready = end[lv.deps].max(axis=1)
        if lv.anchor is not None:
            a = lv.anchor
            ready = np.maximum(ready, start[a] + lv.frac[:, None] * (end[a] - start[a]))
        s = ready if delay is None else ready + delay[nodes]
        start[nodes] = s
        if lv.grouped or lv.dpsync.any():
            gs = np.maximum.reduceat(s, lv.offsets, axis=0) if lv.grouped else s.copy()
            if lv.dpsync.any():
                sync = gs[lv.dpsync]
                gs[lv.dpsync] = np.repeat(sync.reshape(-1, S, D).max(axis=2), D, axis=1)
            gs = np.repeat(gs, lv.counts, axis=0) if lv.grouped else gs
        else:
            gs = s
        end[nodes] = gs + dur[nodes]
    return start[:n], end[:n]


def step_times(g: Graph, start: np.ndarray, end: np.ndarray, n_dp: int | None = None) -> np.ndarray:
    D = n_dp or g.n_dp
    return end.max(axis=0).reshape(-1, D).max(axis=1) - start.min(axis=0).reshape(-1, D).min(axis=1)


@dataclass
class Prepared:
    graph: Graph
    dur: np.ndarray  # original durations / transfer times
    delay: np.ndarray
    ideal: np.ndarray  # per node
    skew_ops: int


def prepare(g: Graph) -> Prepared:
    """Transfer times, launch delays and ideal durations from the observed times."""
    S, D = g.n_steps, g.n_dp
    n, C = g.start.shape
    gstart = np.empty_like(g.start)
    order = np.argsort(g.group, kind="stable")
    grp = g.group[order]
    offsets = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]])
    counts = np.diff(np.r_[offsets, n])
    gs = np.maximum.reduceat(g.start[order], offsets, axis=0)
    sync = g.dpsync[grp[offsets]]
    if sync.any():
        gs[sync] = np.repeat(gs[sync].reshape(-1, S, D).max(axis=2), D, axis=1)
    gstart[order] = np.repeat(gs, counts, axis=0)
    is_local = np.isin(g.optype, [OPTYPES.index(x) for x in LOCAL])
    dur = np.where(is_local[:, None], g.end - g.start, g.end - gstart)
    np.maximum(dur, 0.0, out=dur)
    ready = np.zeros((n, C))
    for i in range(n):
        if g.deps[i]:
            ready[i] = g.end[g.deps[i]].max(axis=0)
        a = g.anchor[i]
        if a >= 0:
            ready[i] = np.maximum(ready[i], g.start[a] + g.frac[i] * (g.end[a] - g.start[a]))
    delay = g.start - ready
    skew = int((delay < -g.tol).sum())
    np.maximum(delay, 0.0, out=delay)
    ideal = np.empty(n)
    for t in np.unique(g.optype):
        rows = g.optype == t
        vals = dur[rows]
        ideal[rows] = vals.mean() if OPTYPES[t] in LOCAL else np.median(vals)
    return Prepared(g, dur, delay, ideal, skew)


_BATCH_CELLS = 4_000_000
"""Cells (ops x columns) of one batched per-rank simulation; bounds its memory (about 5 x 8 bytes a cell)."""


def per_rank_put_back(g: Graph, p: Prepared, rows: np.ndarray | None = None) -> np.ndarray:
    """For every DP rank k: the mean step time of the ideal timeline with rank k's original durations put back
    (on `rows`, else on every op). Batched two-column simulation (module docstring), in chunks of ranks."""
    n, S, D = g.n, g.n_steps, g.n_dp
    if D == 1:  # no other rank to stand for
        d = np.repeat(p.ideal[:, None], S, axis=1)
        sel = slice(None) if rows is None else rows
        d[sel] = p.dur[sel]
        return np.array([step_times(g, *simulate(g, d)).mean()])
    dur3 = p.dur.reshape(n, S, D)
    out = np.empty(D)
    per = max(1, _BATCH_CELLS // max(1, n * S * 2))
    for k0 in range(0, D, per):
        m = min(per, D - k0)
        b = np.empty((n, m, S, 2))
        b[...] = p.ideal[:, None, None, None]
        src = dur3[:, :, k0:k0 + m].transpose(0, 2, 1)  # [n, m, S]: rank k0+j's original durations per step
        if rows is None:
            b[..., 0] = src
        else:
            b[rows, :, :, 0] = src[rows]
        st, en = simulate(g, b.reshape(n, m * S * 2), shape=(m * S, 2))
        out[k0:k0 + m] = step_times(g, st, en, n_dp=2).reshape(m, S).mean(axis=1)
    return out


class Slowdowns(BaseModel):
    """What `frenzy stragglers analyze --json` prints."""

    trace: str
    ops: int
    steps: int
    dp_size: int
    pp_size: int
    slowdown: float
    launch_slowdown: float
    waste: float
    by_optype: dict[str, float]
    by_stage: dict[str, float]
    by_dp_rank: dict[str, float]
    workers: list[list[float]]  # [stage][dp]
    workers_method: str
    m_w: float
    m_s: float
    per_step: dict[str, float]
    sim_error: float
    sim_error_max: float
    step_time_trace_s: float
    step_time_nodelay_s: float
    step_time_ideal_s: float
    top_workers: list[dict]
    clock_skew_ops: int
    dropped_steps: list[int]
    analysis_s: float


@dataclass
class _WhatIf:
    """The simulations of one analysis: the ideal durations everywhere but where some ops keep their original ones."""

    g: Graph
    p: Prepared
    ideal_mat: np.ndarray
    t_ideal: float
    t_nodelay: float

    def put_back(self, rows: np.ndarray | None = None, cols: np.ndarray | None = None, ideal_for: bool = False) -> float:
        """Mean step time with original durations on the selected rows x cols (or ideal there if ideal_for)."""
        src, dst = (self.ideal_mat, self.p.dur) if ideal_for else (self.p.dur, self.ideal_mat)
        d = np.array(dst)
        r = slice(None) if rows is None else rows
        if cols is None:
            d[r] = src[r]
        else:
            sub = d[r]
            sub[:, cols] = np.asarray(src[r])[:, cols]
            d[r] = sub
        return float(step_times(self.g, *simulate(self.g, d)).mean())

    def explained(self, t_rem: float) -> float:
        """Share of the straggler slowdown that ideal durations on some ops remove."""
        spread = self.t_nodelay - self.t_ideal
        return float((self.t_nodelay - t_rem) / spread) if spread > 1e-12 else 0.0

    def attribution(self, say: Callable[[str], None]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """Slowdown by op type, by stage and by DP rank: each group's original durations put back."""
        g, groups = self.g, {}
        for t in np.unique(g.optype):
            groups.setdefault(ATTR_GROUP.get(OPTYPES[t], OPTYPES[t]), []).append(int(t))
        by_optype = {name: self.put_back(rows=np.isin(g.optype, ts)) / self.t_ideal for name, ts in groups.items()}
        say(f"attributed {len(by_optype)} op types")
        by_stage = {str(int(s)): self.put_back(rows=g.stage == s) / self.t_ideal for s in np.unique(g.stage)}
        by_dp = {str(int(d)): float(v) / self.t_ideal
                 for d, v in zip(g.dp_ranks, per_rank_put_back(g, self.p), strict=True)}
        say(f"attributed {g.n_dp} DP ranks")
        return by_optype, by_stage, by_dp

    def workers(self, exact: bool, by_stage: dict[str, float], by_dp: dict[str, float]) -> list[list[float]]:
        """The (stage x DP rank) worker map: simulated one by one, or bounded by the stage's and the rank's."""
        g, stages = self.g, np.unique(self.g.stage)
        if exact:
            return [[float(v) / self.t_ideal for v in per_rank_put_back(g, self.p, rows=g.stage == s)] for s in stages]
        return [[min(by_stage[str(int(s))], by_dp[str(int(d))]) for d in g.dp_ranks] for s in stages]

    def m_w(self, top: list[tuple[float, int, int]]) -> float:
        """The share of the slowdown the `top` workers explain."""
        g, col_dp = self.g, self.g.col_dp()
        mask = np.zeros(self.p.dur.shape, bool)
        for _, s, d in top:
            mask[np.ix_(g.stage == s, col_dp == int(np.flatnonzero(g.dp_ranks == d)[0]))] = True
        return self.explained(float(step_times(g, *simulate(g, np.where(mask, self.ideal_mat, self.p.dur))).mean()))


def analyze(trace: Trace, exact_workers: int | None = None, progress: Callable[[str], None] | None = None
            ) -> tuple[Slowdowns, Prepared]:
    """The what-if analysis of a trace: S, attribution, worker map, M_W, M_S and the simulator's error."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    g = build(trace)
    p = prepare(g)
    say(f"model: {g.n} ops per step x {g.n_steps} steps x {g.n_dp} DP ranks, {len(g.levels)} levels")
    S, D = g.n_steps, g.n_dp
    base = step_times(g, g.start, g.end)
    orig = step_times(g, *simulate(g, p.dur, p.delay))
    nodelay = step_times(g, *simulate(g, p.dur))
    ideal_mat = np.broadcast_to(p.ideal[:, None], p.dur.shape)
    ideal = step_times(g, *simulate(g, np.ascontiguousarray(ideal_mat)))
    w = _WhatIf(g=g, p=p, ideal_mat=ideal_mat, t_ideal=float(ideal.mean()), t_nodelay=float(nodelay.mean()))
    by_optype, by_stage, by_dp = w.attribution(say)
    stages = np.unique(g.stage)
    n_workers = len(stages) * D
    exact = exact_workers is None or n_workers <= exact_workers
    workers = w.workers(exact, by_stage, by_dp)
    say(f"worker map: {n_workers} workers ({'simulated' if exact else 'min(S_dp, S_stage)'})")
    flat = sorted(((workers[i][k], int(s), int(d)) for i, s in enumerate(stages) for k, d in enumerate(g.dp_ranks)),
                  reverse=True)
    n_top = max(1, math.ceil(0.03 * n_workers))
    err = np.abs(orig - base) / np.maximum(base, 1e-12)
    res = Slowdowns(
        trace=trace.path, ops=int(g.n * S * D), steps=S, dp_size=D, pp_size=len(stages),
        slowdown=w.t_nodelay / w.t_ideal, launch_slowdown=float(base.mean() / w.t_nodelay),
        waste=1.0 - w.t_ideal / w.t_nodelay, by_optype=by_optype, by_stage=by_stage, by_dp_rank=by_dp,
        workers=workers, workers_method="simulated" if exact else "min(S_dp, S_stage)", m_w=w.m_w(flat[:n_top]),
        m_s=w.explained(w.put_back(rows=g.stage == stages[-1], ideal_for=True)),
        per_step={str(int(s)): float(v) for s, v in zip(g.steps, nodelay / ideal, strict=True)},
        sim_error=float(np.median(err)), sim_error_max=float(err.max()),
        step_time_trace_s=float(base.mean()), step_time_nodelay_s=w.t_nodelay, step_time_ideal_s=w.t_ideal,
        top_workers=[{"stage": s, "dp_rank": d, "slowdown": v} for v, s, d in flat[:max(n_top, 5)]],
        clock_skew_ops=p.skew_ops, dropped_steps=g.dropped_steps, analysis_s=time.perf_counter() - t0)
    return res, p


def analyze_path(path: str, meta: str | None = None, **kw: object) -> tuple[Slowdowns, Prepared]:
    from tasks.stragglers.trace import load_trace

    return analyze(load_trace(path, meta), **kw)
