"""Whether a RUNNING evaluation run's process is gone (killed with its worker, its machine lost): Prefect 3.8 marks no
such run Crashed by itself, so a submit waiting for it waited until eval_timeout_s for a score that could not come
(red team 41q G3). The evidence is Prefect's flow-run heartbeat (`PREFECT_FLOWS_HEARTBEAT_FREQUENCY`, set on the
evaluate-on-checkpoint deployment in deployments/prefect.yaml): a thread of the flow's process sends one at its start
and every period after, whatever the evaluation does, so a live evaluation that logs nothing for minutes still
beats. No Prefect here: the caller reads the heartbeats and the logs."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
MIN_HEARTBEAT_S = 30.0
"""Prefect's flow engine sends no heartbeat more often than this, whatever the setting asks."""
MISSED = 3
"""Heartbeats missed in a row (and as long with no log line) before the process is taken for gone: Prefect's own
zombie-run rule (90 s at the default 30 s)."""


class Liveness(BaseModel):
    """What the server shows of one RUNNING run, in seconds before now."""

    running_s: float
    """Since it started running."""
    quiet_s: float
    """Since its newest log line (or its start)."""
    beat_s: float | None
    """Since its newest heartbeat; None when it has sent none."""


def heartbeat_period(env: Mapping[str, object]) -> float | None:
    """The heartbeat period a deployment's job variables `env` give its runs; None when they send none."""
    raw = env.get(HEARTBEAT_ENV)
    try:
        period = float(str(raw)) if raw is not None else 0.0
    except ValueError:
        return None
    return max(period, MIN_HEARTBEAT_S) if period > 0 else None


def late_after(period: float) -> float:
    """How long without a heartbeat or a log line a run's process is taken for gone."""
    return MISSED * period


def worth_reading(quiet_s: float, period: float | None, read_ago_s: float | None) -> bool:
    """Whether to read a run's newest heartbeat now: only for a run quiet (no log line) longer than `late_after`, and
    at most once a heartbeat period, so that an ordinary run (one that logs) costs no API call more."""
    if period is None or quiet_s <= late_after(period):
        return False
    return read_ago_s is None or read_ago_s >= period


def process_gone(seen: Liveness, period: float | None, name: str, run_id: str) -> str | None:
    """The cause to mark the run `name` (id `run_id`) Crashed with, when neither a heartbeat nor a log line came for `late_after`
    (one that sent no heartbeat at all counts from its start); None while it may be alive, or when its deployment
    sends no heartbeats (nothing tells a dead process from a quiet one then)."""
    if period is None:
        return None
    silent = min(seen.quiet_s, seen.running_s if seen.beat_s is None else seen.beat_s)
    if silent <= late_after(period):
        return None
    beat = "sent no heartbeat since it started" if seen.beat_s is None else f"sent no heartbeat for {seen.beat_s:.0f} s"
    return (f"the evaluation run {name} has been Running {seen.running_s:.0f} s, {beat} (its process sends one every "
            f"{period:.0f} s) and logged nothing for {seen.quiet_s:.0f} s: its process is gone or stopped (killed, "
            f"SIGSTOPped, or its worker or machine died); marked Crashed; its log: `prefect flow-run logs {run_id}`")


NO_WORKER_S = 90.0
"""How long no worker may have polled the evaluation deployment's work pool (three worker heartbeats at Prefect's
default 30 s) before a waiting submit evaluates the steps left itself. `FRENZY_EVAL_NO_WORKER_S` sets another value."""


class WorkerSeen(BaseModel):
    """One worker of a work pool, as the server shows it."""

    name: str
    beat_s: float | None
    """Since its newest heartbeat; None when it has sent none."""
    interval_s: float | None = None
    """The heartbeat period it declared (Prefect's default 30 s when None)."""


def worker_alive(w: WorkerSeen) -> bool:
    """A worker is alive until it has missed MISSED heartbeats (Prefect's own offline rule): one between two polls,
    or between two heartbeats, still is."""
    return w.beat_s is not None and w.beat_s <= MISSED * (w.interval_s or MIN_HEARTBEAT_S)


def unattended_s(workers: list[WorkerSeen], watched_s: float) -> float | None:
    """None while a worker of the pool is alive; else how long no worker has been seen: since the newest heartbeat of
    any (a worker stopped or dead), or, when none ever sent one (none ever started), for as long as it was watched."""
    if any(worker_alive(w) for w in workers):
        return None
    beats = [w.beat_s for w in workers if w.beat_s is not None]
    return min(beats) if beats else watched_s


def no_worker_words(pool: str, workers: list[WorkerSeen]) -> str:
    """Why no worker takes the pool's runs, with the fixes."""
    beats = sorted((w.beat_s, w.name) for w in workers if w.beat_s is not None)
    seen = f"its newest worker, {beats[0][1]}, last polled {beats[0][0]:.0f} s ago" if beats else "no worker ever polled it"
    return (f"no worker polls the work pool {pool} ({seen}): start one from any directory (`prefect worker start "
            f"--pool {pool}`), or submit with `--evaluation in-flow`")


def fenced(state: str | None, run_name: str) -> str | None:
    """Why an evaluation run's process must not publish its result, its run's state on the server being `state` (a
    StateType value): one that ended on the server (marked Crashed while its process was stopped, SIGSTOP say) was
    run again, and that run publishes the step's result; None for a run not ended (RUNNING, or CANCELLING: its process
    is asked to stop, and what it finished stays), or when the state could not be read."""
    if state not in ("CRASHED", "CANCELLED", "FAILED", "COMPLETED"):
        return None
    return (f"not publishing this evaluation: its run {run_name} is {state.capitalize()} on the server, set while "
            "this process was stopped or out of touch (a submit waiting for it marks a run whose heartbeats stopped "
            "Crashed and runs the step again: that run publishes the step's result); nothing of this attempt is "
            "written to the history or the results directory")
