"""The `submit` flow: one job from "here is my model and batch size" to trained, evaluated and analysed checkpoints,
with its GPUs given back.

    plan (MARP, cached) -> place (HAS through the ledger; waits in the queue) -> train on the allocation's GPUs
    -> evaluate each committed checkpoint while training goes on -> release -> evaluations -> stragglers
    -> run report (HTML + markdown artifact)

The pipeline is a state machine (tasks/pipeline/): this flow resolves the request, builds the run and drives it with
the stages of flows/stages.py, each a Prefect task. `frenzy submit`, `frenzy demo`, the `submit` deployment and a
notebook all call this flow. The GPUs are released on every exit path (success, failure, cancellation: the trainer
commits its current step first); a crashed flow process gives them back when its lease runs out. A re-run resumes
from the newest verified checkpoint. Interrupted from Python (a notebook), it raises `SubmitInterrupted`, whose
message is the line the CLI prints: `submit: stopped at step N, committed under URI; ...`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import Flow, flow, get_run_logger
from prefect.runtime import flow_run

from cluster.inventory import load_cluster
from cluster.ledger import Ledger
from flows import guardian
from flows.logs import verbatim_console
from flows.naming import run_name, submission_base
from flows.stages import FlowStages, evaluation_mode, report_task
from tasks.evaluation.suite import Suite, SuiteError, load_suite
from tasks.paths import path_like
from tasks.pipeline.attempt import PipelineError
from tasks.pipeline.drive import drive
from tasks.pipeline.request import SubmitRequest, SubmitResult
from tasks.pipeline.run import Run, Stage
from tasks.pipeline.stopped import SubmitInterrupted, reached, stopped_at
from tasks.pipeline.summary import (
    already_finished,
    foreign_root,
    foreign_run_dir,
    name_taken,
    never_evaluated,
    outputs_in_root,
    rerun_report,
    submit_result,
    this_run,
)
from tasks.training.storage import Storage

if TYPE_CHECKING:
    from tasks.evaluation.datasets import DatasetProblem

__all__ = ["PipelineError", "SubmitInterrupted", "SubmitRequest", "SubmitResult", "submit"]


def _dataset_problems(request: SubmitRequest, suite: Suite | None) -> list[DatasetProblem]:
    """What every evaluation would refuse of the suite's datasets, found before training (after it, otherwise). The
    datasets module loads the evaluation engine and torch: a run with evaluation off does not import it."""
    if suite is None:
        return []
    from tasks.evaluation.datasets import dataset_problems

    return dataset_problems(suite, Path(request.suite_spec).parent if path_like(request.suite_spec) else None)


def start(request: SubmitRequest) -> Run:
    """The run of `request`, its paths absolute, its suite loaded (an unknown suite fails before anything starts) and
    where its checkpoints are evaluated decided. A path still relative (a form has no directory of its own) is
    relative to the data root when a deployment runs the flow, never to the worker's working directory; run in a
    process of the user's (the CLI, a notebook), to where it runs."""
    request = request.resolved(submission_base())
    suite = load_suite(request.suite_spec) if request.evaluation != "off" else None
    mode = evaluation_mode(request, get_run_logger().warning) if suite else "off"
    problems = _dataset_problems(request, suite)
    # in-flow the evaluation runs in this process: what it lacks fails here; a worker may have a plugin this lacks
    if refused := [p.text for p in problems if p.everywhere or mode == "in-flow"]:
        raise SuiteError(f"{request.suite_spec}: {'; '.join(refused)}")
    for p in problems:
        get_run_logger().warning("%s: %s (the workers that evaluate must have it)", request.suite_spec, p.text)
    return Run(request=request, run_dir=str(request.run_dir), suite=suite.name if suite else "", mode=mode)


@flow(name="submit", flow_run_name=run_name("submit-{request.job.name}"), log_prints=True)
def submit(request: SubmitRequest) -> SubmitResult:
    """Plan, place, train (evaluating checkpoints as they commit), release, evaluate, analyse, report."""
    verbatim_console()
    guardian.tell(flow_run.id)  # a process killed outright still ends its run: Crashed (flows/guardian.py)
    reached(request.job.name, "planning")  # where a stop says the run was, until a stage says more (FlowStages.reach)
    guardian.tell_phase("planning")
    run = start(request)
    request = run.request
    if (why := outputs_in_root(request)) is not None:  # found after training otherwise (red team 41h N13)
        raise PipelineError(why)
    cluster = load_cluster(request.cluster_spec)  # an unknown cluster fails before anything starts
    ledger = Ledger(request.ledger)
    active = {a.job for a in ledger.allocations()} | {q.job for q in ledger.queue()}
    if (why := name_taken(ledger.runs(run.job), request, active)) is not None:
        raise PipelineError(why)
    if (why := foreign_root(request) or foreign_run_dir(request)) is not None:
        raise PipelineError(why)
    rec = this_run(ledger.runs(run.job), request.job.training.checkpoint.uri or None)
    if (done := already_finished(rec, request, run.suite)) is not None:
        get_run_logger().info("%s had finished at step %d (report %s): nothing to train or evaluate again",
                              run.job, done.train.final_step, done.report)
        if Path(done.report).parent.is_dir():  # the report says what this rerun says: today's scores and failures
            report_task(rerun_report(done, request, cluster.name), done.report, request.job.training.checkpoint.uri or "")
        for note in done.notes:
            get_run_logger().warning(note)
        return done
    if never := never_evaluated(rec, request, run.suite):  # finished with evaluation off (red team 41j S06)
        get_run_logger().info("%s", note := f"{run.job} had finished: nothing trained, steps {never} evaluated now")
    ledger.sync(cluster)
    if run.suite:  # the scheduled evaluate-pending covers the roots the ledger knows
        ledger.note_checkpoints(request.job.name, Storage(request.job.training.checkpoint.uri).uri, request.suite_spec)
    stages = FlowStages(request, ledger, cluster)
    run = drive(run, stages)
    if run.stage is Stage.FAILED:
        raise PipelineError(run.error or f"{run.job}: the run failed")
    result = submit_result(run)
    if never:
        result = result.model_copy(update={"notes": [note, *result.notes]})
    if stages.ledger_lost:  # the trainer has ended, but no ledger recorded the release of its GPUs
        result = result.model_copy(update={"released": False, "notes": [*result.notes, stages.ledger_lost]})
    for note in result.notes:
        get_run_logger().warning(note)
    return result


class _SubmitFlow(Flow):
    """The `submit` flow called from Python (a notebook): interrupted, it raises `SubmitInterrupted` with the record
    the CLI prints its one line from (tasks/pipeline/stopped.py), instead of a bare KeyboardInterrupt; against a Prefect
    server, a guardian process marks the run Crashed should this process be killed outright (flows/guardian.py)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(request := args[0] if args else kwargs.get("request"), SubmitRequest):
            reached(request.job.name, "planning")  # an interrupt before the flow's own start says so too
        try:
            with guardian.guarded():
                return super().__call__(*args, **kwargs)
        except SubmitInterrupted:
            raise
        except KeyboardInterrupt:
            request = args[0] if args else kwargs.get("request")
            ledger, job = (request.ledger, request.job.name) if isinstance(request, SubmitRequest) else (None, "")
            raise SubmitInterrupted(stopped_at(_checkpoint_root(request), ledger, job)) from None


def _checkpoint_root(request: object) -> str:
    """Where the interrupted run commits, resolved as the flow resolved it."""
    if not isinstance(request, SubmitRequest):
        return ""
    try:
        return request.resolved(submission_base()).job.training.checkpoint.uri or ""
    except Exception:  # noqa: BLE001 - the record is given whatever the request says
        return request.job.training.checkpoint.uri or ""


submit.__class__ = _SubmitFlow  # the decorated `def submit` stays, for Prefect's deployments (they parse the file)
