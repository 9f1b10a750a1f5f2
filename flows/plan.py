"""The `plan` stage as Prefect objects: a cached `plan_resources` task and a `plan` flow (UI form, notebook).

    from flows.plan import plan
    plans = plan(PlanRequest(job=JobSpec(model={"preset": "gpt2-350m"}), cluster="phoebe"))
"""

from __future__ import annotations

from datetime import timedelta

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE

from cluster.inventory import Cluster, load_cluster
from flows.naming import run_name
from tasks.planning.calibration import OomObservation, load_observations
from tasks.planning.plans import ResourcePlan
from tasks.planning.plans import plan_resources as _plan_resources
from tasks.planning.request import PlanRequest


@task(cache_policy=INPUTS + TASK_SOURCE, cache_expiration=timedelta(days=7), persist_result=True)
def plan_resources(request: PlanRequest, observations: list[OomObservation] | None = None,
                   inventory: Cluster | None = None) -> list[ResourcePlan]:
    """Ranked resource plans (pure and deterministic, so cached on its inputs: the recorded out-of-memory
    observations and the loaded inventory are among them, so a new observation, or a Ray cluster or host that
    changed, re-plans)."""
    cluster = inventory or load_cluster(request.cluster)
    return _plan_resources(request.job, cluster, rank_by=request.rank_by, margin=request.margin,
                           top=request.top, observations=observations)


def plans_markdown(request: PlanRequest, plans: list[ResourcePlan]) -> str:
    head = (f"### Plans for `{request.job.name}` ({request.job.model.display_name}) on `{request.cluster}`\n\n"
            "| rank | GPU | GPUs | layout | peak GiB | step s | GPU-s/step |\n|---|---|---|---|---|---|---|\n")
    return head + "\n".join(
        f"| {p.rank} | {p.gpu_type} | {p.gpus} | {p.layout.label()} | {p.predicted_device_gib:.1f} | "
        f"{p.est_step_time_s:.3f} | {p.gpu_seconds_per_step:.3f} |" for p in plans)


@flow(name="plan", flow_run_name=run_name("plan-{request.job.name}"), log_prints=True)
def plan(request: PlanRequest) -> list[ResourcePlan]:
    """MARP: which GPU types and counts can train this job, best first."""
    plans = plan_resources(request, load_observations(), load_cluster(request.cluster))
    create_markdown_artifact(key="frenzy-plans", markdown=plans_markdown(request, plans),
                             description="MARP resource plans")
    print(f"{len(plans)} plans; best: {plans[0].gpus} x {plans[0].gpu_type} ({plans[0].layout.label()})")
    return plans
