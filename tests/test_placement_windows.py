"""The held-out placement windows hold jobs no earlier window held (benchmarks/placement_fresh.py)."""

import bisect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import placement_fresh as pf  # noqa: E402
from benchmarks.placement_pick17 import RED_TEAM_DAYS, kept_jobs  # noqa: E402
from benchmarks.placement_runs import PHILLY_STARTS  # noqa: E402


def _window(kept: list[tuple[str, int]], start: str, n: int = 450) -> set[int]:
    i = bisect.bisect_left(kept, (start, 0))
    return {line for _, line in kept[i : i + n]}


def _earlier(kept: list[tuple[str, int]], before: str) -> set[int]:
    """The jobs of every Philly window of the sets listed before `before`, placement_load.py's four windows and red
    team 43's days whole (with the 450 jobs from their midnight)."""
    earlier: set[int] = set()
    for name, windows in pf.SETS.items():
        if name == before:
            break
        for w in windows:
            kind, arg = w.source.split(":", 1)
            if kind == "philly":
                earlier |= _window(kept, pf.philly_start(arg), w.jobs)
    for start in PHILLY_STARTS:
        earlier |= _window(kept, start)
    for day in RED_TEAM_DAYS:
        earlier |= _window(kept, day + " 00:00:00") | {line for t, line in kept if t.startswith(day)}
    return earlier


@pytest.mark.parametrize("name", ["round16", "round17"])
def test_held_out_windows_share_no_job_with_an_earlier_window_or_each_other(name: str) -> None:
    kept = kept_jobs()
    earlier = _earlier(kept, name)
    seen: set[int] = set()
    for w in pf.SETS[name]:
        jobs = _window(kept, pf.philly_start(w.source.split(":", 1)[1]), w.jobs)
        assert len(jobs) == w.jobs, w.key
        assert not jobs & earlier, f"{w.key} holds {len(jobs & earlier)} jobs of an earlier window"
        assert not jobs & seen, f"{w.key} overlaps another {name} window"
        seen |= jobs


def test_philly_rows_are_those_of_the_start_on_sorted_as_read_from_the_file(tmp_path: Path) -> None:
    """The rows cut from the file read once equal the rows filtered and sorted from a fresh read (a start that two
    rows record, one between recorded times, one before the first row and one past the last)."""
    import csv

    with open(pf.TRACES / "philly.csv", newline="") as f:
        rows = list(csv.reader(f))
    for start in ("2017-09-24 14:01:55", "2017-11-01 00:00:00", "2000-01-01", "2099-01-01"):
        want = [rows[0], *sorted((x for x in rows[1:] if x and x[0] >= start), key=lambda x: x[0])[:1500]]
        with open(pf.philly_rows(start, tmp_path / "w.csv"), newline="") as f:
            assert list(csv.reader(f)) == want, f"the rows from {start} on"


def test_round17_windows_read_as_many_jobs_as_they_name(tmp_path: Path) -> None:
    for w in pf.SETS["round17"]:
        trace = pf.window_trace(w, tmp_path)
        assert len(trace) == w.jobs, f"{w.key}: the reader kept {len(trace)} jobs, the window names {w.jobs}"


def test_a_philly_window_starts_at_midnight_or_at_the_time_it_names() -> None:
    assert pf.philly_start("2017-10-04") == "2017-10-04 00:00:00"
    assert pf.philly_start("2017-10-04 00:37:08") == "2017-10-04 00:37:08"


def test_the_kalos_rows_run_each_job_its_recorded_time(tmp_path: Path) -> None:
    from cluster.inventory import load_cluster
    from cluster.simulator import simulate

    trace = pf.window_trace(pf.SETS["kalos"][0], tmp_path)
    assert len(trace) == 227 and max(j.num_gpus for j in trace) == 1024
    wide = [j for j in trace if j.num_gpus == 64][:2]  # 8 nodes of 8 A100-80GB: runs across nodes
    for name in ("kalos-like", "kalos-mix"):
        c = load_cluster(pf.cluster_path(name))
        assert sum(n.count for n in c.nodes if n.gpu == "A100-80GB-SXM") >= 1024, name
        res = simulate(c, wide, "fcfs")
        assert [round(j.run_s) for j in res.jobs] == [round(j.duration_s) for j in wide], name
