"""How round 17's held-out Philly windows (placement_fresh.py WINDOWS17) were chosen: from the trace and the earlier
lists alone, before any policy ran on them. Prints the candidate windows; the list in placement_fresh.py is its output
with the clusters and loads given in turn.

    python benchmarks/placement_pick17.py

An earlier window is the first `jobs` kept jobs from its start (rounds 6-16, placement_load.py's four); red team
43's 15 days are excluded whole (and the 450 jobs from their midnight). A free stretch is a run of kept jobs (in the
reader's order) that no earlier window holds. Windows: first every free day's stretch (from the midnight of its first
free day, or from the stretch's start where that leaves fewer than 400 jobs), then the largest stretches left, each
taken whole up to 2,000 jobs.
"""

from __future__ import annotations

import bisect
import collections
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import placement_fresh as pf  # noqa: E402
from placement_runs import PHILLY_STARTS  # noqa: E402

RED_TEAM_DAYS = tuple(f"2017-{d}" for d in ("09-26", "10-03", "10-10", "10-12", "10-16", "10-17", "10-20", "10-24",
                                             "11-01", "11-08", "11-13", "11-22", "11-28", "12-01", "12-07"))
"""Red team 43's Philly days (placement_fresh.py's docstring), excluded whole."""
MIN_JOBS, MAX_JOBS, WANT = 400, 2000, 16


def kept_jobs() -> list[tuple[str, int]]:
    """Philly's jobs after read_philly's default filters, as (submit time, CSV line), sorted as the reader sorts."""
    out = []
    with open(pf.TRACES / "philly.csv", newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            d, g = float(r["duration"]), int(float(r["num_gpus"]))
            if d >= 60 and d * g / 3600 < 1000:
                out.append((r["timestamp"], line))
    return sorted(out)


def earlier_indices(kept: list[tuple[str, int]], before: str) -> set[int]:
    """Indices (into `kept`) of the jobs of every Philly window of the sets listed before `before`, placement_load's
    windows and red team 43's days."""
    def win(start: str, n: int) -> set[int]:
        i = bisect.bisect_left(kept, (start, 0))
        return set(range(i, min(i + n, len(kept))))
    used: set[int] = set()
    for name, windows in pf.SETS.items():
        if name == before:
            break
        used |= {i for w in windows if w.source.startswith("philly:")
                 for i in win(pf.philly_start(w.source.split(":", 1)[1]), w.jobs)}
    for s in PHILLY_STARTS:
        used |= win(s, 450)
    for day in RED_TEAM_DAYS:
        used |= win(day + " 00:00:00", 450) | {i for i, (t, _) in enumerate(kept) if t.startswith(day)}
    return used


def candidates() -> list[tuple[str, int, int]]:
    """(start time, jobs, jobs on free days) of round 17's windows, in time order."""
    kept = kept_jobs()
    used = earlier_indices(kept, "round17")
    by_day: dict[str, list[int]] = collections.defaultdict(list)
    for i, (t, _) in enumerate(kept):
        by_day[t[:10]].append(i)
    free = {d for d, ix in by_day.items() if not used.intersection(ix)}
    stretches, i = [], 0
    while i < len(kept):
        j = i
        while j < len(kept) and j not in used:
            j += 1
        if j > i:
            stretches.append((i, j))
        i = j + 1
    picked, rest = [], []
    for a, b in stretches:
        on_free = [k for k in range(a, b) if kept[k][0][:10] in free]
        first = on_free[0] if on_free else a
        first = first if b - first >= MIN_JOBS else a
        while first < b and first > 0 and kept[first][0] == kept[first - 1][0]:
            first += 1  # a start time shared with an earlier window's last job would take that job too
        (picked if on_free and b - a >= MIN_JOBS else rest).append((first, min(b, first + MAX_JOBS), len(on_free)))
    rest = sorted((r for r in rest if r[1] - r[0] >= MIN_JOBS), key=lambda r: r[0] - r[1])
    chosen = sorted(picked + rest[:WANT - len(picked)])
    return [(kept[a][0], b - a, f) for a, b, f in chosen]


if __name__ == "__main__":
    for start, n, f in candidates():
        print(f"{start}  {n:5d} jobs, {f} on days no earlier window used")
