"""The held-out placement windows hold jobs no earlier window held (benchmarks/placement_fresh.py)."""

import bisect
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import placement_fresh as pf  # noqa: E402
from benchmarks.placement_runs import PHILLY_STARTS  # noqa: E402


def _kept() -> list[tuple[str, int]]:
    """Philly's jobs after read_philly's default filters, as (submit time, CSV line), sorted as the reader sorts."""
    out = []
    with open(pf.TRACES / "philly.csv", newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            d, g = float(r["duration"]), int(float(r["num_gpus"]))
            if d >= 60 and d * g / 3600 < 1000:
                out.append((r["timestamp"], line))
    return sorted(out)


def _window(kept: list[tuple[str, int]], start: str, n: int = 450) -> set[int]:
    i = bisect.bisect_left(kept, (start, 0))
    return {line for _, line in kept[i:i + n]}


def test_round16_windows_share_no_job_with_an_earlier_window_or_each_other() -> None:
    kept = _kept()
    earlier: set[int] = set()
    for name, windows in pf.SETS.items():
        if name != "round16":
            for w in windows:
                kind, arg = w.source.split(":", 1)
                if kind == "philly":
                    earlier |= _window(kept, pf.philly_start(arg))
    for start in PHILLY_STARTS:
        earlier |= _window(kept, start)
    seen: set[int] = set()
    for w in pf.SETS["round16"]:
        jobs = _window(kept, pf.philly_start(w.source.split(":", 1)[1]))
        assert len(jobs) == 450, w.key
        assert not jobs & earlier, f"{w.key} holds {len(jobs & earlier)} jobs of an earlier window"
        assert not jobs & seen, f"{w.key} overlaps another round-16 window"
        seen |= jobs


def test_a_philly_window_starts_at_midnight_or_at_the_time_it_names() -> None:
    assert pf.philly_start("2017-10-04") == "2017-10-04 00:00:00"
    assert pf.philly_start("2017-10-04 00:37:08") == "2017-10-04 00:37:08"
