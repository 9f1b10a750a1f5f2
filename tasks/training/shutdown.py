"""When a training rank stops before its last step: a signal, the stop file, a drill's step budget, a lost lease.

Every rank takes the same decision at the same step boundary (one all-reduce), so the ranks stop together and the
trainer commits that step before it exits. A lost writer lease is the exception: another trainer owns the
checkpoint root, so this one raises and commits nothing more. Fault injection for drills lives here too.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tasks.errors import environment_problem, unfixable_oserror
from tasks.outdir import mount_of
from tasks.training.checkpoint.manifest import CheckpointError
from tasks.training.setup import Dist, TrainOptions, agree
from tasks.training.writer import WriterLease, WriterLeaseError

log = logging.getLogger("frenzy.train")


def fault_inject(step: int, run_dir: Path) -> None:
    """Drills and tests, each fired once per run directory: FRENZY_FAULT_RAISE="STEP:MESSAGE" prints MESSAGE as
    an error line and leaves the loop at STEP, exit status 1 (e.g. a CUDA error or an OOM as the real stack prints it);
    FRENZY_FAULT_HANG="STEP" stops making progress at STEP (a hang)."""
    for var in ("FRENZY_FAULT_RAISE", "FRENZY_FAULT_HANG"):
        spec = os.environ.get(var)
        if not spec:
            continue
        at, _, msg = spec.partition(":")
        marker = run_dir / f".fault-{var.lower()}"
        if step != int(at) or marker.exists():
            continue
        marker.write_text(str(step))
        if var == "FRENZY_FAULT_HANG":
            log.warning("fault injection: hanging at step %d", step)
            while True:
                time.sleep(3600)
        print(msg, file=sys.stderr, flush=True)
        raise SystemExit(1)  # out of the loop as a real error leaves it (the trainer salvages its snapshot)


Fault = tuple[int | None, OSError]
"""A write of the checkpoint root that no retry can fix: the step whose checkpoint it cost (None: the writer lease's
renewal), and the OSError (a full disk, a quota, a read-only mount)."""


def storage_fault_message(root: str, fault: Fault, step: int, newest: int | None, resume_flag: bool) -> str:
    """What a trainer stopped by `fault` says: what the machine refused and where (the root's file system for a
    local root), the step it stopped at, the newest committed step, and how to go on from it."""
    ck_step, err = fault
    where = Path(root.removeprefix("file://")) if root.startswith("file://") else None
    disk = f" (the file system mounted at {mount_of(where)})" if where is not None else ""
    what = (f"the checkpoint of step {ck_step} could not be written" if ck_step is not None
            else "the writer lease could not be renewed")
    said = environment_problem(err) or str(err)
    kept = (f"step {newest} is the newest committed step; once that is fixed, rerun the same command"
            f"{' with --resume' if not resume_flag else ''}: it resumes from step {newest}" if newest is not None
            else "no step of this run was committed; once that is fixed, rerun the same command")
    return (f"the checkpoint root {root}{disk} cannot be written: {what}: {said}. Training stopped at step {step}, as "
            f"every later checkpoint would fail the same way; {kept}")


class Shutdown:
    """Watches for the reasons to stop; `install()` takes over SIGTERM (from then on it finishes the step)."""

    def __init__(self, opts: TrainOptions, d: Dist, lease: WriterLease | None, root: str,
                 persist_fault: Callable[[], Fault | None] = lambda: None,
                 newest: Callable[[], int | None] = lambda: None, stop_when: Callable[[], bool] | None = None,
                 fence: Callable[[int, int | None], None] | None = None) -> None:
        """`persist_fault`: the checkpointer's first persist that failed on an error no retry can fix;
        `newest`: the newest step committed (what a rerun resumes from); `stop_when`: one more reason to stop;
        `fence(step, newest)`: raises when this rank may no longer use its GPUs (its allocation lapsed)."""
        self.opts, self.d, self.lease, self.root = opts, d, lease, root
        self.persist_fault, self.newest, self.stop_when, self.fence = persist_fault, newest, stop_when, fence
        self.preempt = threading.Event()
        self.stop_file = opts.run_dir / "stop"
        self.stopped = False

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a preemption, a cancelled flow, torchrun shutting down): finish the step, checkpoint, exit
            signal.signal(signal.SIGTERM, lambda *_: self.preempt.set())

    def requested(self, steps_run: int) -> bool:
        """This rank's own view: a signal, the stop file (request_stop(): how an executor without signals, Ray
        actors, stops the ranks), or the drill's step budget."""
        budget = self.opts.stop_after_steps
        return (self.preempt.is_set() or (budget is not None and steps_run >= budget) or self.stop_file.exists()
                or (self.stop_when is not None and self.stop_when()))

    def should_stop(self, step: int, steps_run: int) -> bool:
        """At a step boundary, before step `step + 1`: True on every rank when any rank must stop."""
        fault_inject(step, self.opts.run_dir)
        self.fenced(step)
        fault = self.fault()
        if self.lease is not None and self.lease.lost.is_set() and fault is None:  # commit nothing more
            raise WriterLeaseError(f"lost the writer lease of {self.root} at step {step}: {self.lease.loss_cause()}; "
                                   "this one stops without committing (see `frenzy checkpoints`)")
        self.stopped = not agree(self.d, not (self.requested(steps_run) or fault is not None))
        if self.stopped and not agree(self.d, fault is None):  # a full disk: every rank stops, none commits
            msg = (storage_fault_message(self.root, fault, step, self.newest(), self.opts.resume) if fault is not None
                   else f"another rank could not write its checkpoint of {self.root} (its log says why)")
            raise CheckpointError(msg)
        return self.stopped

    def fenced(self, step: int) -> None:
        """Before a step or a commit: raise (commit nothing more) once the allocation's lease lapsed here."""
        if self.fence is not None:
            self.fence(step, self.newest())

    def fault(self) -> Fault | None:
        """A write of the root no retry can fix: a persist's, else the writer lease renewal's."""
        fault = self.persist_fault()
        if fault is None and self.lease is not None:
            err = unfixable_oserror(getattr(self.lease, "renew_error", None))
            fault = (None, err) if err is not None else None
        return fault
