"""`checkpoint.every_steps: auto`: the Young/Daly interval sqrt(2 x C x M), re-measured as the job runs.

C, the cost of one checkpoint, is what the training loop loses to it: the time the loop was blocked (the snapshot
copy) plus the drag, the extra step time while the background persist competes for cores, memory bandwidth and
PCIe. Both are measured together: the seconds of the steps from one save to the next, beyond the same number of
steps at the no-checkpoint pace (the median of recent steps with no persist running and no save just before).
M is the job's mean time between failures.

M comes from `checkpoint.mtbf_s` when it is set: `frenzy submit` fills it in from the ledger's failure history for
the GPU pool the job is placed on (`mtbf_from_ledger`), and again after a recovery moves the job. Without history
the prior is Llama 3's pretraining record (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions in 54
days on 16,384 GPUs, i.e. one failure per 1.82e8 GPU-seconds (5.8 GPU-years), divided by the job's GPU count; a
ledger's own failures and GPU-seconds are added to that prior (one pseudo-failure's worth), so a few observed
failures dominate it quickly. The interval is capped at `MAX_INTERVAL_S` (30 min: failures the ledger never sees,
such as a SIGKILL of the whole job, still cost at most that) and at the job's remaining steps.

Every rank measures its own figures; the interval is agreed (the largest) at each save, so every rank checkpoints
at the same step. Each change is logged with its inputs (a `checkpoint_interval` progress record).

The measured figures outlive the process: each checkpoint's manifest carries them (`memo`), and a resume on the same
layout (world size, tensor parallel degree, device, threads) starts from them (`seed`) instead of measuring from
scratch. Without that, every restart began again at the first save's blocked time alone, a gross underestimate that
made back-to-back checkpoints after each failure: with a failure per 40 steps, auto was 6% below every 20 steps in
goodput (benchmarks/checkpoint_interval.py's gpt-mini regime, before this change; docs/benchmarks.md). Until an
interval's cost has been measured, the interval stays at least `FIRST_SAVE_STEPS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

PRIOR_GPU_MTBF_S = 16384 * 54 * 86400 / 419
"""GPU-seconds per failure in Llama 3's 54-day pretraining (419 unexpected interruptions on 16,384 H100s)."""
MAX_INTERVAL_S = 1800.0
FIRST_SAVE_STEPS = 10
"""The first checkpoint comes after this many steps (or the prior's interval, if shorter): it measures the cost."""


def young_daly_s(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum interval between checkpoints (Daly's refinement agrees while cost << MTBF)."""
    return math.sqrt(2.0 * max(cost_s, 0.0) * max(mtbf_s, 0.0))


def prior_mtbf_s(gpus: int) -> float:
    return PRIOR_GPU_MTBF_S / max(gpus, 1)


def pooled_mtbf_s(gpus: int, failures: int, gpu_seconds: float) -> float:
    """The job's MTBF from a pool's observed failures and GPU-seconds of exposure, with the prior as one
    pseudo-failure over `PRIOR_GPU_MTBF_S` GPU-seconds."""
    return (PRIOR_GPU_MTBF_S + max(gpu_seconds, 0.0)) / (1 + max(failures, 0)) / max(gpus, 1)


@dataclass
class IntervalInputs:
    """What the chosen interval came from (logged with it)."""

    every_steps: int
    interval_s: float
    cost_s: float
    blocked_s: float
    drag_s: float
    mtbf_s: float
    mtbf_source: str
    step_s: float
    persist_s: float
    cost_source: str = "measured"
    """`measured`, `blocked time only` (no interval measured yet) or `measured before the restart` (seeded)."""


@dataclass(frozen=True)
class FixedInterval:
    """A fixed `checkpoint.every_steps` (or `auto` before its first measurement)."""

    every_steps: int


class Cadence:
    """When the loop checkpoints: every N steps (fixed), or the Young/Daly interval (auto) re-measured at each save.

    The loop calls `step_done(now, persisting)` after each optimizer step, `due(step)` to ask, and `saved(step,
    blocked_s, persist_s)` after each save (collectively, on every rank)."""

    def __init__(self, every: int | str, steps: int, gpus: int, mtbf_s: float | None = None,
                 agree: Callable[[int], int] = lambda v: v,
                 report: Callable[[IntervalInputs], None] | None = None) -> None:
        self.auto = every == "auto"
        self.steps, self.agree, self.report = steps, agree, report
        self.mtbf_s = mtbf_s if mtbf_s else prior_mtbf_s(gpus)
        self.mtbf_source = "checkpoint.mtbf_s" if mtbf_s else f"prior (Llama 3 failure rate, {gpus} GPU(s))"
        self.every = FIRST_SAVE_STEPS if self.auto else int(every)
        self.last_saved = 0
        self.inputs: IntervalInputs | None = None
        self._t: float | None = None
        self._steps_seen = 0
        self._base: list[float] = []  # recent step seconds away from any checkpoint work: the no-checkpoint pace
        self._open: list[float] | None = None  # [seconds, steps] since the newest save
        self._costs: list[float] = []  # per save: its interval's seconds beyond the no-checkpoint pace
        self._blocked: list[float] = []
        self._persist_s = 0.0  # the newest completed persist
        self.seeded = False

    def memo(self, where: dict) -> dict | None:
        """The measured figures, for the next process on the same layout `where` (None: nothing measured yet)."""
        if not self._base or not self._costs:
            return None
        return {"where": where, "step_s": _median(self._base), "cost_s": _median(self._costs),
                "blocked_s": sum(self._blocked) / len(self._blocked), "persist_s": self._persist_s}

    def seed(self, memo: dict | None, where: dict) -> bool:
        """Start from a previous process's figures when it ran on the same layout; True when used."""
        if not self.auto or not memo or memo.get("where") != where:
            return False
        try:
            base, cost = float(memo["step_s"]), float(memo["cost_s"])
            blocked, persist = float(memo["blocked_s"]), float(memo["persist_s"])
        except (KeyError, TypeError, ValueError):
            return False
        if not all(math.isfinite(x) and x >= 0 for x in (base, cost, blocked, persist)) or base <= 0:
            return False
        self._base, self._costs, self._blocked, self._persist_s = [base], [cost], [blocked], persist
        self.seeded = True
        return True

    def start(self, step: int) -> None:
        """The step training starts (or resumes) from. With `auto`, a seeded cadence takes its interval now (the
        same on every rank: agreed, so every rank calls this)."""
        self.last_saved = step
        if self.auto:
            if self.seeded:
                self._retune(step, source="measured before the restart")
            else:
                self.every = self.agree(self.every)

    def step_done(self, now: float, persisting: bool) -> None:
        """After each optimizer step. A step's seconds include the snapshot of a save just before it and the wait
        for a staged copy, so an interval's excess over the no-checkpoint pace is everything its save cost."""
        if self._t is not None:
            dt = now - self._t
            self._steps_seen += 1
            if self._open is not None:
                self._open[0] += dt
                self._open[1] += 1
            # warm-up steps (allocation, first kernels) are no pace; nor is a step beside a persist or just after a save
            quiet = not persisting and (self._open is None or self._open[1] > 2)
            if self._steps_seen > 2 and quiet:
                self._base = (self._base + [dt])[-64:]
        self._t = now

    def pace_s(self) -> float | None:
        """The no-checkpoint step pace so far (median of recent clean steps); None before one was measured."""
        return _median(self._base) if self._base else None

    def due(self, step: int) -> bool:
        if not self.auto:
            return step % self.every == 0
        return step - self.last_saved >= self.every

    def saved(self, step: int, blocked_s: float, persist_s: float | None) -> None:
        self.last_saved = step
        if self._open is not None and self._open[1] and self._base:
            self._costs = (self._costs + [max(self._open[0] - self._open[1] * _median(self._base), 0.0)])[-16:]
        self._open = [0.0, 0]
        self._blocked = (self._blocked + [blocked_s])[-16:]
        if persist_s is not None:
            self._persist_s = persist_s
        if self.auto and step < self.steps:  # the final save needs no next interval
            self._retune(step)

    def _retune(self, step: int, source: str = "") -> None:
        if not self._base:
            self.every = self.agree(self.every)
            return
        step_s = _median(self._base)
        blocked = sum(self._blocked) / len(self._blocked)
        # until one interval after a save has been measured, the blocked time is all that is known of the cost
        cost = max(_median(self._costs), blocked) if self._costs else blocked
        persist = self._persist_s
        interval = min(young_daly_s(cost, self.mtbf_s), MAX_INTERVAL_S)
        # never shorter than a persist (a save would find its buffer still persisting and be deferred)
        every = max(round(interval / step_s), math.ceil(persist / step_s) + 1, 1)
        if not self._costs:  # only the blocked time is known: no shorter than the first interval until measured
            every = max(every, FIRST_SAVE_STEPS)
        every = self.agree(min(every, max(self.steps - step, 1)))
        changed = every != self.every or self.inputs is None
        self.every = every
        self.inputs = IntervalInputs(every, interval, cost, blocked, cost - blocked, self.mtbf_s, self.mtbf_source,
                                     step_s, persist, source or ("measured" if self._costs else "blocked time only"))
        if changed and self.report is not None:
            self.report(self.inputs)

    def describe(self) -> IntervalInputs | FixedInterval:
        """The interval in force, with its inputs once `auto` has measured them."""
        return self.inputs or FixedInterval(self.every)


def interval_fit(every: int, persist_s: float, step_s: float) -> int | None:
    """The smallest `checkpoint.every_steps` whose steps (`step_s` each) outlast a persist of `persist_s`; None when
    `every` steps already do (a save that came late then waited on something else, not on the persist's length)."""
    if step_s <= 0 or persist_s <= every * step_s:
        return None
    return max(every + 1, math.ceil(persist_s / step_s))


def agree_max(value: int) -> int:
    """The largest `value` over the ranks (every rank must checkpoint at the same steps)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2
