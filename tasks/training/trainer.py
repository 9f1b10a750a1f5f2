"""The Trainer of one rank: its parts wired together, and the loop that drives them.

The parts, one concern each: set-up (setup.py: process group, tokenizer and data, model and optimizer), restoring
(restore.py: resume and rollback), the step (step.py), the checkpoint schedule (schedule.py: engine, retention,
interval), the spike guard (guard.py), progress and metrics (metrics.py), and shutdown (shutdown.py: signals, the
stop file, the writer lease). This module only orders them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from tasks.training import data as D
from tasks.training.allocation import AllocationLost
from tasks.training.guard import Decision, SpikeGuard
from tasks.training.metrics import Meter, Progress
from tasks.training.optrace import OpTracer, merge_traces
from tasks.training.request import TrainerResult
from tasks.training.restore import Restorer
from tasks.training.schedule import CheckpointSchedule, Tensors
from tasks.training.setup import Dist, TrainOptions, build_model, fingerprint, load_data
from tasks.training.shutdown import Shutdown
from tasks.training.state import training_tensors
from tasks.training.step import StepRunner, dp_hook, lr_at
from tasks.training.storage import Storage
from tasks.training.writer import WriterLease, WriterLeaseError

# how long a failing rank waits for the snapshots already in memory to commit before the process ends
SALVAGE_S = 120.0


class Trainer:
    def __init__(self, opts: TrainOptions, d: Dist, dev: torch.device, storage: Storage,
                 lease: WriterLease | None, stop_when: Callable[[], bool] | None = None,
                 fence: Callable[[int, int | None], None] | None = None) -> None:
        """`stop_when`: a further reason to stop with a commit (the ledger allocation is gone); `fence(step,
        newest)`: raises before a step or a commit once the allocation lapsed (no commit: the GPUs may be another's)."""
        self.opts, self.d, self.dev, self.storage, self.lease = opts, d, dev, storage, lease
        self.stop_when, self.fence = stop_when, fence
        self.job, t = opts.job, opts.job.training
        opts.run_dir.mkdir(parents=True, exist_ok=True)
        self.prog = Progress(opts.run_dir / "progress.jsonl", d.rank)
        self.data = load_data(self.job, d, storage)
        self.m = build_model(self.job, d, dev)
        self.guard = SpikeGuard(t.spike, t.global_batch, scaler_enabled=self.m.scaler.is_enabled(),
                                vocab=self.job.model.vocab)
        self.cursor = D.Cursor()
        self.fp = fingerprint(self.job, self.data.corpus_sha, d.world, d.tp, self.data.tok.sha256)
        self.restorer = Restorer(storage, d, self.m, self.cursor, self.guard.detector, self.fp, t.seq_len, self.prog)
        self.step = 0
        self.resumed_from: int | None = None
        self.last_loss, self.last_gnorm = math.nan, math.nan

    def run(self) -> TrainerResult:
        """Resume (or start), train to `training.steps` or a stop, commit, and return the result record."""
        self.resumed_from = self.restorer.resume(self.opts)
        self.step = self.resumed_from or 0
        self._start()
        try:
            while self.step < self.job.training.steps:
                if self.shutdown.should_stop(self.step, self.meter.steps_run):
                    break
                self._train_step()
        except (WriterLeaseError, AllocationLost):
            raise  # another trainer owns the root, or another job the GPUs: commit nothing more
        except BaseException:
            # an error (an OOM, a CUDA error, a bad batch) ends the process, but the snapshot already in CPU
            # memory is still good: persist it, so the restart resumes from it and not from the commit before
            self.schedule.salvage(self.step, SALVAGE_S)
            raise
        return self._finish()

    def _start(self) -> None:
        """The loop's parts that begin after the resume point is known."""
        d, t = self.d, self.job.training
        self.where = self._where()
        self.schedule = CheckpointSchedule(self.storage, d, self.job, self.prog, self.lease, self._tensors,
                                           self._fields, self.step, self.where, self.restorer.cadence_memo)
        if self.m.optimizer.state:  # resumed: the state exists, so the snapshot buffers can be made now
            self.schedule.prepare()
        # the straggler format traces one tensor-parallel rank per data-parallel rank
        self.tracer = OpTracer(d.rank, d.dp_rank, t.trace_every_steps if d.rank % d.tp == 0 else 0)
        dp_hook(self.m.model, self.tracer)
        self.runner = StepRunner(self.m, self.data, self.job, d, self.dev, self.tracer)
        self.meter = Meter(self.job, self.prog)
        self.m.model.train()
        engine = self.schedule.engine
        self.shutdown = Shutdown(self.opts, d, self.lease, self.storage.uri, persist_fault=lambda: engine.unfixable,
                                 newest=lambda: max((r.step for r in engine.records), default=self.resumed_from),
                                 stop_when=self.stop_when, fence=self.fence)
        self.shutdown.install()

    def _train_step(self) -> None:
        """Step `self.step + 1`: compute, let the guard judge it, then update and checkpoint, or handle a spike."""
        d, nxt, local = self.d, self.step + 1, self.data.local
        traced = self.tracer.begin_step(nxt)
        indices = self.data.loader.next_indices(self.cursor)
        mine = indices[d.dp_rank * local:(d.dp_rank + 1) * local]
        D.record_samples(self.opts.run_dir, d.rank, nxt, mine)  # [elastic hook] FRENZY_SAMPLE_LOG=1 audit
        self.last_loss, self.last_gnorm = self.runner.compute(nxt, mine, traced)
        decision = self.guard.judge(nxt, self.last_loss, self.last_gnorm)
        if decision.record is not None:
            self.prog.emit("spike", **decision.record.model_dump())
        if decision.diverging is not None:
            self.prog.emit("diverging", step=nxt, loss=self.last_loss, message=decision.diverging)
        if decision.action != "apply":
            self.runner.discard(nxt)
            if decision.action == "skip":
                self._spike(decision, indices[0])
            return
        self.shutdown.fenced(self.step)  # a process stopped mid-step past its lease: no update, no commit
        self.schedule.barrier()
        self.runner.apply(traced)
        self.step = nxt
        self.schedule.step_done(self.meter.updated())
        self.guard.passed(nxt)
        self.meter.log_step(nxt, self.last_loss, self.last_gnorm)
        self.schedule.after_update(nxt, self.meter, prepare=self.meter.steps_run == 1 and bool(self.m.optimizer.state))

    def _spike(self, decision: Decision, first_sample: int) -> None:
        """Roll back to the newest healthy checkpoint before the spike when there is one; skip its samples."""
        self.schedule.wait()
        spike_step, skips = self.step + 1, list(self.cursor.skips)
        target = (self.restorer.newest_valid(before=spike_step, healthy_only=True)
                  if self.guard.may_roll_back(decision.verdict) else None)
        window = self.guard.window(first_sample, rolled_back=target is not None)
        # a rollback restored the checkpoint's cursor: the skips made since stay skipped
        self.cursor.skips = sorted(set(self.cursor.skips) | set(skips) | {window})
        if target is not None:
            self.step = target.step
            self.restorer.discard_after(self.step)
        rec = self.guard.skipped(spike_step, self.last_loss, self.last_gnorm, decision.verdict, window,
                                 target.step if target is not None else None)
        self.prog.emit("spike", **rec.model_dump())
        self.guard.bound_rollbacks(rec)

    def _tensors(self) -> Tensors:
        return training_tensors(self.m.core, self.m.optimizer, with_model=self.m.owns_model)

    def _where(self) -> dict:
        """What a measured checkpoint cost depends on: a resume elsewhere measures it again (interval.py)."""
        dev = self.dev
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
        return {"world": self.d.world, "tp": self.d.tp, "device": name, "threads": torch.get_num_threads()}

    def _fields(self, step: int) -> dict:
        """The manifest's fields of a checkpoint of step `step`."""
        t, det, scaler = self.job.training, self.guard.detector, self.m.scaler
        healthy = det.last_spike_step is None or step - det.last_spike_step > t.spike.window
        return {"layout": {"dp": self.d.dp, "tp": self.d.tp, "zero_stage": t.zero_stage},
                "cursor": self.cursor.to_dict(),
                "loss": {"last": self.last_loss, "grad_norm": self.last_gnorm, **det.stats().to_dict()},
                "healthy": healthy, "fingerprint": self.fp,
                "trainer": {"spike": det.state(), "scaler": scaler.state_dict() if scaler.is_enabled() else None,
                            "lr": lr_at(step, self.job), "keep": t.checkpoint.keep,  # named when a step is retired
                            # evaluation rebuilds the held-out split from it (not part of the fingerprint)
                            "data": t.data.model_dump(mode="json"),
                            # the tokenizer.json beside the checkpoints (None: byte-level)
                            "tokenizer": self.data.tok_key, "eos_id": self.data.tok.eos_id,
                            # the measured checkpoint cost and step pace, for `every_steps: auto` after a restart
                            "cadence": self.schedule.cadence.memo(self.where)}}

    def _finish(self) -> TrainerResult:
        """Commit a stopped run's step, wait for every persist, merge the op traces, write the result."""
        d, stopped = self.d, self.shutdown.stopped
        self.shutdown.fenced(self.step)
        self.schedule.finish(self.step, stopped)
        self.schedule.close()
        figures = self.meter.figures(self.runner.data_s, self.schedule.blocked_s)
        trace_path = self._traces()
        result = TrainerResult(
            job=self.job.name, final_step=self.step, resumed_from_step=self.resumed_from, stopped_early=stopped,
            **vars(self.schedule.describe()), spikes=self.guard.records, spike_counts=self.guard.counts.model_copy(),
            last_loss=self.last_loss, **asdict(figures), world_size=d.world, tp=d.tp, device=str(self.dev),
            checkpoint_uri=self.storage.uri, trace=str(trace_path) if trace_path else None,
            run_dir=str(self.opts.run_dir))
        if d.rank == 0:
            self.prog.emit("done", final_step=self.step, stopped_early=stopped)
            # json.dumps, not model_dump_json: a NaN last loss stays NaN in the file, as launch() reads it back
            (self.opts.run_dir / "result.json").write_text(json.dumps(result.model_dump(), indent=1))
        if d.on:
            dist.barrier()
        return result

    def _traces(self) -> Path | None:
        """Every rank writes its op trace; rank 0 merges them into the straggler format."""
        d = self.d
        self.tracer.write(self.opts.run_dir / "trace")
        if d.on:
            dist.barrier()
        if d.rank == 0:
            return merge_traces(self.opts.run_dir / "trace", self.job.name, d.dp, d.tp, d.world)
        return None
