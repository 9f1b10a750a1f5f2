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
