"""What the straggler analysis is asked (`StragglerRequest`: the `stragglers` form, `frenzy stragglers analyze`) and
what it answers (`StragglerReport`). No Prefect here: the CLI, the flow and a notebook share these."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tasks.formschema import drop_null_branches


class StragglerRequest(BaseModel):
    """Which trace to analyse and what to draw."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    trace: str = Field(json_schema_extra={"position": 0})
    """Trace parquet file (or its directory) on the worker, in the straggler format."""
    meta: str | None = None
    """The job's meta YAML; default the one meta*.yaml beside the trace."""
    out_dir: str | None = None
    """Where the report files go; default `stragglers/` beside the trace."""
    heatmap: bool = True
    """Draw the DP x PP worker slowdown heatmap (PNG)."""
    timeline_steps: int = Field(3, ge=0)
    """Steps in the Perfetto timeline of original vs ideal (0: none)."""

    def resolved(self, base: Path) -> StragglerRequest:
        """This request with its paths absolute against `base`, `~` and `$NAME` expanded (tasks/paths.py)."""
        from tasks.paths import absolute

        return self.model_copy(update={k: absolute(v, base, k) for k in ("trace", "meta", "out_dir")
                                       if (v := getattr(self, k))})


class StragglerReport(BaseModel):
    """The headline numbers and where the full report lies."""

    trace: str
    slowdown: float
    waste: float
    launch_slowdown: float
    sim_error: float
    worst_optype: str
    worst_stage: str
    worst_dp_rank: str
    report: str
    heatmap: str | None
    timeline: str | None

