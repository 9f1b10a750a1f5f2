"""What an evaluation is asked: one checkpoint (`EvaluateRequest`: the `evaluate-checkpoint` form, `frenzy evaluate`)
or every checkpoint not yet evaluated (`PendingRequest`: the `evaluate-pending` form, `frenzy evaluate-pending`). No
Prefect here: the CLI, the flows and a notebook share these."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.formschema import drop_null_branches

if TYPE_CHECKING:
    from tasks.evaluation.runner import EvalOptions


class EvaluateRequest(BaseModel):
    """Which checkpoint, which suite, and how to schedule it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    uri: str = Field(json_schema_extra={"position": 0})
    """A committed checkpoint (`.../step_00000400`, file:// or s3://) or a checkpoint root (its newest commit)."""
    suite: str = Field("core", json_schema_extra={"position": 1})
    """Built-in suite name (core) or a suite YAML on the worker."""
    schedule: Literal["elastic", "naive"] = "elastic"
    """elastic: preload to shm, split/pack/LPT, CPU metrics without a barrier; naive: one trial per dataset."""
    nodes: int = Field(1, ge=1, le=4096)
    """Nodes to spread the trials over (simulated here with `local`; Ray nodes with `ray`)."""
    gpus_per_node: int = Field(1, ge=1, le=64)
    """Inference slots (GPUs) per node."""
    cpu_workers_per_node: int | None = Field(None, ge=1, le=1024)
    """Metric jobs at once per node; default the suite's, capped at the CPU count."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the trials infer."""
    threads: int = Field(1, ge=1, le=1024)
    """torch threads per trial process."""
    history_dir: str = "evals"
    """Where predictions, scores and the per-run score history go (on the worker)."""
    out_dir: str | None = None
    """Predictions, scores and result.json; default <history_dir>/<run>/step_<N>/<suite>."""
    executor: str = Field("local", pattern=r"^(local|ray|ray://\S+)$")
    """`local`: trial processes on this worker; `ray` / `ray://HOST:PORT`: each node a Ray node (precursor, trials
    and metric jobs run there)."""
    ray_nodes: list[str] = []
    """With executor ray: the Ray nodes to use (names, or one comma-separated list); empty: the first `nodes` alive
    ones."""
    overwrite: bool = False
    """Replace the results an earlier evaluation left in the output directory (without it they are kept and the
    evaluation is refused); results are written whole and renamed into place."""
    learn_priors: bool = Field(True, json_schema_extra={"cli": "--learn"})
    """Fold this run's timings into the learned priors that plan later evaluations."""
    reevaluate: bool = True
    """Evaluate even when the history already scores this step on this suite (off: return the recorded scores;
    the commit-triggered deployment runs with it off, so a step evaluated in-flow is not evaluated twice)."""

    @field_validator("ray_nodes", mode="before")
    @classmethod
    def _commas(cls, v: object) -> object:
        items = [v] if isinstance(v, str) else v
        return [n for x in items for n in str(x).split(",") if n] if isinstance(items, list) else v

    def resolved(self, base: Path) -> EvaluateRequest:
        """This request with its local paths absolute against `base` (the checkpoint, a suite file, the history and
        output directories); remote URIs and built-in suite names as they are."""
        from tasks.paths import absolute, path_like

        return self.model_copy(update={
            "uri": absolute(self.uri, base, "uri"), "history_dir": absolute(self.history_dir, base, "history_dir"),
            "out_dir": absolute(self.out_dir, base, "out_dir") if self.out_dir else None,
            "suite": absolute(self.suite, base, "suite") if path_like(self.suite) else self.suite})

    def options(self) -> EvalOptions:
        """How the evaluation runs (tasks.evaluation.runner), as the flow and `frenzy evaluate` both run it."""
        from tasks.evaluation.runner import EvalOptions

        return EvalOptions(schedule=self.schedule, nodes=self.nodes, gpus_per_node=self.gpus_per_node,
                           cpu_workers_per_node=self.cpu_workers_per_node, device=self.device,
                           threads_per_trial=self.threads, out_dir=self.out_dir, learn_priors=self.learn_priors,
                           executor=self.executor, ray_nodes=self.ray_nodes or None)


class PendingRequest(BaseModel):
    """Evaluate every committed checkpoint that the history does not have yet, under the roots named here or, with
    none named, under every checkpoint root the allocation ledger knows (each job `submit` ran)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    roots: list[str] = Field(default_factory=list, json_schema_extra={"position": 0})
    """Checkpoint roots (jobs' checkpoint.uri); empty: every root in the ledger."""
    ledger: str = ""
    """Allocation ledger whose roots to cover: a SQLite path or SQLAlchemy URL; empty: $FRENZY_LEDGER or
    ~/.frenzy/ledger.db."""
    suite: str = ""
    """Suite (core, quick or a suite YAML on the worker); empty: the one each job was submitted with, else core."""
    schedule: Literal["elastic", "naive"] = "elastic"
    """elastic: preload to shm, split/pack/LPT, CPU metrics without a barrier; naive: one trial per dataset."""
    gpus_per_node: int = Field(1, ge=1, le=64)
    """Inference slots (GPUs) on this worker."""
    history_dir: str = ""
    """Where scores go; empty: each run's own history directory, as `submit` recorded it (named roots: evals under
    the data root)."""

