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
from pathlib import Path

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


class Shutdown:
    """Watches for the reasons to stop; `install()` takes over SIGTERM (from then on it finishes the step)."""

    def __init__(self, opts: TrainOptions, d: Dist, lease: WriterLease | None, root: str) -> None:
        self.opts, self.d, self.lease, self.root = opts, d, lease, root
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
        return self.preempt.is_set() or (budget is not None and steps_run >= budget) or self.stop_file.exists()

    def should_stop(self, step: int, steps_run: int) -> bool:
        """At a step boundary, before step `step + 1`: True on every rank when any rank must stop."""
        fault_inject(step, self.opts.run_dir)
        if self.lease is not None and self.lease.lost.is_set():  # someone took the root over: commit nothing more
            raise WriterLeaseError(f"lost the writer lease of {self.root} at step {step}: another trainer took "
                                   "it over; this one stops without committing (see `frenzy checkpoints`)")
        self.stopped = not agree(self.d, not self.requested(steps_run))
        return self.stopped
