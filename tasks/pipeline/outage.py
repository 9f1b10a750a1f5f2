"""When the Prefect API could not be reached, as one submit saw it, and which commits fell in such a time: a commit
event sent while the server was down (or restarting) may never have made its evaluation run, and the trigger that
would have made it cannot be asked. A submit that sees the server answer again reconciles those steps at once rather
than after the ORPHAN_S fallback (red team 41l, B3). No Prefect here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


@dataclass
class Outage:
    """The API unreachable from `start` to `end` (epoch seconds): from the first failed call to the first answer."""

    start: float
    end: float

    def words(self) -> str:
        at = lambda t: datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")  # noqa: E731
        return f"from {at(self.start)} to {at(self.end)} UTC"


@dataclass
class Outages:
    """The outages seen so far; `slack_s`: how long before an outage began a commit's event may still have been
    waiting in the server for its trigger (the server died with it)."""

    slack_s: float
    down_since: float | None = None
    seen: list[Outage] = field(default_factory=list)

    def failed(self, now: float) -> None:
        """A call to the API failed at `now` (connection refused, 5xx, a timeout)."""
        if self.down_since is None:
            self.down_since = now

    def answered(self, now: float) -> Outage | None:
        """The API answered at `now`: the outage that ends here, if one was going on."""
        if self.down_since is None:
            return None
        ended = Outage(self.down_since, now)
        self.seen.append(ended)
        self.down_since = None
        return ended

    def covering(self, committed: float) -> Outage | None:
        """The ended outage whose commit events may have been lost with a commit at `committed`, or None."""
        return next((o for o in self.seen if o.start - self.slack_s <= committed <= o.end), None)


@dataclass(frozen=True)
class CommitTimes:
    """When each step's commit was recorded (epoch seconds), as the trainer's progress.jsonl says."""

    at: tuple[tuple[int, float], ...] = ()

    def of(self, step: int) -> float | None:
        return next((t for s, t in self.at if s == step), None)


def commit_times(progress: Path) -> CommitTimes:
    """The commit times in the trainer's progress.jsonl `progress`; none without one."""
    out: dict[int, float] = {}
    try:
        lines = progress.read_text(errors="replace").splitlines()
    except OSError:
        return CommitTimes()
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        if isinstance(rec, dict) and rec.get("event") == "checkpoint" and isinstance(rec.get("step"), int):
            out[rec["step"]] = float(rec.get("time") or 0.0)
    return CommitTimes(tuple(sorted(out.items())))
