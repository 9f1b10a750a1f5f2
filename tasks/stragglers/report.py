"""Outputs of the what-if analysis: the DP x PP heatmap, a Perfetto timeline of original vs ideal, markdown."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from tasks.outdir import atomic_path
from tasks.stragglers.analyze import Prepared, Slowdowns, simulate
from tasks.stragglers.trace import OPTYPES, PP_COMM, TraceError

STREAMS = ["compute", *PP_COMM, "dp-comm"]


def heatmap(res: Slowdowns, path: str | Path, inputs: tuple[str | Path, ...] = (), overwrite: bool = True, *,
            wait: bool = False) -> Path:
    """PNG: one cell per worker (x = DP rank, y = stage), its slowdown; Reds from 1 to max(1.5, worst). A second
    writer of `path` is refused (a path a person typed), or with `wait` takes its turn and replaces it (the pipeline's
    own file, which two analyses of one run may write at once)."""
    from matplotlib.figure import Figure  # not pyplot: a notebook keeps its inline backend

    data = np.array(res.workers)
    P, D = data.shape
    # wide enough for the title even for a 1 x 1 map (the title was clipped on small jobs)
    fig = Figure(figsize=(min(max(4.5, 2 + 0.45 * D), 24), min(max(2.5, 1.5 + 0.45 * P), 12)))
    ax = fig.subplots()
    im = ax.imshow(data, cmap="Reds", vmin=1.0, vmax=max(1.5, float(data.max())), aspect="auto", origin="upper")
    if P * D <= 400:
        for s in range(P):
            for d in range(D):
                ax.text(d, s, f"{data[s, d]:.2f}", ha="center", va="center", fontsize=7)
    ax.set_yticks(range(P), [str(int(k)) for k in sorted(res.by_stage, key=int)])
    if D <= 64:
        ax.set_xticks(range(D), [str(int(k)) for k in sorted(res.by_dp_rank, key=int)])
    ax.set_xlabel("DP rank")
    ax.set_ylabel("pipeline stage")
    ax.set_title(f"worker slowdown ({res.workers_method})\njob S = {res.slowdown:.3f}", fontsize=10)
    fig.colorbar(im, ax=ax, label="slowdown")
    fig.tight_layout()
    out = Path(path)
    with atomic_path(out, "stragglers analyze --heatmap", inputs=inputs, overwrite=overwrite, wait=wait) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    return out


def _timeline_window(p: Prepared, first_step: int | None, n_steps: int,
                     dp_ranks: list[int] | None) -> tuple[list[int], list[int]]:
    """The step indices and DP ranks a timeline draws; a step or ranks the trace lacks raise `TraceError`."""
    g = p.graph
    steps = list(g.steps)
    if first_step is not None and first_step not in steps:
        raise TraceError(f"--timeline-step {first_step} is not a step of the trace (its steps: {steps[0]} to "
                         f"{steps[-1]}, {len(steps)} of them); give one of those")
    i0 = steps.index(first_step) if first_step is not None else 0
    window = list(range(i0, min(i0 + max(1, n_steps), len(steps))))
    ranks = list(g.dp_ranks[:8]) if dp_ranks is None else [r for r in dp_ranks if r in set(g.dp_ranks.tolist())]
    if not ranks:
        raise TraceError(f"none of the DP ranks {dp_ranks} is in the trace (it has {g.dp_ranks.tolist()}); give "
                         "some of those to --timeline-dp-ranks")
    return window, ranks


def _track_names(pid: int, process: str, stages: np.ndarray) -> list[dict]:
    """The metadata events that name one process and its (stage, stream) tracks, and keep them in order."""
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": process}},
                          {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
    for s in stages:
        for k, name in enumerate(STREAMS):
            tid = int(s) * 8 + k
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": f"stage {int(s)} {name}"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events


def timeline(p: Prepared, path: str | Path, first_step: int | None = None, n_steps: int = 3,
             dp_ranks: list[int] | None = None, inputs: tuple[str | Path, ...] = (), overwrite: bool = True, *,
             wait: bool = False) -> Path:
    """Chrome/Perfetto trace (gzipped JSON) of the original and the ideal timelines for a window of steps.

    One process per (timeline, DP rank), one track per (stage, stream); steps are laid end to end. A
    communication op is drawn as its transfer only (the wait for its peers is left out), with the wait in args.
    """
    g = p.graph
    window, ranks = _timeline_window(p, first_step, n_steps, dp_ranks)
    dpi = {int(r): int(np.flatnonzero(g.dp_ranks == r)[0]) for r in ranks}
    ideal_start, ideal_end = simulate(g, np.ascontiguousarray(np.broadcast_to(p.ideal[:, None], p.dur.shape)))
    comm = np.array([OPTYPES[t] not in ("forward-compute", "backward-compute", "gc", "optimizer") for t in g.optype])
    events: list[dict] = []
    stream_of = np.array([0 if OPTYPES[t] not in PP_COMM and OPTYPES[t] not in
                          ("params-all-gather", "grads-reduce-scatter") else
                          (1 + PP_COMM.index(OPTYPES[t]) if OPTYPES[t] in PP_COMM else 5) for t in g.optype])
    stages = np.unique(g.stage)
    D = g.n_dp
    for label, base_pid, st, en, dur in (("original", 1, g.start, g.end, p.dur),
                                         ("ideal", 100001, ideal_start, ideal_end, None)):
        offset = 0.0
        for si in window:
            cols = [si * D + dpi[r] for r in ranks]
            span = en[:, si * D:(si + 1) * D].max() - st[:, si * D:(si + 1) * D].min()
            for r, c in zip(ranks, cols, strict=True):
                pid = base_pid + int(r)
                for i in range(g.n):
                    s0, e0 = float(st[i, c]), float(en[i, c])
                    d0 = float(dur[i, c]) if dur is not None else float(p.ideal[i])
                    b = e0 - d0 if comm[i] else s0
                    events.append({"name": OPTYPES[g.optype[i]], "ph": "X", "pid": pid,
                                   "tid": int(g.stage[i]) * 8 + int(stream_of[i]),
                                   "ts": round((offset + b) * 1e6, 3), "dur": round(max(e0 - b, 0.0) * 1e6, 3),
                                   "args": {"step": int(g.steps[si]), "seq_id": int(g.seq[i]), "mc": int(g.mc[i]),
                                            "wait_us": round(max(b - s0, 0.0) * 1e6, 3)}})
            offset += float(span) * 1.02
        for r in ranks:
            events += _track_names(base_pid + int(r), f"{label} - DP rank {r}", stages)
    out = Path(path)
    with atomic_path(out, "stragglers analyze --timeline", inputs=inputs, overwrite=overwrite, wait=wait) as tmp, \
            gzip.open(tmp, "wt") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return out


def markdown(res: Slowdowns) -> str:
    """A summary for a Prefect artifact or a terminal."""
    def rows(d: dict[str, float], key: str, top: int = 12) -> str:
        items = sorted(d.items(), key=lambda kv: -kv[1])[:top]
        return "\n".join(f"| {k} | {v:.3f} |" for k, v in items) or f"| (no {key}) | |"

    def ms(x: float) -> str:
        return f"{x * 1e3:.1f}"

    note = ("\n_The slowdown is under 3%: the attribution below is within noise._\n" if res.slowdown < 1.03 else "")
    return f"""# Straggler what-if analysis

`{res.trace}`: {res.ops:,} ops, {res.steps} steps, DP {res.dp_size} x PP {res.pp_size}

| metric | value |
|---|---|
| slowdown S (no-delay / ideal) | {res.slowdown:.3f} |
| resources wasted W = 1 - 1/S | {res.waste:.1%} |
| launch slowdown (trace / no-delay) | {res.launch_slowdown:.3f} |
| step time: trace / no-delay / ideal | {ms(res.step_time_trace_s)} / {ms(res.step_time_nodelay_s)} / {ms(res.step_time_ideal_s)} ms |
| M_W (slowdown explained by the top 3% of workers) | {res.m_w:.2f} |
| M_S (slowdown explained by the last stage) | {res.m_s:.2f} |
| simulator error on the original timeline (median / max per step) | {res.sim_error:.2%} / {res.sim_error_max:.2%} |
{note}
## By op type
| op type | S_t |
|---|---|
{rows(res.by_optype, "op types")}

## By stage
| stage | S |
|---|---|
{rows(res.by_stage, "stages")}

## Slowest DP ranks
| DP rank | S |
|---|---|
{rows(res.by_dp_rank, "DP ranks", 8)}

## Slowest workers ({res.workers_method})
| stage | DP rank | S |
|---|---|---|
""" + "\n".join(f"| {w['stage']} | {w['dp_rank']} | {w['slowdown']:.3f} |" for w in res.top_workers) + "\n"
