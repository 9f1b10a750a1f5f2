"""A trial's deadline: how long it may go without progress (the model loaded, a chunk landed or scored) before its
process group is killed as hung (red team 41n: a dataset whose `infer` hung held the whole evaluation for ever).

What a trial works on next is known from its plan and the events it sent so far; its deadline is the larger of a floor
and `STALL_FACTOR` times what the plan predicts for that step (the learned priors, else the suite's). The floor is
the suite's `trial_stall_s` for Frenzy's own datasets and the model load, and its `plugin_timeout_s` for a plugin's
chunk (the setting a plugin's load, `score` and `aggregate` already have). A slow honest trial stays far inside it:
the floor alone is many times the longest chunk or load of a normal evaluation on this 2-core CPU
(benchmarks/results/shared_service_redteam_n.md, "After red team n, second pass"), and a chunk the plan expects to
be long gets ten times its prediction. No process is started here; the runner's `Watchdog` kills one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from tasks.evaluation.schedule import ChunkPlan, TrialPlan

STALL_FACTOR = 10.0
"""A step may take this many times its predicted seconds (when that is above the floor)."""


@dataclass(frozen=True)
class Pending:
    """What a trial is doing now, and how long it may take before it counts as hung."""

    what: str
    """`loading the model`, `inferring DATASET[a:b]`, `scoring DATASET[a:b] on its GPU` or `ending`."""
    dataset: str | None
    """The dataset of that step (None for the model load and the end): the one that fails when it hangs."""
    deadline_s: float
    setting: str
    """The suite setting that governs the floor: `trial_stall_s` or `plugin_timeout_s`."""
    floor_s: float


@dataclass(frozen=True)
class Floors:
    """The suite's floors and its predicted model load, for one trial."""

    trial_stall_s: float
    plugin_timeout_s: float
    load_s: float
    is_plugin: Callable[[str], bool]


def pending(tr: TrialPlan, loaded: bool, done: set[tuple[str, int]], scoring: set[tuple[str, int]] | None,
            floors: Floors) -> Pending:
    """The step trial `tr` is at: its model unless `loaded`; else its first chunk (in the order the trial runs them)
    not in `done` (landed); then, with metrics on its GPU (`scoring`: those scored), its first chunk not scored."""
    if not loaded:
        return _step("loading the model", None, floors.load_s, floors)
    for c in tr.chunks:
        if (c.dataset, c.start) not in done:
            return _chunk_step(f"inferring {c.label}", c, c.infer_s, floors)
    for c in tr.chunks if scoring is not None else []:
        if (c.dataset, c.start) not in scoring:
            return _chunk_step(f"scoring {c.label} on its GPU", c, c.metric_s, floors)
    return _step("ending", None, 0.0, floors)


def _chunk_step(what: str, c: ChunkPlan, predicted_s: float, floors: Floors) -> Pending:
    if floors.is_plugin(c.dataset):
        return Pending(what, c.dataset, max(floors.plugin_timeout_s, STALL_FACTOR * predicted_s), "plugin_timeout_s",
                       floors.plugin_timeout_s)
    return _step(what, c.dataset, predicted_s, floors)


def _step(what: str, dataset: str | None, predicted_s: float, floors: Floors) -> Pending:
    return Pending(what, dataset, max(floors.trial_stall_s, STALL_FACTOR * predicted_s), "trial_stall_s",
                   floors.trial_stall_s)


def copying(trial_stall_s: float, load_s: float) -> Pending:
    """The step of a node's precursor, copying the model into shared memory: the deadline of a trial's model load
    (`trial_stall_s`, or 10x the predicted remote load `load_s` when that is larger; red team 41p S7: a SIGSTOPped
    precursor held `frenzy evaluate` with no deadline and no word)."""
    return _step("copying the model into shared memory", None, load_s, Floors(trial_stall_s, 0.0, load_s, lambda _: False))


def hang_cause(name: str, p: Pending, log: str) -> str:
    """The cause of a trial killed at its deadline: the trial, the step, the deadline, the setting and the log."""
    return (f"{name} hung while {p.what} (no progress in {round(p.deadline_s, 1):g}s, the larger of `{p.setting}` "
            f"{p.floor_s:g}s and {STALL_FACTOR:g}x the predicted time; its process group was killed); if it only "
            f"needs longer, raise `{p.setting}` in the suite file (its log: {log})")


class Watchdog:
    """Calls `kill` once when `arm`ed and not re-armed or stopped within the armed seconds; `fired` then holds the
    step that hung."""

    def __init__(self, kill: Callable[[], None]) -> None:
        self.kill = kill
        self.fired: Pending | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, p: Pending) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self.fired is None:
                self._timer = threading.Timer(p.deadline_s, self._expire, args=(p,))
                self._timer.daemon = True
                self._timer.start()

    def _expire(self, p: Pending) -> None:
        with self._lock:
            if self.fired is not None or threading.current_thread() is not self._timer:
                return  # re-armed or stopped while it fired
            self.fired = p
        self.kill()

    def stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
