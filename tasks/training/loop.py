"""The training loop: one process per device (torchrun), DDP or FSDP2 data parallel, async checkpoints.

`train(options)` runs on every rank. It resumes from the newest checkpoint that verifies, trains to
`training.steps`, snapshots every `checkpoint.every_steps` (blocking only for the copy), rolls back over loss
spikes, writes op traces for sampled steps, and streams progress records to `<run_dir>/progress.jsonl`,
which the CLI and the Prefect task tail. Rank 0 writes `<run_dir>/result.json`.

The work is done by a `Trainer` (trainer.py) and its parts; this module is the entry point launch.py and the Ray
executor call, and keeps the names other modules import from it.
"""

from __future__ import annotations

import contextlib

from tasks.training.allocation import AllocationKeeper, AllocationLost
from tasks.training.request import TrainerResult
from tasks.training.setup import TrainOptions, init_dist
from tasks.training.step import clip_grad_norm, dp_hook, lr_at
from tasks.training.storage import Storage
from tasks.training.trainer import Trainer
from tasks.training.writer import trainer_lease

__all__ = ["TrainOptions", "Trainer", "clip_grad_norm", "dp_hook", "lr_at", "train"]


def train(opts: TrainOptions) -> TrainerResult:
    """Run (or resume) the job on this rank; returns the result record (complete on rank 0). Rank 0 holds the
    checkpoint root's writer lease (tasks/training/writer.py) from before it reads the root until it exits."""
    d, dev = init_dist(opts)
    storage = Storage(opts.job.training.checkpoint.uri)
    # [elastic hook] a --resume waits for an orphan of a killed launcher that is committing (writer.trainer_lease)
    lease = trainer_lease(storage, opts.job.name, opts.resume, opts.run_dir / "progress.jsonl") \
        if d.rank == 0 else None
    # rank 0 also renews the ledger allocation it runs on: the GPUs stay allocated while it uses them (allocation.py)
    keeper = AllocationKeeper.from_env() if d.rank == 0 else None
    with lease or contextlib.nullcontext(), keeper or contextlib.nullcontext():
        result = Trainer(opts, d, dev, storage, lease, stop_when=keeper.lost.is_set if keeper else None,
                         fence=keeper.fence if keeper else None).run()
    if keeper is not None and keeper.lost.is_set() and result.stopped_early:  # (not when the last step was done)
        raise AllocationLost(keeper.message(result.final_step))
    return result
