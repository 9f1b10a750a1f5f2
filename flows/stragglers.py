"""The `stragglers` task and flow: what-if analysis of a training op trace, with its report as artifacts.

Writes `slowdowns.json`, `heatmap.png`, `timeline.json.gz` (Perfetto) and `summary.md` next to the trace (or to
`out_dir`), publishes the summary as a markdown artifact and the per-op-type slowdowns as a table artifact, and
returns a small record with the headline numbers and the file paths. `train_flow` runs it on its traces.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.naming import run_name, submission_base
from tasks.artifactkey import run_key
from tasks.outdir import atomic_file
from tasks.stragglers.analyze import analyze
from tasks.stragglers.report import heatmap, markdown, timeline
from tasks.stragglers.request import StragglerReport, StragglerRequest
from tasks.stragglers.trace import load_trace


@task(name="stragglers", task_run_name="stragglers-{request.trace}")
def stragglers_task(request: StragglerRequest) -> StragglerReport:
    logger = get_run_logger()
    request = request.resolved(submission_base())  # a form's paths: the data root's, never the worker's directory
    tr = load_trace(request.trace, request.meta)
    res, prep = analyze(tr, progress=logger.info)
    out = Path(request.out_dir) if request.out_dir else Path(tr.path).parent / "stragglers"
    out.mkdir(parents=True, exist_ok=True)
    atomic_file(out / "slowdowns.json", json.dumps(res.model_dump(), indent=1).encode(), "stragglers", True, wait=True)
    md = markdown(res)
    atomic_file(out / "summary.md", md.encode(), "stragglers", True, wait=True)
    # two analyses of one run (two submits of one job at once) take turns on its files; both reports carry them
    hm = str(heatmap(res, out / "heatmap.png", wait=True)) if request.heatmap else None
    tl = str(timeline(prep, out / "timeline.json.gz", n_steps=request.timeline_steps, wait=True)) \
        if request.timeline_steps else None
    run = tr.meta.run_id or tr.meta.trial_name or Path(tr.path).parent.name  # keyed by the trace: one per run
    trace_id = str(Path(tr.path).absolute())
    create_markdown_artifact(md, key=run_key("stragglers", run, trace_id),
                             description=f"straggler what-if analysis of {tr.path}")
    create_table_artifact([{"op type": k, "slowdown": round(v, 4)} for k, v in res.by_optype.items()],
                          key=run_key("stragglers-optypes", run, trace_id), description="slowdown attributed to each op type")
    logger.info("S = %.3f (waste %.1f%%), launch slowdown %.3f, simulator error %.2f%%", res.slowdown,
                100 * res.waste, res.launch_slowdown, 100 * res.sim_error)
    return StragglerReport(trace=tr.path, slowdown=res.slowdown, waste=res.waste,
                           launch_slowdown=res.launch_slowdown, sim_error=res.sim_error,
                           worst_optype=max(res.by_optype, key=res.by_optype.get),
                           worst_stage=max(res.by_stage, key=res.by_stage.get),
                           worst_dp_rank=max(res.by_dp_rank, key=res.by_dp_rank.get),
                           report=str(out / "slowdowns.json"), heatmap=hm, timeline=tl)


@flow(name="stragglers", flow_run_name=run_name("stragglers"), log_prints=True)
def stragglers_flow(request: StragglerRequest) -> StragglerReport:
    """Straggler what-if analysis of a training trace (S, per op type / stage / DP rank, heatmap, timeline)."""
    return stragglers_task(request)
