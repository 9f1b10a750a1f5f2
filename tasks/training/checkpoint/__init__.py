"""Asynchronous, checksummed checkpoints (Acme section 6.1), one idea per module:

- `manifest`: the on-disk format (`Manifest`, `ShardRecord`, `TensorEntry`, `step_dir`) and the errors;
- `snapshot`: the copy of the training state into preallocated CPU buffers (`SnapshotBuffer`, `snapshot_buffers`);
- `persist`: `AsyncCheckpointer`, the background thread that streams a snapshot to storage and commits the step;
- `read`: readers of committed steps (`committed`, `survey`, `read_manifest`, `read_shard`, `read_full`, `verify`);
- `retention`: which steps a run keeps (`apply_retention`) and the removal of an abandoned timeline (`discard_after`).

Import from here (`from tasks.training import checkpoint as ck`): the modules are how the code is kept, this is
what the rest of Frenzy uses."""

import importlib
from typing import TYPE_CHECKING

from tasks.training.checkpoint.manifest import (
    CheckpointError,
    CheckpointMismatch,
    CheckpointRecord,
    Manifest,
    RetiredCheckpoint,
    ShardRecord,
    TensorEntry,
    step_dir,
)
from tasks.training.checkpoint.read import committed, list_steps, read_full, read_manifest, read_shard, survey, verify
from tasks.training.checkpoint.retention import abandoned, apply_retention, discard_after, retired

if TYPE_CHECKING:
    from tasks.training.checkpoint.persist import AsyncCheckpointer
    from tasks.training.checkpoint.snapshot import SnapshotBuffer, snapshot_buffers

# The writer side (`persist`, `snapshot`) needs torch; it is imported on first use, so that reading manifests and the
# records that name a checkpoint (the CLI, the pipeline's request and result) do not pay torch's import.
_LAZY = {"AsyncCheckpointer": "persist", "SnapshotBuffer": "snapshot", "snapshot_buffers": "snapshot"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AsyncCheckpointer", "CheckpointError", "CheckpointMismatch", "RetiredCheckpoint", "CheckpointRecord", "Manifest", "ShardRecord",
    "SnapshotBuffer", "TensorEntry", "abandoned", "apply_retention", "committed", "discard_after", "list_steps",
    "read_full", "retired", "read_manifest", "read_shard", "snapshot_buffers", "step_dir", "survey", "verify",
]
