"""What the planner is asked (`PlanRequest`: the `plan` form, `frenzy plan`). No Prefect here."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tasks.formschema import drop_null_branches
from tasks.jobspec import JobSpec
from tasks.planning.plans import RankBy


class PlanRequest(BaseModel):
    """What the planner needs: the job (model + batch size), where it may run, and how to rank plans."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    job: JobSpec = Field(json_schema_extra={"position": 0})
    """The job as in a job YAML file."""
    cluster: str = Field("frenzy-testbed", json_schema_extra={"position": 1})
    """Cluster preset (phoebe, frenzy-testbed, local) or a cluster YAML path on the worker."""
    rank_by: RankBy = Field("gpu_seconds", json_schema_extra={"position": 2})
    """Rank plans by GPU-seconds per step (gpu_seconds: efficiency), by step time (time), by GPU-seconds weighted by
    each GPU's peak TFLOPS (compute), or balanced (the fastest among plans within 25% of the cheapest compute)."""
    margin: float = Field(0.05, ge=0, lt=0.5, json_schema_extra={"position": 3})
    """Fraction of each GPU's memory kept free, 0 up to 0.5."""
    top: int = Field(10, ge=1, le=100_000, json_schema_extra={"position": 4})
    """How many plans to return, best first, 1 to 100,000 (a job has fewer plans than that: 100000 shows all)."""

