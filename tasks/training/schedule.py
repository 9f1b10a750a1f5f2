"""The checkpoint schedule of one rank: when to checkpoint (the interval), the engine that does it, retention.

It owns the AsyncCheckpointer (snapshot copy, background persist, commit, retention of `checkpoint.keep`) and the
Cadence (`checkpoint.every_steps`, a number or `auto`: Young/Daly from the measured cost, interval.py). A due
checkpoint that finds every snapshot buffer still persisting is deferred to a later step rather than waited for,
and one warning names an interval that would fit. Every rank takes the same decision at the same step.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from tasks.jobspec import JobSpec
from tasks.training import checkpoint as ck
from tasks.training.interval import Cadence, FixedInterval, IntervalInputs, agree_max, interval_fit
from tasks.training.metrics import Meter, Progress
from tasks.training.request import FailedCheckpoint
from tasks.training.setup import Dist, agree
from tasks.training.storage import Storage
from tasks.training.writer import WriterLease

log = logging.getLogger("frenzy.train")

Tensors = tuple[list[tuple[str, torch.Tensor]], dict]
"""What a snapshot copies: (name, tensor) pairs and the shard's global layout."""
DRAG_STEPS = 2
"""Steps after a save whose time beyond the clean pace is charged to it: the staged copy runs beside the next
forward and backward, and that step's optimizer kernels finish inside the one after (the host syncs at its loss)."""


class _Drag:
    """A save whose following steps are still being timed."""

    __slots__ = ("step", "wait", "excess", "left")

    def __init__(self, step: int, wait: float) -> None:
        self.step, self.wait, self.excess, self.left = step, wait, 0.0, DRAG_STEPS


class CheckpointSchedule:
    def __init__(self, storage: Storage, d: Dist, job: JobSpec, prog: Progress, lease: WriterLease | None,
                 tensors: Callable[[], Tensors], fields: Callable[[int], dict], start: int,
                 where: dict | None = None, memo: dict | None = None) -> None:
        t = job.training
        self.d, self.job, self.prog, self.tensors, self.fields = d, job, prog, tensors, fields
        self.engine = ck.AsyncCheckpointer(storage, d.rank, d.world, run=job.name, keep=t.checkpoint.keep,
                                           on_commit=lambda r, m: self._committed(r),
                                           ranks_on_host=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                           fence=lease.holds if lease is not None else None)
        # [elastic hook] when to checkpoint: every N steps or `auto` (Young/Daly, re-tuned at each save; interval.py)
        self.cadence = Cadence(t.checkpoint.every_steps, t.steps, d.world, t.checkpoint.mtbf_s, agree_max,
                               lambda i: (log.info("checkpoint interval: %s", i),
                                          prog.emit("checkpoint_interval", **asdict(i))))
        if self.cadence.seed(memo, where or {}):  # a restart on the same layout: the cost measured before it
            log.info("checkpoint interval: starting from the figures measured before the restart (%s)", memo)
        self.cadence.start(start)
        self.last_saved = start
        self.blocked_s = 0.0
        self.due_at: int | None = None
        """The step a checkpoint came due at, while it waits for a free snapshot buffer."""
        self._failed_reported = 0
        self._warned_interval = False
        self._drags: list[_Drag] = []
        self._held: list[ck.CheckpointRecord] = []
        """Commits whose save's drag was not measured yet: their progress record waits for it."""
        self._dlock = threading.Lock()
        self._t: float | None = None

    def prepare(self) -> None:
        """Make the snapshot buffers now, in the background (the optimizer state exists once a step ran)."""
        self.engine.prepare(*self.tensors())

    def save(self, step: int, block: bool = True, stage: bool = False) -> bool:
        """Snapshot step `step` and queue its persist; False when every buffer is still persisting (try again)."""
        tensors, glob = self.tensors()
        blocked = self.engine.save(step, tensors, self.fields(step), shard_meta=glob, block=block, stage=stage,
                                   deferred_steps=step - (self.due_at if self.due_at is not None else step))
        if blocked is None:
            return False
        self.blocked_s += blocked
        self.last_saved = step
        with self._dlock:
            self._drags.append(_Drag(step, blocked))
        self.cadence.saved(step, blocked, self.engine.last_persist_s)  # [elastic hook]
        failed = self.engine.failed
        while len(failed) > self._failed_reported:  # a persist that failed cost its checkpoint, not the run
            f_step, f_err = failed[self._failed_reported]
            self._failed_reported += 1
            self.prog.emit("checkpoint_failed", step=f_step, error=f_err)
        return True

    def step_done(self, now: float) -> None:
        """An optimizer update ended at `now` (the interval's step time; a persist running beside it counts)."""
        if self._t is not None and self._drags:
            self._time_drags(now - self._t, self.cadence.pace_s())
        self._t = now
        self.cadence.step_done(now, self.engine.persisting.is_set())  # [elastic hook]

    def _time_drags(self, dt: float, pace: float | None) -> None:
        """Charge the step of `dt` seconds to the saves before it: its excess over the clean `pace` (the wait
        inside the checkpointer is part of that excess, so only the rest is added, as drag)."""
        for d in list(self._drags):
            d.excess += dt - pace if pace is not None else 0.0
            d.left -= 1
            if d.left <= 0:
                self._settle(d)

    def _settle(self, d: _Drag) -> None:
        drag = max(d.excess - d.wait, 0.0)
        self.engine.add_drag(d.step, drag)
        self.blocked_s += drag
        with self._dlock:
            self._drags.remove(d)
            ready = [r for r in self._held if r.step == d.step]
            self._held = [r for r in self._held if r.step != d.step]
        for r in ready:
            self.prog.emit("checkpoint", **r.model_dump())

    def _committed(self, rec: ck.CheckpointRecord) -> None:
        """The persist thread committed `rec`: its progress record now, or once its drag is measured."""
        with self._dlock:
            if any(d.step == rec.step for d in self._drags):
                self._held.append(rec)
                return
        self.prog.emit("checkpoint", **rec.model_dump())

    def barrier(self) -> None:
        """Before an optimizer update: a staged snapshot must be copied before the update changes the tensors."""
        waited = self.engine.barrier()
        self.blocked_s += waited
        with self._dlock:
            if self._drags:
                self._drags[-1].wait += waited

    def wait(self) -> None:
        """Every queued persist committed (before a rollback reads the checkpoints)."""
        self.engine.wait()

    def after_update(self, step: int, meter: Meter, prepare: bool) -> None:
        """An update made step `step`: checkpoint it when due and a buffer is free, else defer. `prepare`: the
        first update made the optimizer state, so the snapshot buffers can be made now."""
        last = step == self.job.training.steps
        if prepare:
            self.prepare()
        if self.cadence.due(step) or last:  # [elastic hook]
            self.due_at = step if self.due_at is None else self.due_at
        if self.due_at is None:
            return
        # every rank must take the same decision, or the ranks would snapshot different steps
        if agree(self.d, not self.engine.busy()) or last:
            due, warn = self.due_at, step > self.due_at and not self._warned_interval and self.d.rank == 0
            # staged: the copy runs beside the next forward/backward and is waited for before the next
            # optimizer step (the only thing that changes the saved tensors); the last save copies at once
            self.save(step, block=True, stage=not last)
            self.due_at = None
            # a deferred save warns once, after it is taken: the persist it waited for has finished (the last save,
            # taken while one still runs, waits for it), so its duration is measured (while a first persist runs
            # there is no figure, and the advice would be a guess)
            if warn and self.engine.last_persist_s is not None:  # None: a buffer was made, no persist has ended
                self._warn_interval(due, step - due, meter.step_s())
            return
        if step == self.due_at:
            self.prog.emit("checkpoint_deferred", step=step, reason="the previous persist is still running")

    def _warn_interval(self, due: int, late: int, step_s: float) -> None:
        """Said once, and only when the measured persist outlasts `every_steps` steps (a 0.0 s persist never does)."""
        persist_s = self.engine.last_persist_s or 0.0
        every = self.cadence.every
        if (fit := interval_fit(every, persist_s, step_s)) is None:
            log.info("checkpoint of step %d came %d steps late, though a persist (%.2f s) fits in %d steps of %.3f s",
                     due, late, persist_s, every, step_s)
            return
        self._warned_interval = True
        log.warning("checkpoint of step %d came %d steps late: a persist takes %.2f s, longer than %d steps of "
                    "%.3f s; checkpoint.every_steps >= %d would fit", due, late, persist_s, every, step_s, fit)
        self.prog.emit("warning", message=f"checkpoint.every_steps={every} is shorter than a persist ({persist_s:.2f} "
                                          f"s, {every} steps take {every * step_s:.2f} s); >= {fit} would fit")

    def finish(self, step: int, stopped: bool) -> None:
        """Stopped early: commit the step first; then wait for every persist and end the engine."""
        if stopped and self.last_saved != step:
            log.warning("stopping at step %d: taking a final checkpoint first", step)
            self.save(step, block=True)

    def salvage(self, step: int, timeout_s: float) -> None:
        """The loop failed after step `step`: commit the snapshots already taken (bounded; no new one is taken,
        since the failure may have left the tensors mid-update)."""
        if self.engine.idle():
            return
        log.warning("failing at step %d: committing the checkpoint already in memory first (up to %.0f s)",
                    step, timeout_s)
        lost = self.engine.salvage(timeout_s)
        if lost:
            log.warning("checkpoint of step(s) %s not committed before the failure ended the process",
                        ", ".join(map(str, lost)))

    def close(self) -> None:
        """No step follows: the saves still being timed keep what was measured; then wait for every persist."""
        for d in list(self._drags):
            self._settle(d)
        self.engine.close()

    def describe(self) -> ScheduleReport:
        """The result's record of it: commits, failures, the interval and its inputs."""
        e = self.engine
        return ScheduleReport(checkpoints=list(e.records), snapshot_pin_s=e.pin_s,
                              checkpoint_interval=self.cadence.describe(),  # [elastic hook] the interval and its inputs
                              failed_checkpoints=[FailedCheckpoint(step=s_, error=e_) for s_, e_ in e.failed])


@dataclass(frozen=True)
class ScheduleReport:
    """The checkpoint part of a `TrainerResult` (its fields of these names, tasks/training/request.py)."""

    checkpoints: list[ck.CheckpointRecord]
    snapshot_pin_s: float | None
    checkpoint_interval: IntervalInputs | FixedInterval
    failed_checkpoints: list[FailedCheckpoint]
