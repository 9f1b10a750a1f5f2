"""The wait queue's discipline, written once: the live ledger (`cluster/ledger.py`) and the trace-driven simulator
(`cluster/simulator.py`) both order their waiting jobs with `ordered()` and walk them with `walk()`, so a policy
measured in simulation is the policy the cluster runs.

Orders
- `shortest` (the default): short predicted run times first (MARP's step time x steps), with aging by response
  ratio: a job's priority is `waited_s / predicted_s ** beta`, highest first, ties (a fresh queue) shortest first.
  Between two jobs that have waited alike the shorter goes first; a long job moves up as it waits, at a rate that
  falls with its length, so no job waits forever behind a stream of shorter ones (a new arrival starts at 0). The
  key is scale-free: stretching every time of a trace by one factor leaves the order unchanged, so it behaves the
  same on a fleet of 5-minute jobs and one of 5-hour jobs. The additive aging it replaced (`predicted_s - 0.2 x
  waited_s`) did not: on hours-long jobs under load the aged mass of long jobs went ahead of every new short one
  (the short jobs of the production-shaped trace queued 3.6x longer than under fcfs). Jobs without a prediction go
  last, in arrival order. Backfilling: a job that does not fit now is skipped and later ones may start.
- `backfill`: arrival order, with backfilling.
- `strict`: arrival order; the first job that does not fit blocks the rest (head-of-line).

Reservation (EASY backfilling). Under `shortest` and `backfill` the first job in order that does not fit (the
head) gets a reservation when the caller passes `reserve`: the earliest predicted time at which it fits, found by
releasing the running allocations in order of their predicted end, and the free GPUs at that time. A later job
then starts only if it does not push the head past that time: its predicted end comes first, or the GPUs free at
the reserved time, less the ones it takes, still hold the head. With aging, a long job becomes the head within a
bounded wait, and from then on backfilling cannot starve it. Predictions are estimates: a job that overruns its
prediction moves the reservation, as in any EASY scheduler.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from cluster.has import FreePool

QueueOrder = Literal["shortest", "backfill", "strict"]
DEFAULT_ORDER: QueueOrder = "shortest"
DEFAULT_AGING = 0.75
"""`beta` of the `shortest` order's priority `waited_s / predicted_s ** beta` (highest first). 1 is
highest-response-ratio-next (HRRN), 0 is arrival order. 0.75 since 2026-11-24, chosen on the tuning families of
benchmarks/placement_load.py plus seeds 0-3 of the production-shaped generator only. has against fcfs, average JCT
in the worst row / p99 in the worst row / mean has:fcfs ratio over the rows: 0.5 -0.1% / +1.3% / 0.547, 0.65 -3.4% /
+0.4% / 0.538, 0.75 -4.4% / +1.0% / 0.531, 0.9 -6.3% / +2.9% / 0.529, 1.0 -8.6% / +7.5% / 0.535. The additive
aging it replaced (`predicted_s - 0.2 x waited_s`) gave +8.1% / -6.2% / 0.517: the best mean, from the public
tuning families, but a loss to fcfs on every production seed row at loads 0.7-1.1."""


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
    """The walk's key: arrival order, or under `shortest` the negated priority `waited / predicted ** aging`
    (`aging` is DEFAULT_AGING's beta), then the shorter; jobs without a prediction last."""
    if order != "shortest":
        return (w.seq,)
    if w.predicted_s is None:
        return (True, 0.0, w.seq)
    p = max(w.predicted_s, 1e-9)
    return (False, -max(0.0, now_s - w.submitted_s) / p ** aging, p, w.seq)


def ordered(waiting: Sequence[Waiting], order: QueueOrder, now_s: float, aging: float = DEFAULT_AGING
            ) -> list[Waiting]:
    """The waiting jobs in the order the scheduler tries them."""
    return sorted(waiting, key=lambda w: sort_key(w, order, now_s, aging))


Nodes = Sequence[tuple[str, int]]


@dataclass(frozen=True)
class Running:
    """A running allocation as the reservation sees it."""

    end_s: float
    """Predicted end (start + predicted run time); `math.inf` when unknown (never frees, for planning)."""
    nodes: Nodes


class Reservation:
    """The head job's reservation: its start time and the GPUs free then (less what was backfilled past it)."""

    def __init__(self, job: Hashable, start_s: float, at_start: FreePool, head_fits: Callable[[FreePool], bool]
                 ) -> None:
        self.job, self.start_s, self.at_start, self._head_fits = job, start_s, at_start, head_fits

    def admits(self, nodes: Nodes, run_s: float | None, now_s: float) -> bool:
        """May a job take `nodes` now for a predicted `run_s` (None: unknown) without delaying the head?"""
        if run_s is not None and now_s + run_s <= self.start_s:
            return True  # it is predicted to be done before the head starts
        self.at_start.take(nodes)  # still running at the reserved time: the head must fit beside it
        if self._head_fits(self.at_start):
            return True
        self.at_start.give(nodes)
        return False

    def would_admit(self, nodes: Nodes, run_s: float | None, now_s: float) -> bool:
        """`admits` without taking the GPUs (for checks)."""
        ok = self.admits(nodes, run_s, now_s)
        if ok and not (run_s is not None and now_s + run_s <= self.start_s):
            self.at_start.give(nodes)
        return ok


def reserve(job: Hashable, pool: FreePool, running: Iterable[Running], now_s: float,
            head_fits: Callable[[FreePool], bool]) -> Reservation | None:
    """The earliest predicted time at which `head_fits`, releasing `running` in order of predicted end; None when
    it does not fit even once every allocation with a known end is released."""
    at = FreePool(pool.info.values(), dict(pool.free))
    for r in sorted(running, key=lambda r: r.end_s):
        if math.isinf(r.end_s):
            break
        # nodes that left the pool (cordoned, resized) give back only what they can hold
        at.give([(n, min(k, at.info[n].capacity - at.free[n])) for n, k in r.nodes if n in at.info])
        if head_fits(at):
            return Reservation(job, max(now_s, r.end_s), at, head_fits)
    return None


Admit = Callable[[Nodes, float | None], bool]


def _admit_all(nodes: Nodes, run_s: float | None) -> bool:
    return True


def walk(waiting: Sequence[Waiting], order: QueueOrder, now_s: float, try_place: Callable[[Waiting, Admit], bool],
         aging: float = DEFAULT_AGING, reserve_for: Callable[[Waiting], Reservation | None] | None = None
         ) -> tuple[list[Waiting], list[Waiting], Reservation | None]:
    """Try each job in order. `try_place(w, admit)` places `w` now and returns True, or returns False; before it
    commits a placement it must ask `admit(nodes, predicted_run_s)`, which says no when the placement would delay
    the head's reservation. `reserve_for(head)` makes that reservation (see `reserve`); without it, plain
    backfilling. Returns (placed, still waiting, the head's reservation or None)."""
    placed, left = [], []
    blocked = tried = False
    res: Reservation | None = None
    admit: Admit = _admit_all
    for w in ordered(waiting, order, now_s, aging):
        if not blocked and try_place(w, admit):
            placed.append(w)
            continue
        left.append(w)
        if order == "strict":
            blocked = True
        elif reserve_for is not None and not tried:  # one reservation: the head's (the first that does not fit)
            tried = True
            res = reserve_for(w)
            if res is not None:
                admit = functools.partial(res.admits, now_s=now_s)
    return placed, left, res
