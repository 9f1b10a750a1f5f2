"""The `simulate` flow: replay a trace on a cluster under several policies, with the table as an artifact."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from cluster.compare import compare_policies
from cluster.report import markdown_table, summary_rows
from cluster.request import SimulateRequest
from cluster.simulator import SimConfig
from flows.naming import run_name, submission_base


@flow(name="simulate", flow_run_name=run_name("simulate-{request.cluster}"), log_prints=True)
def simulate_flow(request: SimulateRequest) -> dict[str, Any]:
    """Trace-driven comparison of placement policies; returns the same document as `frenzy simulate --json`."""
    request = request.resolved(submission_base())  # a form's paths: the data root's, never the worker's directory
    cfg = SimConfig(reference_gpu=request.reference_gpu, queue_order=request.queue_order, rank_by=request.rank_by,
                    elastic=request.elastic)
    comp = compare_policies(request.cluster, request.trace, request.policies, cfg, fmt=request.format,
                            load=request.load, progress=print)
    lb = comp.lower_bounds
    md = (f"### {request.trace} on {comp.cluster} ({comp.jobs} jobs, offered load {comp.offered_load:.2f})"
          "\n\nLower bounds: avg JCT "
          f"{lb.avg_jct_s:.0f} s, makespan {lb.makespan_s:.0f} s\n\n" + markdown_table(summary_rows(comp.policies)))
    create_markdown_artifact(key="frenzy-simulation", markdown=md, description="policy comparison")
    return comp.to_json()
