"""The `submit` flow: one job from "here is my model and batch size" to trained, evaluated and analysed checkpoints,
with its GPUs given back.

    plan (MARP, cached) -> place (HAS through the ledger; waits in the queue) -> train on the allocation's GPUs
    -> evaluate each committed checkpoint while training goes on -> release -> evaluations -> stragglers
    -> run report (HTML + markdown artifact)

The pipeline is a state machine (tasks/pipeline/): this flow resolves the request, builds the run and drives it with
the stages of flows/stages.py, each a Prefect task. `frenzy submit`, `frenzy demo`, the `submit` deployment and a
notebook all call this flow. The GPUs are released on every exit path (success, failure, cancellation: the trainer
commits its current step first); a crashed flow process gives them back when its lease runs out. A re-run resumes
from the newest verified checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from cluster.inventory import load_cluster
from cluster.ledger import Ledger
from flows.naming import run_name
from flows.stages import FlowStages, evaluation_mode
from tasks.evaluation.suite import load_suite
from tasks.pipeline.attempt import PipelineError
from tasks.pipeline.drive import drive
from tasks.pipeline.request import SubmitRequest, SubmitResult
from tasks.pipeline.run import Run, Stage
from tasks.pipeline.summary import submit_result
from tasks.training.launch import default_run_dir
from tasks.training.storage import Storage

__all__ = ["PipelineError", "SubmitRequest", "SubmitResult", "submit"]


def start(request: SubmitRequest) -> Run:
    """The run of `request`, its paths absolute (Ray's nodes run in the directory of `ray start`), its suite loaded
    (an unknown suite fails before anything starts) and where its checkpoints are evaluated decided."""
    request = request.model_copy(update={"history_dir": str(Path(request.history_dir).absolute()),
                                         "run_dir": str(Path(request.run_dir).absolute()) if request.run_dir else None})
    suite = load_suite(request.suite_spec).name if request.evaluation != "off" else ""
    run_dir = Path(request.run_dir) if request.run_dir else default_run_dir(request.job).absolute()
    return Run(request=request, run_dir=str(run_dir), suite=suite,
               mode=evaluation_mode(request) if suite else "off")


@flow(name="submit", flow_run_name=run_name("submit-{request.job.name}"), log_prints=True)
def submit(request: SubmitRequest) -> SubmitResult:
    """Plan, place, train (evaluating checkpoints as they commit), release, evaluate, analyse, report."""
    run = start(request)
    request = run.request
    cluster = load_cluster(request.cluster_spec)  # an unknown cluster fails before anything starts
    ledger = Ledger(request.ledger)
    ledger.sync(cluster)
    if run.suite:  # the scheduled evaluate-pending covers the roots the ledger knows
        ledger.note_checkpoints(request.job.name, Storage(request.job.training.checkpoint.uri).uri, request.suite_spec)
    run = drive(run, FlowStages(request, ledger, cluster))
    if run.stage is Stage.FAILED:
        raise PipelineError(run.error or f"{run.job}: the run failed")
    return submit_result(run)
