"""The evaluation flows: one checkpoint (`evaluate_checkpoint`) and every checkpoint not yet evaluated
(`evaluate_pending`, for schedules). Scores become a table artifact, the run's score history a markdown
artifact and a plot; the work itself is `tasks.evaluation.runner.evaluate`.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact
from pydantic import BaseModel, ConfigDict, Field

from flows.naming import run_name
from tasks.evaluation import history
from tasks.evaluation.record import EvalSummary, evaluate_and_record
from tasks.evaluation.runner import EvalOptions
from tasks.evaluation.suite import load_suite
from tasks.formschema import drop_null_branches


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
    gpus_per_node: int = Field(1, ge=1)
    """Inference slots (GPUs) on this worker."""
    cpu_workers_per_node: int | None = Field(None, ge=1)
    """Metric jobs at once; default the suite's, capped at the CPU count."""
    device: Literal["cpu", "cuda"] = "cpu"
    history_dir: str = "evals"
    """Where predictions, scores and the per-run score history go (on the worker)."""
    nodes: int = Field(1, ge=1)
    """Nodes to spread the trials over (simulated here with `local`; Ray nodes with `ray`)."""
    executor: str = Field("local", pattern=r"^(local|ray|ray://\S+)$")
    """`local`: trial processes on this worker; `ray` / `ray://HOST:PORT`: each node a Ray node (precursor, trials
    and metric jobs run there)."""
    reevaluate: bool = True
    """Evaluate even when the history already scores this step on this suite (off: return the recorded scores;
    the commit-triggered deployment runs with it off, so a step evaluated in-flow is not evaluated twice)."""


def _key(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


@task(name="evaluate", task_run_name="evaluate-{request.uri}")
def evaluate_task(request: EvaluateRequest) -> EvalSummary:
    logger = get_run_logger()
    suite = load_suite(request.suite)
    art = create_progress_artifact(0.0, description=f"evaluating {request.uri} on {suite.name}")

    def progress(msg: str, frac: float) -> None:
        logger.info(msg)
        update_progress_artifact(art, 100.0 * frac, description=msg)

    opts = EvalOptions(schedule=request.schedule, gpus_per_node=request.gpus_per_node,
                       cpu_workers_per_node=request.cpu_workers_per_node, device=request.device, nodes=request.nodes,
                       executor=request.executor)
    _, summary = evaluate_and_record(request.uri, suite, opts, request.history_dir, progress, request.reevaluate,
                                     overwrite=True)  # the pipeline's own directory: a re-evaluation replaces it
    logger.info("step %d: %s (makespan %.1fs, predicted %.1fs)", summary.step, summary.scores, summary.makespan_s,
                summary.predicted_makespan_s)
    return summary


def _publish(summary: EvalSummary, history_dir: str) -> None:
    rows = [{"dataset": ds, "metric": k, "value": round(v, 5)} for ds, ms in summary.scores.items()
            for k, v in ms.items()]
    create_table_artifact(rows, key=_key(f"eval-{summary.run}-{summary.suite}"),
                          description=f"{summary.run} step {summary.step}: suite {summary.suite}")
    entries = history.read(history_dir, summary.run, summary.suite)
    cols = sorted({f"{ds} {m}" for e in entries for ds, ms in e["scores"].items() for m in ms})
    lines = [f"# {summary.run}: {summary.suite} by step", "", "| step | " + " | ".join(cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for e in entries:
        vals = {f"{ds} {m}": v for ds, ms in e["scores"].items() for m, v in ms.items()}
        lines.append(f"| {e['step']} | " + " | ".join(f"{vals[c]:.4g}" if c in vals else "" for c in cols) + " |")
    if summary.history_plot:
        lines += ["", f"Plot: `{summary.history_plot}`"]
    create_markdown_artifact("\n".join(lines), key=_key(f"eval-history-{summary.run}-{summary.suite}"),
                             description="score history of the run")


@flow(name="evaluate-checkpoint", flow_run_name=run_name("evaluate-{request.uri}"), log_prints=True)
def evaluate_checkpoint(request: EvaluateRequest) -> EvalSummary:
    """Evaluate one committed checkpoint on a suite: scores table, score history and its plot."""
    summary = evaluate_task(request)
    _publish(summary, request.history_dir)
    return summary


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
    gpus_per_node: int = Field(1, ge=1)
    history_dir: str = "evals"


def pending_roots(request: PendingRequest) -> tuple[list[tuple[str, str]], list[str]]:
    """The (root, suite) pairs to cover, and the roots that do not exist (a typo, or a job that has not committed
    yet)."""
    from cluster.ledger import Ledger
    from tasks.training.storage import Storage

    known = Ledger(request.ledger or None).checkpoint_roots().values() if not request.roots else []
    roots = sorted({(r, request.suite or s or "core") for r, s in known}
                   | {(r, request.suite or "core") for r in request.roots})
    missing = []
    for root, _ in roots:
        st = Storage(root)
        if not (st.local.is_dir() if st.local is not None else st.fs.exists(st.root)):
            missing.append(root)
    return roots, missing


@flow(name="evaluate-pending", log_prints=True)
def evaluate_pending(request: PendingRequest) -> list[EvalSummary]:
    """Evaluate, oldest first, each committed checkpoint not yet evaluated on the suite (for a schedule)."""
    logger = get_run_logger()
    roots, missing = pending_roots(request)
    if not roots:
        logger.warning("no checkpoint roots: the ledger knows no submitted job yet and none were named")
    for root in missing:
        logger.warning("checkpoint root %s does not exist: nothing there to evaluate (a typo, or a job that has "
                       "not committed a checkpoint yet)", root)
    out = []
    for root, suite in [(r, s) for r, s in roots if r not in missing]:
        todo = history.pending(root, request.history_dir, load_suite(suite).name)
        logger.info("%d checkpoint(s) to evaluate under %s on %s", len(todo), root, suite)
        for uri in todo:
            out.append(evaluate_checkpoint(EvaluateRequest(uri=uri, suite=suite, schedule=request.schedule,
                                                           gpus_per_node=request.gpus_per_node,
                                                           history_dir=request.history_dir, reevaluate=False)))
    return out
