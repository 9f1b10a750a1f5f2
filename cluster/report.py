"""Tables and plots of simulation results (shared by the CLI, the `simulate` flow and the benchmark)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.sim_engine import SimResult, SimSummary


def summary_rows(policies: Mapping[str, SimSummary]) -> list[dict[str, str]]:
    """One display row per policy (column title -> cell text) with the headline metrics, formatted. The JCT figures
    are over every job, an unfinished one counted up to the end of the simulation (cluster/simulator.py): `done` says
    how many finished."""
    rows = []
    for name, s in policies.items():
        def sec(value: float, s: SimSummary = s) -> str:  # "-" where no job finished, never "-0"
            return f"{round(value)}" if s.completed else "-"

        done = f"{s.completed}/{s.jobs}" + (f" ({s.unschedulable} never fit)" if s.unschedulable else "")
        rows.append({"policy": name, "done": done, "avg JCT s": sec(s.avg_jct_s),
                     "p50 JCT s": sec(s.p50_jct_s), "p99 JCT s": sec(s.p99_jct_s),
                     "avg queue s": sec(s.avg_queue_s), "makespan s": f"{round(s.makespan_s)}",
                     "OOM": str(s.oom_failures), "decision p50/p99 ms": f"{s.decision_p50_ms:.3f}/{s.decision_p99_ms:.3f}",
                     "round p50/p99 ms": f"{s.round_p50_ms:.2f}/{s.round_p99_ms:.2f}",
                     "util": " ".join(f"{t}:{u:.0%}" for t, u in s.utilisation.items())})
    return rows


def markdown_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(no results)"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(out)


def plot_jct_cdf(results: Mapping[str, SimResult], path: str, title: str = "", overwrite: bool = True) -> None:
    """CDF of job completion times, one line per policy."""
    import numpy as np
    from matplotlib.figure import Figure  # not pyplot: a notebook keeps its inline backend

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for name, res in results.items():
        jct = np.sort([j.finish - j.trace.submit_s for j in res.jobs if j.finish is not None])
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:  # no policy finished a job: an empty plot, not a legend of nothing
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no job finished", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    from tasks.outdir import atomic_path

    with atomic_path(path, "cluster simulate --plot", overwrite=overwrite) as tmp:
        fig.savefig(tmp, dpi=120)


def write_jobs_csv(results: Mapping[str, SimResult], path: str, overwrite: bool = True) -> int:
    """One row per policy and job: times, where it ran and, for `has`, which plan it chose and why (the decision
    record of cluster/sizing.py). Returns the rows written."""
    import csv

    from tasks.outdir import atomic_path

    n = 0
    with atomic_path(path, "cluster simulate --jobs-csv", overwrite=overwrite) as tmp, \
            open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "job", "submit_s", "start_s", "finish_s", "gpus", "gpu_type", "layout", "ooms",
                    "unschedulable", "decision"])
        for pol, res in results.items():
            for j in res.jobs:
                w.writerow([pol, j.trace.name, f"{j.trace.submit_s:.0f}", "" if j.start is None else f"{j.start:.0f}",
                            "" if j.finish is None else f"{j.finish:.0f}", sum(c for _, c in j.nodes), j.gpu_type,
                            j.layout, j.ooms, j.unschedulable, j.decision])
                n += 1
    return n
