"""What `submit` is asked (`SubmitRequest`: the `submit` form, `frenzy submit`, a notebook) and what a finished run
leaves behind (`SubmitResult`). No Prefect here."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from cluster.ledger import DEFAULT_LEASE_S, Allocation
from tasks.diagnosis.diagnose import Diagnosis
from tasks.diagnosis.recovery import Action
from tasks.evaluation.summary import EvalSummary
from tasks.formschema import drop_null_branches
from tasks.jobspec import JobSpec
from tasks.pipeline.evaluations import EvalFailure
from tasks.planning.plans import RankBy, ResourcePlan
from tasks.stragglers.request import StragglerReport
from tasks.training.elastic import Relayout
from tasks.training.request import TrainResult


class SubmitRequest(BaseModel):
    """A job to run end to end: the model and batch size are the user's, the GPUs are Frenzy's choice."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    job: JobSpec = Field(json_schema_extra={"position": 0})
    """The job (the job YAML as a form): model, batch, steps, checkpointing."""
    cluster: str = Field("local", json_schema_extra={"position": 1})
    """Where it may run: `local` (this worker's GPUs, or its CPU), a preset, or a cluster YAML on the worker; with
    executor ray, `local` means the Ray cluster's nodes."""
    suite: SkipJsonSchema[str | None] = None
    """Evaluation suite (core, quick or a suite YAML) instead of the job's `evaluation.suite`; default the job's,
    else core. (The form has the job's field alone.)"""
    ledger: str | None = None
    """Allocation ledger: a SQLite path or SQLAlchemy URL; default $FRENZY_LEDGER or ~/.frenzy/ledger.db."""
    rank_by: RankBy = "balanced"
    """Plan ranking HAS walks (balanced: the fastest plan among those within 25% of the cheapest compute)."""
    max_wait_s: float = Field(3600.0, gt=0, le=30 * 86400)
    """Seconds to wait in the queue; past it the job leaves the queue cleanly."""
    lease_s: float = Field(DEFAULT_LEASE_S, ge=5, le=86400)
    """Allocation lease in seconds: a crashed run's GPUs come back this long after its last heartbeat."""
    evaluation: Literal["auto", "in-flow", "deployment", "off"] = Field("auto", title="Evaluation mode")
    """Where checkpoints are evaluated. in-flow: in this run while training goes on; deployment: the
    `evaluate-on-checkpoint` deployment, on the commit events; auto: deployment when the Prefect server has it."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device kind for training and evaluation; auto: CUDA when the allocation holds GPUs."""
    run_dir: str | None = None
    """Progress, log, op traces, result and report; default runs/<job name>. One job's: a directory holding
    another job's run is refused."""
    history_dir: str = "evals"
    """Evaluation results and the per-run score history (on Ray, a directory every node sees)."""
    eval_timeout_s: float = Field(1800.0, gt=0)
    """deployment mode: seconds to wait, after training, for the triggered evaluations."""
    max_restarts: int = Field(2, ge=0, le=20)
    """Automatic recoveries from training failures, each diagnosed from the log."""
    hang_s: float = Field(900.0, ge=5, le=86400)
    """Seconds without a progress record after which the trainer counts as hung (killed, treated as a node
    fault); before its first record (start-up), this or 300 s, whichever is longer."""
    executor: str = Field("local", pattern=r"^(local|ray|ray://\S+)$")
    """local: training runs as processes on this worker's own GPUs; ray (the Ray cluster this worker joined, or
    $RAY_ADDRESS) or ray://HOST:PORT: the allocation's ranks run as Ray actors on its nodes."""

    @property
    def cluster_spec(self) -> str:
        """The inventory: the Ray cluster's nodes when training runs on Ray and no other cluster is named."""
        return self.executor if self.executor != "local" and self.cluster == "local" else self.cluster

    def resolved(self, base: Path, job_base: Path | None = None) -> SubmitRequest:
        """This request with every path absolute: the job's against `job_base` (its file's directory; default
        `base`), the run and history directories, a SQLite ledger, a cluster or suite file against `base`."""
        from tasks.paths import absolute, path_like, resolve_job

        base = base.absolute()
        run_dir = Path(absolute(self.run_dir, base, "run_dir") if self.run_dir else base / "runs" / self.job.name)
        changes: dict[str, object] = {"run_dir": str(run_dir), "history_dir": absolute(self.history_dir, base, "history_dir"),
                                      "job": resolve_job(self.job, (job_base or base).absolute(), run_dir)}
        if self.ledger and "://" not in self.ledger:
            changes["ledger"] = absolute(self.ledger, base, "ledger")
        for name in ("cluster", "suite"):
            value = getattr(self, name)
            if value and value not in ("local", "ray") and "://" not in value and path_like(value):
                changes[name] = absolute(value, base, name)
        return self.model_copy(update=changes)

    @property
    def suite_spec(self) -> str:
        """The suite as the user named it (a built-in name or a YAML path)."""
        return self.suite or (self.job.evaluation.suite if self.job.evaluation else "core")


class Recovery(BaseModel):
    """One training failure: its diagnosis, the action taken and, once the job was placed again, where it went."""

    diagnosis: Diagnosis
    action: Action
    relayout: Relayout | None = None

    def line(self) -> str:
        """The run report's sentence: the diagnosis, the action, the relayout when one was recorded."""
        d, act = self.diagnosis, self.action
        text = f"{d.type} ({d.category}): {act.kind}, {act.reason}"
        return f"{text}. {self.relayout.why}" if self.relayout else text


class SubmitResult(BaseModel):
    """What a submitted job leaves behind (`frenzy submit --json`)."""

    job: str
    plan: ResourcePlan
    """The plan HAS placed."""
    plans: list[ResourcePlan]
    """Every plan considered, best first."""
    allocation: Allocation
    train: TrainResult
    evaluations: list[EvalSummary]
    """One per evaluated checkpoint, oldest first."""
    stragglers: StragglerReport | None
    report: str
    """Path of the self-contained HTML run report."""
    released: bool
    """True once the allocation's GPUs are back in the ledger."""
    timings_s: dict[str, float]
    recoveries: list[Recovery] = []
    """Each training failure, its diagnosis and the action taken, in order."""
    evaluation_failures: list[EvalFailure] = []
    """Committed steps whose evaluation failed (deployment mode: the triggered run failed, or crashed again after a
    retry), each with its cause."""
    already_finished: bool = False
    """The job had finished before this submission (its final step committed, its report written): nothing was
    trained or evaluated again, and this is that run's result."""
    notes: list[str] = []
    """What the submitter should know about this result that is not a failure (the job asks for fewer steps than its
    run holds)."""
