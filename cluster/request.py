"""What a trace replay is asked (`SimulateRequest`: the `simulate` form, `frenzy simulate`). No Prefect here."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cluster.traces import REFERENCE_GPU
from tasks.formschema import drop_null_branches
from tasks.planning.plans import RankBy


class SimulateRequest(BaseModel):
    """Which cluster, which trace, which policies."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    cluster: str = Field("phoebe", json_schema_extra={"position": 0})
    """Cluster preset (phoebe, frenzy-testbed) or a cluster YAML path on the worker."""
    trace: str = Field("newworkload:30", json_schema_extra={"position": 1})
    """Trace CSV path on the worker, or newworkload:N[:SEED], production:N[:SEED], mixed:N[:SEED]."""
    format: Literal["generic", "philly", "sia", "openb", "helios"] | None = Field(None, json_schema_extra={"position": 2})
    """Trace format; None guesses from the header."""
    policies: list[Literal["has", "has-arrival", "fcfs", "fifo", "ilp"]] = Field(
        ["has", "fcfs", "fifo", "ilp"], json_schema_extra={"position": 3})
    """Policies to compare (has: Frenzy's default; has-arrival: its placement in arrival order, not a default)."""
    load: float | None = Field(None, gt=0.0, le=10.0)
    """Rescale the arrivals to this offered load (0.5-1.1 in the benchmark); None keeps the trace's own times."""
    queue_order: Literal["shortest", "backfill", "strict"] = "shortest"
    """HAS queue order."""
    rank_by: RankBy = "balanced"
    """MARP plan ranking used by HAS."""
    reference_gpu: str = REFERENCE_GPU
    """GPU type the trace durations refer to."""
    elastic: Literal["trace", "all", "none"] = "trace"
    """Whether jobs may change their GPU count: as each trace job says, all, or none."""

    def resolved(self, base: Path) -> SimulateRequest:
        """This request with a cluster YAML or trace file made absolute against `base`, `~` and `$NAME` expanded
        (tasks/paths.py); a preset or a synthetic trace (`newworkload:30`) is a name, left as it is."""
        from tasks.paths import absolute, path_like

        changes = {}
        if path_like(self.cluster):
            changes["cluster"] = absolute(self.cluster, base, "cluster")
        if path_like(self.trace, (".csv", ".gz", ".parquet")) or "$" in self.trace:
            changes["trace"] = absolute(self.trace, base, "trace")
        return self.model_copy(update=changes)
