"""The on-disk format of a checkpoint: a `step_NNNNNNNN/` directory holding one `rankNNNNN.bin` (the rank's flat
tensor bytes) and one `rankNNNNN.json` (its `ShardRecord`) per rank, committed by rank 0 writing `manifest.json`
(the `Manifest`) create-only. A step without a manifest was never committed and is never loaded."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, Field

from tasks.errors import FrenzyError
from tasks.jobspec import NAME_PATTERN

STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(FrenzyError, RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, or from another job/layout); names the fix."""


class RetiredCheckpoint(CheckpointError):
    """A step that retention removed by design (`training.checkpoint.keep`): not a failure of the run."""


class CheckpointMismatch(CheckpointError):
    """A valid checkpoint of another job (corpus, model shape, batch or layout differ): never loaded."""


class TensorEntry(BaseModel):
    name: str
    dtype: str
    shape: list[Annotated[int, Field(ge=0)]]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)
    global_shape: list[int] | None = None
    """For a shard of a distributed tensor: the full shape (the shard is `shape` at `global_offset`)."""
    global_offset: list[int] | None = None


class ShardRecord(BaseModel):
    """One rank's file of a checkpoint."""

    rank: int = Field(ge=0)
    key: str
    bytes: int = Field(ge=0, le=1 << 44)
    """At most 16 TiB: a record claiming more was altered (reading it would allocate that much first)."""
    sha256: str
    tensors: list[TensorEntry]
    extra: dict = Field(default_factory=dict)


class Manifest(BaseModel):
    """The commit record of one checkpoint step; written last, create-only."""

    version: int = 1
    step: int
    run: str = Field(pattern=NAME_PATTERN)
    """The job name: evaluation writes under evals/<run>/, so it must be a name, not a path."""
    created: str
    world_size: int
    layout: dict
    cursor: dict
    """Data cursor: samples consumed and the skipped (spike) ranges."""
    loss: dict
    """Loss statistics at the snapshot: last loss, rolling mean/std, grad norm."""
    healthy: bool
    """No loss spike was flagged in the steps before this snapshot."""
    trainer: dict
    """Scheduler, scaler, spike-detector and other small state."""
    fingerprint: dict
    """What must match to resume: corpus sha256, model shape, batch."""
    shards: list[ShardRecord]

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


class CheckpointRecord(BaseModel):
    """What the trainer reports per committed checkpoint."""

    step: int
    uri: str
    blocked_s: float
    """Seconds the training loop lost to this save: `wait_s` plus `drag_s`."""
    wait_s: float = 0.0
    """Seconds the loop waited inside the checkpointer: the snapshot's launch (a copy that is not staged, a
    snapshot buffer still being made) and the barrier before the next optimizer step."""
    drag_s: float = 0.0
    """The rest of what the steps after the save lost (their time beyond the running median of clean steps, less
    `wait_s`): on a GPU, the staged device-to-host copy competing with the next forward and backward. Measured by
    the loop (`CheckpointSchedule`); 0 where no step follows (the final save)."""
    persist_s: float
    """Seconds the background persist took (write, hash, fsync, commit)."""
    bytes: int
    deferred_steps: int = 0
    """Steps this checkpoint came after it was due, because every snapshot buffer was still persisting."""


def step_dir(step: int) -> str:
    return f"step_{step:08d}"
