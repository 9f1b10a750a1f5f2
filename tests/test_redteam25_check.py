"""Red-team set 25's pre-scoring check (issue 45).

The committed set must pass with the corpus and every other set excluded, meet the brief's size targets (30 logs, at
most a third of one line, 6 of 100+ lines), and carry set 24's excluded names less other sets' projects. A copy of
the set damaged in one way must be refused with that one reason.
"""

from __future__ import annotations

import runpy
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DIAG = Path(__file__).resolve().parent / "data" / "diagnosis"
SET25 = DIAG / "redteam25"
CHECK = runpy.run_path(str(SET25 / "check_set.py"))
read_rows = CHECK["SET22"]["_rows"]
read_names = CHECK["SET22"]["_names"]
ROWS = read_rows(SET25 / "manifest.jsonl")
OTHER_SETS = sorted(d for d in DIAG.glob("redteam*") if d != SET25 and (d / "manifest.jsonl").is_file())


def projects_of(folder: Path) -> set[str]:
    """Lower-cased projects of the manifest in `folder`."""
    return {row["project"].lower() for row in read_rows(folder / "manifest.jsonl")}


def line_count(log_dir: Path, row: dict) -> int:
    return len((log_dir / f"{row['id']}.log").read_text().splitlines())


def test_the_set_passes_and_shares_no_project_with_the_corpus_or_another_set() -> None:
    banned = CHECK["excluded"]()
    assert CHECK["problems"](ROWS, banned) == []
    assert projects_of(DIAG / "real") <= banned
    for other in OTHER_SETS:
        assert projects_of(other) <= banned, other.name
        assert not projects_of(other) & projects_of(SET25), other.name
    assert not projects_of(SET25) & banned


def test_the_set_meets_the_size_targets_of_the_brief() -> None:
    singles = CHECK["one_line_logs"](ROWS)
    longs = CHECK["long_logs"](ROWS)
    assert len(ROWS) >= 30 and len(projects_of(SET25)) == len(ROWS)
    assert 3 * len(singles) <= len(ROWS)
    assert len(longs) >= 6
    assert {row["family"] for row in ROWS} == {"cause-chain", "divergence", "network", "user-env-code", "other"}


def test_long_logs_are_counted_by_lines(tmp_path: Path) -> None:
    shutil.copytree(SET25 / "logs", tmp_path / "logs")
    expected = {row["id"] for row in ROWS if line_count(tmp_path / "logs", row) >= 100}
    assert set(CHECK["long_logs"](ROWS, here=tmp_path)) == expected
    first = next(row for row in ROWS if row["id"] in expected)
    (tmp_path / "logs" / f"{first['id']}.log").write_text("one line\n" * 99)
    assert set(CHECK["long_logs"](ROWS, here=tmp_path)) == expected - {first["id"]}


def test_the_excluded_list_is_set_24s_less_other_sets_projects_plus_its_own() -> None:
    listed = read_names(SET25 / "excluded_projects.txt")
    in_other_sets = set().union(*(projects_of(d) for d in OTHER_SETS))
    assert projects_of(SET25) <= listed
    assert read_names(DIAG / "redteam24" / "excluded_projects.txt") - in_other_sets <= listed
    assert not listed & in_other_sets


SINGLE = [row for row in ROWS if row["id"] in set(CHECK["one_line_logs"](ROWS))]
MULTI = [row for row in ROWS if row not in SINGLE]
A, B = MULTI[0], MULTI[1]

DAMAGE: dict[str, tuple[Callable[[], tuple[list[dict], set[str]]], str]] = {
    "root line missing": (
        lambda: ([A, dict(B, root_line="a line no log of set 25 holds")], set()),
        f"{B['id']}: root_line is not a substring of the log",
    ),
    "one project twice": (lambda: ([A, dict(B, project=A["project"].upper())], set()), "a second log from"),
    "too many one-line logs": (lambda: (SINGLE[:2] + MULTI[:3], set()), "2 of 5 logs are one line: more than a third"),
    "excluded project": (lambda: ([A, B], {B["project"].lower()}), "is excluded"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_copy_damaged_one_way_is_refused_for_that_reason(tmp_path: Path, damage: str) -> None:
    shutil.copytree(SET25 / "logs", tmp_path / "logs")
    assert CHECK["problems"](SINGLE[:1] + MULTI[:2], set(), here=tmp_path) == []
    make, reason = DAMAGE[damage]
    rows, banned = make()
    refusals = CHECK["problems"](rows, banned, here=tmp_path)
    assert len(refusals) == 1 and reason in refusals[0]
