"""The `plan` stage as Prefect objects: a cached `plan_resources` task and a `plan` flow (UI form, notebook).

    from flows.plan import plan
    plans = plan(PlanRequest(job=JobSpec(model={"preset": "gpt2-350m"}), cluster="phoebe"))
"""

from __future__ import annotations

from datetime import timedelta

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from pydantic import BaseModel, ConfigDict, Field

from cluster.inventory import Cluster, load_cluster
from flows.naming import run_name
from tasks.formschema import drop_null_branches
from tasks.jobspec import JobSpec
from tasks.planning.calibration import OomObservation, load_observations
from tasks.planning.plans import RankBy, ResourcePlan
from tasks.planning.plans import plan_resources as _plan_resources


class PlanRequest(BaseModel):
    """What the planner needs: the job (model + batch size), where it may run, and how to rank plans."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    job: JobSpec = Field(json_schema_extra={"position": 0})
    """The job as in a job YAML file."""
    cluster: str = Field("frenzy-testbed", json_schema_extra={"position": 1})
    """Cluster preset (phoebe, frenzy-testbed, local) or a cluster YAML path on the worker."""
    rank_by: RankBy = Field("gpu_seconds", json_schema_extra={"position": 2})
    """Rank plans by GPU-seconds per step (efficiency), by step time, or balanced (fastest among efficient)."""
    margin: float = Field(0.05, ge=0, lt=0.5, json_schema_extra={"position": 3})
    """Fraction of each GPU's memory kept free."""
    top: int = Field(10, ge=1, le=1000, json_schema_extra={"position": 4})
    """How many plans to return."""


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
