"""The `train` task and flow: run the trainer, show progress in the Prefect UI, announce committed checkpoints.

The task launches the trainer processes (`tasks.training.launch`), turns its progress records into a progress
artifact and run logs, and emits `frenzy.checkpoint.committed` for every commit so that deployments (evaluation)
can be triggered by it. It returns a small record with URIs, never tensors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.events import emit_event
from pydantic import BaseModel, ConfigDict, Field

from flows.naming import run_name
from flows.stragglers import StragglerReport, StragglerRequest, stragglers_task
from tasks.errors import FrenzyError
from tasks.formschema import drop_null_branches
from tasks.jobspec import JobSpec
from tasks.training.checkpoint import CheckpointRecord
from tasks.training.guard import SpikeCounts
from tasks.training.launch import default_run_dir, launch
from tasks.training.progress import WARNING_EVENTS, describe

CHECKPOINT_EVENT = "frenzy.checkpoint.committed"


class TrainResult(BaseModel):
    """What a training run leaves behind (the same keys as `frenzy train --json`)."""

    job: str
    final_step: int
    resumed_from_step: int | None
    checkpoints: list[CheckpointRecord]
    checkpoint_uri: str
    last_loss: float
    tokens_per_s: float
    trace: str | None
    run_dir: str
    world_size: int = 1
    """Ranks that trained (across every node of the allocation)."""
    data_fraction: float = 0.0
    """Share of the loop's time spent reading batches (the loader keeping up)."""
    spike_counts: SpikeCounts = Field(default_factory=SpikeCounts)
    """What the spike guard did: spikes seen, rollbacks, updates and samples skipped (this invocation)."""
    stragglers: StragglerReport | None = None
    """The straggler analysis of the run's traces (a StragglerReport) when train_flow ran it."""


class NodeRanks(BaseModel):
    """Training ranks on one node."""

    node: str
    ranks: int = Field(ge=1)
    gpus: bool = False
    """Each rank takes one of the node's GPUs (False: CPU ranks)."""


class TrainRequest(BaseModel):
    """A training job and where it runs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    job: JobSpec = Field(json_schema_extra={"position": 0})
    """The job: model, batch, steps, checkpointing (the job YAML as a form)."""
    nproc: int = Field(1, ge=1, json_schema_extra={"position": 1})
    """Ranks on this worker (gloo on CPU, NCCL on GPUs)."""
    tp: int = Field(1, ge=1)
    """Tensor-parallel degree; data parallel is nproc / tp."""
    resume: bool = True
    """Continue from the newest checkpoint that verifies (a re-run of a failed flow picks up where it stopped)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device kind; auto uses CUDA when present."""
    run_dir: str | None = None
    """Progress, log, op traces and result; default runs/<job name> under the worker's directory."""
    gpu_indices: list[int] | None = None
    """GPUs of this node to use (an allocation's `nodes[0].gpu_indices`); one rank each. None: nproc ranks."""
    analyze_stragglers: bool = True
    """Run the straggler what-if analysis on the run's op traces when it ends (artifacts beside the trace)."""
    evaluation_suite: str | None = None
    """Suite named in the commit events (what evaluate-on-checkpoint runs); empty: the job's, else core."""
    executor: str = Field("local", pattern=r"^(local|ray|ray://\S+)$")
    """`local`: processes on this worker (torchrun); `ray` (the Ray cluster this worker joined, or $RAY_ADDRESS) or
    `ray://HOST:PORT`: Ray actors on the nodes of `placement`."""
    placement: list[NodeRanks] | None = None
    """Ray executor: ranks per node (an allocation's nodes and GPU counts)."""
    announce_commits: bool = True
    """Emit `frenzy.checkpoint.committed` per commit (what triggers the evaluate-on-checkpoint deployment); `submit`
    turns it off when it evaluates the checkpoints itself, so that no step is evaluated twice."""


def checkpoint_event(record: dict, run: str, suite: str = "core") -> None:
    """Emit `frenzy.checkpoint.committed` for one commit (resource id: the checkpoint URI); `suite` is the one the
    job asks its checkpoints to be evaluated on (the evaluate-on-checkpoint trigger passes it on)."""
    emit_event(event=CHECKPOINT_EVENT,
               resource={"prefect.resource.id": f"frenzy.checkpoint.{record['uri']}",
                         "prefect.resource.name": f"{run} step {record['step']}"},
               payload={"uri": record["uri"], "step": record["step"], "run": run, "bytes": record["bytes"],
                        "suite": suite})


@task(name="train", task_run_name="train-{request.job.name}")
def train_task(request: TrainRequest) -> TrainResult:
    """Run the trainer to `training.steps`; progress artifact, logs and one event per committed checkpoint."""
    logger = get_run_logger()
    job = request.job
    suite = request.evaluation_suite or (job.evaluation.suite if job.evaluation else "core")
    art = create_progress_artifact(0.0, key=re.sub(r"[^a-z0-9-]+", "-", f"train-{job.name}".lower()),
                                   description=f"{job.name}: step 0/{job.training.steps}")

    def on_record(rec: dict[str, Any]) -> None:
        ev = rec["event"]
        if ev == "step":
            update_progress_artifact(art, 100.0 * rec["step"] / rec["steps"],
                                     description=f"{job.name}: step {rec['step']}/{rec['steps']}, loss "
                                                 f"{rec['loss']:.4f}, {rec['tokens_per_s']:,.0f} tok/s, "
                                                 f"ETA {rec['eta_s']:.0f}s")
        elif ev == "checkpoint" and request.announce_commits:
            checkpoint_event(rec, job.name, suite)
        (logger.warning if ev in WARNING_EVENTS else logger.info)(describe(rec))

    if request.executor == "local":
        result = launch(job, Path(request.run_dir) if request.run_dir else None, nproc=request.nproc,
                        resume=request.resume, device=request.device, tp=request.tp, on_record=on_record,
                        gpu_indices=request.gpu_indices)
    else:
        from cluster.ray_exec import launch_ray

        if not request.placement:
            raise FrenzyError(f"executor {request.executor} needs a placement (the allocation's nodes and ranks)")
        result = launch_ray(job, [(p.node, p.ranks) for p in request.placement],
                            Path(request.run_dir) if request.run_dir else default_run_dir(job), resume=request.resume,
                            device=request.device, tp=request.tp, on_record=on_record,
                            address=None if request.executor == "ray" else request.executor,
                            gpus=request.placement[0].gpus)
    update_progress_artifact(art, 100.0, description=f"{job.name}: done at step {result['final_step']}")
    return TrainResult.model_validate({k: result[k] for k in TrainResult.model_fields if k in result})


@flow(name="train", flow_run_name=run_name("train-{request.job.name}"), log_prints=True)
def train_flow(request: TrainRequest) -> TrainResult:
    """Train a job with asynchronous checkpoints; a table artifact lists the committed checkpoints."""
    result = train_task(request)
    create_table_artifact([c.model_dump() for c in result.checkpoints], key="frenzy-checkpoints",
                          description=f"{result.job}: committed checkpoints")
    if request.analyze_stragglers and result.trace:
        try:  # the run trained; a trace the analysis cannot use is reported, not a failed training run
            result.stragglers = stragglers_task(StragglerRequest(trace=result.trace))
        except Exception as err:  # noqa: BLE001
            get_run_logger().warning("straggler analysis of %s failed: %s", result.trace, err)
    return result
