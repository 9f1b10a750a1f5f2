"""The `train` task and flow: run the trainer, show progress in the Prefect UI, announce committed checkpoints.

The task launches the trainer processes (`tasks.training.launch`), turns its progress records into a progress
artifact and run logs, and emits `frenzy.checkpoint.committed` for every commit so that deployments (evaluation)
can be triggered by it. It returns a small record with URIs, never tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.events import emit_event

from flows.naming import run_name, submission_base
from flows.stragglers import StragglerRequest, stragglers_task
from tasks.artifactkey import run_key
from tasks.errors import FrenzyError
from tasks.latest import LatestOnly
from tasks.pipeline.stopped import trainer_ended
from tasks.training.launch import default_run_dir, launch
from tasks.training.progress import CommitProgress, ProgressRecord, StepProgress, describe, is_warning
from tasks.training.request import TrainRequest, TrainResult

CHECKPOINT_EVENT = "frenzy.checkpoint.committed"








def checkpoint_event(record: CommitProgress, run: str, suite: str = "core", history_dir: str = "evals") -> None:
    """Emit `frenzy.checkpoint.committed` for one commit (resource id: the checkpoint URI); `suite` is the one the
    job asks its checkpoints to be evaluated on and `history_dir` where their scores go (the evaluate-on-checkpoint
    trigger passes both on)."""
    emit_event(event=CHECKPOINT_EVENT,
               resource={"prefect.resource.id": f"frenzy.checkpoint.{record.uri}",
                         "prefect.resource.name": f"{run} step {record.step}"},
               payload={"uri": record.uri, "step": record.step, "run": run, "bytes": record.bytes,
                        "suite": suite, "history_dir": history_dir})


@task(name="train", task_run_name="train-{request.job.name}")
def train_task(request: TrainRequest) -> TrainResult:
    """Run the trainer to `training.steps`; progress artifact, logs and one event per committed checkpoint."""
    logger = get_run_logger()
    request = request.resolved(submission_base())
    job = request.job
    suite = request.evaluation_suite or (job.evaluation.suite if job.evaluation else "core")
    art = create_progress_artifact(0.0, key=run_key("train", job.name, job.training.checkpoint.uri or ""),
                                   description=f"{job.name}: step 0/{job.training.steps}")

    # the progress bar off the relay's path: a slow API made the relay, and the release, minutes late (tasks/latest.py)
    bar: LatestOnly[tuple[float, str]] = LatestOnly(
        lambda v: update_progress_artifact(art, v[0], description=v[1]),
        on_error=lambda err: logger.debug("progress artifact not updated: %s", err))

    def on_record(rec: ProgressRecord) -> None:
        if isinstance(rec, StepProgress):
            bar.put((100.0 * rec.step / rec.steps, f"{job.name}: step {rec.step}/{rec.steps}, loss {rec.loss:.4f}, "
                                                   f"{rec.tokens_per_s:,.0f} tok/s, ETA {rec.eta_s:.0f}s"))
        elif isinstance(rec, CommitProgress) and request.announce_commits:
            checkpoint_event(rec, job.name, suite, request.history_dir)
        (logger.warning if is_warning(rec) else logger.info)(describe(rec))

    try:
        try:
            result = _run_trainer(request, job, on_record)
        finally:  # the trainer has ended: its GPUs go back now, whatever the API does after this
            _give_back(request, logger)
        if request.allocation is not None and not result.stopped_early:  # said as it happens, not when the flow
            trainer_ended(job.name, request.allocation.allocation_id)      # is free (in-flow evaluations first)
        bar.put((100.0, f"{job.name}: done at step {result.final_step}"))
    finally:
        bar.close(timeout_s=5.0)
    return result.train_result()


def _give_back(request: TrainRequest, logger: Any) -> None:
    """Release the allocation the trainer ran on, when its submitter asked for it (`AllocationHold.release_at_end`):
    the ledger's own call, here in the task's body, so that nothing that waits for the Prefect API (the task's final
    state, a log, the progress bar) stands between the trainer's end and the release."""
    hold = request.allocation
    if hold is None or not hold.release_at_end:
        return
    from tasks.training.allocation import freed_before_end, ledger_says, release_at_end, released_at_end, released_by_hand

    started = release_at_end(hold)
    if freed_before_end(hold.allocation_id):  # nothing released here: said as the ledger records it
        logger.warning("allocation %s had been %s before the trainer ended: nothing left to release",
                       hold.allocation_id, ledger_says(hold.ledger, hold.allocation_id) or "freed by the ledger")
    elif released_at_end(hold.allocation_id):
        how = ("its GPUs, held since allocation %s was released by hand, are free now that the trainer has stopped"
               if released_by_hand(hold.allocation_id) else "released allocation %s as the trainer ended")
        logger.info(how + "%s", hold.allocation_id,
                    f"; {len(started)} queued job(s) started on its GPUs" if started else "")


def _run_trainer(request: TrainRequest, job: Any, on_record: Callable[[ProgressRecord], None]) -> Any:
    """The trainer's run on this worker's devices (executor local) or as Ray actors on the placement's nodes."""
    if request.executor == "local":
        result = launch(job, Path(request.run_dir) if request.run_dir else None, nproc=request.nproc,
                        resume=request.resume, device=request.device, tp=request.tp, on_record=on_record,
                        gpu_indices=request.gpu_indices, allocation=request.allocation)
    else:
        from cluster.ray_exec import launch_ray

        if not request.placement:
            raise FrenzyError(f"executor {request.executor} needs a placement (the allocation's nodes and ranks)")
        result = launch_ray(job, [(p.node, p.ranks) for p in request.placement],
                            Path(request.run_dir) if request.run_dir else default_run_dir(job), resume=request.resume,
                            device=request.device, tp=request.tp, on_record=on_record,
                            address=None if request.executor == "ray" else request.executor,
                            gpus=request.placement[0].gpus, allocation=request.allocation)
    return result


@flow(name="train", flow_run_name=run_name("train-{request.job.name}"), log_prints=True)
def train_flow(request: TrainRequest) -> TrainResult:
    """Train a job with asynchronous checkpoints; a table artifact lists the committed checkpoints."""
    result = train_task(request)
    create_table_artifact([c.model_dump() for c in result.checkpoints], key=run_key("checkpoints", result.job, result.checkpoint_uri),
                          description=f"{result.job}: committed checkpoints")
    if request.analyze_stragglers and result.trace:
        try:  # the run trained; a trace the analysis cannot use is reported, not a failed training run
            result.stragglers = stragglers_task(StragglerRequest(trace=result.trace))
        except Exception as err:  # noqa: BLE001
            get_run_logger().warning("straggler analysis of %s failed: %s", result.trace, err)
    return result
