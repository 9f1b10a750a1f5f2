"""The wait queue's discipline, written once: the live ledger (`cluster/ledger.py`) and the trace-driven simulator
(`cluster/simulator.py`) both order their waiting jobs with `ordered()` and walk them with `walk()`, so a policy
measured in simulation is the policy the cluster runs.

Orders
- `shortest` (the default): by predicted run time (MARP's step time x steps), shortest first, with aging: a job's
  key is `predicted_s - aging x waited_s`, so every second in the queue moves it forward and no job waits forever
  behind a stream of shorter ones. Jobs without a prediction go last, in arrival order. Backfilling: a job that
  does not fit now is skipped and later ones may start.
- `backfill`: arrival order, with backfilling.
- `strict`: arrival order; the first job that does not fit blocks the rest (head-of-line).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

QueueOrder = Literal["shortest", "backfill", "strict"]
DEFAULT_ORDER: QueueOrder = "shortest"
DEFAULT_AGING = 0.5
"""Seconds of predicted run time forgiven per second waited (`shortest` order). 0 is pure shortest-first (lowest
average JCT, unbounded wait for long jobs); larger values tend to arrival order. 0.5 keeps most of the average-JCT
gain while bounding the tail (benchmarks/results/scheduling.md)."""


@dataclass(frozen=True)
class Waiting:
    """One waiting job as the queue discipline sees it."""

    job: Hashable
    seq: int
    """Arrival order (a resubmitted job gets a new one)."""
    submitted_s: float
    predicted_s: float | None
    """Predicted run time; None sorts last under `shortest`."""


def sort_key(w: Waiting, order: QueueOrder, now_s: float, aging: float = DEFAULT_AGING) -> tuple:
    if order != "shortest":
        return (w.seq,)
    if w.predicted_s is None:
        return (True, 0.0, w.seq)
    return (False, w.predicted_s - aging * max(0.0, now_s - w.submitted_s), w.seq)


def ordered(waiting: Sequence[Waiting], order: QueueOrder, now_s: float, aging: float = DEFAULT_AGING
            ) -> list[Waiting]:
    """The waiting jobs in the order the scheduler tries them."""
    return sorted(waiting, key=lambda w: sort_key(w, order, now_s, aging))


def walk(waiting: Sequence[Waiting], order: QueueOrder, now_s: float, try_place: Callable[[Waiting], bool],
         aging: float = DEFAULT_AGING) -> tuple[list[Waiting], list[Waiting]]:
    """Try each job in order; `try_place` places it now or returns False. Returns (placed, still waiting)."""
    placed, left = [], []
    blocked = False
    for w in ordered(waiting, order, now_s, aging):
        if not blocked and try_place(w):
            placed.append(w)
            continue
        left.append(w)
        blocked = order == "strict"
    return placed, left
