"""`frenzy train` (one job on this machine, asynchronous verified checkpoints) and `frenzy checkpoints` (what a
checkpoint directory holds, verified on request)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from cli.argtypes import bounded_int
from cli.output import CommandFailed, emit, table
from tasks.errors import FrenzyError
from tasks.jobspec import load_job

if TYPE_CHECKING:
    from tasks.training.progress import ProgressRecord
    from tasks.training.request import TrainerResult


def _spikes(result: TrainerResult) -> str:
    """The spike guard's counts, ending the summary's first line (skipped data changes what the model learned; red
    team 41p S13: an ordinary run's skipped updates are counted there, not warned about one by one)."""
    text = result.spike_counts.summary()
    return f"; {text}" if text else ""


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tasks.outdir import run_dir_lock
    from tasks.paths import job_dir, resolve_job
    from tasks.training.launch import TrainFailed, check_launch, default_run_dir, launch
    from tasks.training.progress import describe

    if args.discard_checkpoints and not args.from_scratch:
        raise FrenzyError("--discard-checkpoints goes with --from-scratch (it deletes the checkpoints a run from step 0 "
                          "would replace); add --from-scratch, or drop it")
    job = load_job(args.job)
    if args.steps:
        job.training.steps = args.steps
    if args.checkpoint_uri:
        job.training.checkpoint.uri = args.checkpoint_uri

    def show(rec: ProgressRecord) -> None:
        print(describe(rec), file=sys.stderr, flush=True)

    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(job)
    job = resolve_job(job, job_dir(args.job), run_dir.absolute())  # the job's paths: its file's
    if run_dir.exists() and not run_dir.is_dir():
        raise FrenzyError(f"run directory {run_dir} is a file; give a directory (--run-dir)")
    check_launch(job, run_dir, args.nproc, args.tp, args.device, None)  # before the run directory is made
    try:
        with run_dir_lock(run_dir):  # one trainer per run directory (tasks/outdir.py)
            result = launch(job, run_dir, nproc=args.nproc, resume=args.resume, from_scratch=args.from_scratch,
                            discard_checkpoints=args.discard_checkpoints, device=args.device, threads=args.threads,
                            tp=args.tp, on_record=show)
    except TrainFailed as err:  # 2: a problem the message says how to fix
        raise CommandFailed(str(err), 2 if err.returncode == 2 else 1) from err

    def human() -> str:
        rows = [{"step": c.step, "uri": c.uri, "MB": f"{c.bytes / 1e6:.1f}", "blocked ms": f"{c.blocked_s * 1e3:.1f}",
                 "persist s": f"{c.persist_s:.2f}"} for c in result.checkpoints]
        start = result.resumed_from_step
        return (f"{job.name}: trained to step {result.final_step}"
                f"{f' (resumed from {start})' if start is not None else ''}, last loss {result.last_loss:.4f}, "
                f"{result.tokens_per_s:,.0f} tok/s" + _spikes(result) + "\n" + table(rows))

    emit(args, result.model_dump(), human)
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    storage = Storage(args.uri)
    rows = []
    if storage.local is not None and storage.local_root() == "missing":  # a loop, a FIFO or a file: named there
        raise FrenzyError(f"{storage.uri}: no such checkpoint directory")
    for s in ck.list_steps(storage):
        try:
            m, bad = ck.read_manifest(storage, s), None
        except ck.CheckpointError as err:
            m, bad = None, str(err)
        row = {"step": s, "committed": m is not None, "healthy": m.healthy if m else None,
               "bytes": m.total_bytes if m else None, "loss": m.loss.get("last") if m else None,
               "verified": None, "problem": bad or (None if m else "no manifest (never committed)")}
        if m is not None and args.verify:
            try:
                ck.verify(storage, m)
                row["verified"] = True
            except ck.CheckpointError as err:
                row["verified"], row["problem"] = False, str(err)
        rows.append(row)
    doc = {"uri": storage.uri, "steps": rows}
    emit(args, doc, lambda: f"{storage.uri}\n" + table(rows))
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("train", cmd_train)
    sp.add_argument("job", help="job YAML file")
    start = sp.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint that verifies (walks back past corrupt ones)")
    start.add_argument("--from-scratch", action="store_true",
                       help="train from step 0; a checkpoint root that already holds checkpoints is refused (they are "
                            "kept) unless --discard-checkpoints is given too")
    sp.add_argument("--discard-checkpoints", action="store_true",
                    help="with --from-scratch: delete the checkpoints already under checkpoint.uri first")
    sp.add_argument("--nproc", type=bounded_int(1, 1024), default=1,
                    help="ranks (torchrun; gloo on CPU, NCCL on GPUs; default 1)")
    sp.add_argument("--tp", type=bounded_int(1, 1024), default=1,
                    help="tensor-parallel degree (DTensor); data parallel = nproc / tp")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="default: CUDA when present")
    sp.add_argument("--threads", type=bounded_int(1, 1024),
                    help="torch threads per rank (default: (cores - 1) / ranks, one core left for "
                         "the checkpoint persist and the loader)")
    sp.add_argument("--run-dir", help="progress, log, op traces and result (default runs/<job name>)")
    sp.add_argument("--steps", type=bounded_int(1, 10**9), help="override training.steps")
    sp.add_argument("--checkpoint-uri", help="override training.checkpoint.uri (file://DIR or s3://BUCKET/PREFIX)")

    sp = add("checkpoints", cmd_checkpoints)
    sp.add_argument("uri", help="checkpoint root (file://DIR, DIR or s3://BUCKET/PREFIX)")
    sp.add_argument("--verify", action="store_true", help="re-read every shard and check its sha256")
