"""What the trainer is asked (`TrainRequest`: the `train` form, `frenzy train`) and what a run leaves behind
(`TrainerResult`: everything, in result.json; `TrainResult`: what a flow returns). No Prefect here: the CLI, the flows
and a notebook share these."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.formschema import drop_null_branches
from tasks.jobspec import JobSpec
from tasks.stragglers.request import StragglerReport
from tasks.training.checkpoint import CheckpointRecord
from tasks.training.guard import SpikeCounts, SpikeRecord
from tasks.training.interval import FixedInterval, IntervalInputs


class FailedCheckpoint(BaseModel):
    """A checkpoint whose background persist failed (the run went on; the next checkpoint was tried)."""

    step: int
    error: str


class AllocationHold(BaseModel):
    """The ledger allocation a trainer runs on. Rank 0 renews its lease itself, beside the submitter's heartbeat, so
    that the GPUs stay allocated exactly as long as the process that uses them (a submitter stopped by Ctrl-Z no
    longer lets them go to another job under a running trainer), and stops, committing its step, when the
    allocation is gone (`tasks/training/allocation.py`)."""

    model_config = ConfigDict(extra="forbid")

    ledger: str
    """The ledger's SQLAlchemy URL."""
    allocation_id: str
    lease_s: float = Field(gt=0)
    release_at_end: bool = False
    """Give the allocation back as soon as the trainer has ended, from the train task itself: not after the task's
    final state, which goes through the Prefect API (red team 41n B3: a stopped server held the GPUs 25 s)."""


class TrainerResult(BaseModel):
    """Everything one trainer invocation reports: what `launch()` returns, rank 0's `<run_dir>/result.json` and
    `frenzy train --json` (these keys, in this order)."""

    job: str
    final_step: int
    resumed_from_step: int | None
    stopped_early: bool
    """It stopped before `training.steps` (a stop file, a signal, `--stop-after-steps`), its step committed."""
    checkpoints: list[CheckpointRecord]
    """The commits of this invocation."""
    snapshot_pin_s: float | None = None
    """Seconds until the snapshot buffers were page-locked (checkpoint/persist.py); None: not pinned (no CUDA, or
    pinning failed)."""
    checkpoint_interval: IntervalInputs | FixedInterval = Field(union_mode="left_to_right")
    """`every_steps`, with the interval's inputs under `every_steps: auto` (interval.py's IntervalInputs)."""
    failed_checkpoints: list[FailedCheckpoint]
    spikes: list[SpikeRecord]
    """The spikes the guard handled (guard.py), in order."""
    spike_counts: SpikeCounts
    last_loss: float
    """NaN when no step ran (a resume at the final step)."""
    steps_run: int
    elapsed_s: float
    tokens_per_s: float
    """Over the loop, up to the last optimizer update."""
    blocked_s_total: float
    """Seconds the loop was blocked by checkpoint snapshots."""
    data_s_total: float
    data_fraction: float
    """Share of the loop's time spent reading batches (the loader keeping up)."""
    world_size: int
    tp: int
    device: str
    checkpoint_uri: str
    trace: str | None
    """The merged op trace (the stragglers' parquet format); None without traced steps."""
    run_dir: str

    def train_result(self) -> TrainResult:
        """The part a flow returns."""
        return TrainResult.model_validate(self.model_dump(include=set(TrainResult.model_fields)))


class TrainResult(BaseModel):
    """What a training run leaves behind, as the train flow and `submit` return it (a `TrainerResult`'s fields)."""

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

    @field_validator("last_loss", mode="before")
    @classmethod
    def _nan_from_json(cls, v: object) -> object:
        """A NaN last loss (no step ran) is written to JSON as null: read back as NaN."""
        return math.nan if v is None else v


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
    history_dir: str = "evals"
    """Where the commit-triggered evaluations write their scores (announced with each commit, so that a worker
    anywhere writes them where the job's submitter reads them)."""
    evaluation_suite: str | None = None
    """Suite named in the commit events (what evaluate-on-checkpoint runs); empty: the job's, else core."""
    executor: str = Field("local", pattern=r"^(local|ray|ray://\S+)$")
    """`local`: processes on this worker (torchrun); `ray` (the Ray cluster this worker joined, or $RAY_ADDRESS) or
    `ray://HOST:PORT`: Ray actors on the nodes of `placement`."""
    placement: list[NodeRanks] | None = None
    """Ray executor: ranks per node (an allocation's nodes and GPU counts)."""
    allocation: AllocationHold | None = None
    """The ledger allocation this run is placed on (`submit` sets it): the trainer renews its lease and stops when it
    is gone. None: no allocation (`frenzy train`, the `train` deployment run by hand)."""
    announce_commits: bool = True
    """Emit `frenzy.checkpoint.committed` per commit (what triggers the evaluate-on-checkpoint deployment); `submit`
    turns it off when it evaluates the checkpoints itself, so that no step is evaluated twice."""

    def resolved(self, base: Path) -> TrainRequest:
        """This request with every path absolute: the job's, the run and history directories, against `base`."""
        from tasks.paths import absolute, resolve_job

        base = base.absolute()
        run_dir = Path(absolute(self.run_dir, base, "run_dir")) if self.run_dir else base / "runs" / self.job.name
        return self.model_copy(update={"run_dir": str(run_dir), "history_dir": absolute(self.history_dir, base, "history_dir"),
                                       "job": resolve_job(self.job, base, run_dir)})
