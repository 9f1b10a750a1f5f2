"""Progress and metrics of one training rank: the records of `progress.jsonl` and the speed figures.

Rank 0 appends one JSON record per event to `<run_dir>/progress.jsonl` (the CLI and the Prefect task tail it;
progress.py turns each into a line). Tokens/s count the loop from its first step to the last optimizer update:
the final checkpoint and the wait for its persist come after training and are reported apart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.jobspec import JobSpec
from tasks.training.step import lr_at

log = logging.getLogger("frenzy.train")


@dataclass
class Progress:
    path: Path
    rank: int
    records: list[dict] = field(default_factory=list)

    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, event: str, **kw: object) -> None:
        """Append one record (the persist thread emits commits, so writes are serialised); rank 0 only."""
        if self.rank != 0:
            return
        rec = {"event": event, "time": time.time(), **kw}
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records.append(rec)


class Meter:
    """Steps, time and tokens of this invocation; emits the `step` records every `log_every_steps`."""

    def __init__(self, job: JobSpec, prog: Progress, clock: Any = time.perf_counter) -> None:
        self.job, self.prog, self.clock = job, prog, clock
        t = job.training
        self.tokens_per_step = t.global_batch * t.seq_len
        self.t_start = clock()
        self.t_last_update = self.t_start
        """The end of the newest optimizer step: tokens/s is over training, up to the last update."""
        self.steps_run = 0

    def updated(self) -> float:
        """An optimizer update finished (intermediate snapshots count: they happen between updates)."""
        self.steps_run += 1
        self.t_last_update = self.clock()
        return self.t_last_update

    def step_s(self) -> float:
        """Mean seconds per step so far."""
        return (self.clock() - self.t_start) / max(self.steps_run, 1)

    def log_step(self, step: int, loss: float, grad_norm: float) -> None:
        """The `step` record and log line, on rank 0 every `log_every_steps` and at the last step."""
        t = self.job.training
        if self.prog.rank != 0 or not (step % t.log_every_steps == 0 or step == t.steps):
            return
        el = self.clock() - self.t_start
        tps = self.steps_run * self.tokens_per_step / el
        eta = (t.steps - step) * el / self.steps_run
        self.prog.emit("step", step=step, steps=t.steps, loss=loss, grad_norm=grad_norm, tokens_per_s=tps,
                       eta_s=eta, lr=lr_at(step, self.job))
        log.info("step %d/%d loss %.4f gnorm %.3f %.0f tok/s ETA %.0fs", step, t.steps, loss, grad_norm, tps, eta)

    def figures(self, data_s: float, blocked_s: float) -> SpeedFigures:
        """The speed part of the result record."""
        loop_s = self.t_last_update - self.t_start
        ran = self.steps_run
        return SpeedFigures(steps_run=ran, elapsed_s=self.clock() - self.t_start,
                            tokens_per_s=ran * self.tokens_per_step / loop_s if ran else 0.0, blocked_s_total=blocked_s,
                            data_s_total=data_s, data_fraction=data_s / loop_s if ran and loop_s > 0 else 0.0)


@dataclass(frozen=True)
class SpeedFigures:
    """How fast one trainer invocation ran: the speed part of its `TrainerResult`, whose fields of these names
    (tasks/training/request.py) say what each means."""

    steps_run: int
    elapsed_s: float
    tokens_per_s: float
    blocked_s_total: float
    data_s_total: float
    data_fraction: float
