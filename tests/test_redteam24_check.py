"""Red-team set 24's check (issue 45): the committed set passes with at least 30 logs, at most a third of one line,
while the corpus's and every earlier set's projects are excluded and set 24's are not; its list carries the names
excluded before except other sets' own projects; a copy of the set broken in exactly one way is refused for that
reason alone (a root_line its log lacks, one project twice under another case, over a third of one-line logs, an
excluded project); long logs are counted by line count."""

from __future__ import annotations

import runpy
import shutil
from functools import partial
from pathlib import Path

import pytest

DIAG = Path(__file__).resolve().parent / "data" / "diagnosis"
HERE = DIAG / "redteam24"
_CHECK = runpy.run_path(str(HERE / "check_set.py"))
excluded, one_line_logs, problems, long_logs = (
    _CHECK["excluded"],
    _CHECK["one_line_logs"],
    _CHECK["problems"],
    _CHECK["long_logs"],
)
_rows = _CHECK["SET22"]["_rows"]
_names = _CHECK["SET22"]["_names"]


def _projects(folder: Path) -> set[str]:
    return {r["project"].lower() for r in _rows(folder / "manifest.jsonl")}


def _earlier_sets() -> list[Path]:
    return [d for d in DIAG.glob("redteam*") if d != HERE and (d / "manifest.jsonl").exists()]


ROWS = _rows(HERE / "manifest.jsonl")
SINGLE = [r for r in ROWS if r["id"] in set(one_line_logs(ROWS))]
MULTI = [r for r in ROWS if r not in SINGLE]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The set's logs copied without its manifest, so hand-made rows are checked against real logs."""
    shutil.copytree(HERE / "logs", tmp_path / "logs")
    return tmp_path


def test_the_committed_set_passes_with_every_earlier_project_excluded() -> None:
    banned = excluded()
    assert len(ROWS) >= 30 and 3 * len(SINGLE) <= len(ROWS)
    assert problems(ROWS, banned) == []
    earlier = set().union(*(_projects(d) for d in _earlier_sets()))
    assert _projects(DIAG / "real") | earlier <= banned
    assert not _projects(HERE) & banned


def test_the_list_carries_earlier_names_and_its_own_but_no_other_sets_projects() -> None:
    listed = _names(HERE / "excluded_projects.txt")
    others = set().union(*(_projects(d) for d in _earlier_sets()))
    assert _projects(HERE) <= listed
    assert _names(DIAG / "redteam23" / "excluded_projects.txt") - others <= listed
    assert not listed & others


def test_long_logs_are_the_ones_of_a_hundred_lines_or_more(copy: Path) -> None:
    counted = set(long_logs(ROWS, copy))
    lengths = {r["id"]: len((copy / "logs" / f"{r['id']}.log").read_text().splitlines()) for r in ROWS}
    assert counted == {i for i, n in lengths.items() if n >= 100}
    assert counted and min(lengths[i] for i in counted) >= 100


def test_a_copy_broken_one_way_is_refused_for_that_reason_alone(copy: Path) -> None:
    single, multi = SINGLE, MULTI
    first, second = multi[:2]
    check = partial(problems, here=copy)
    assert check(single[:1] + multi[:2], set()) == []
    assert check(single[:2] + multi[:3], set()) == ["2 of 5 logs are one line: more than a third"]
    lacking = dict(first, root_line="no log of set 24 holds this line")
    assert check([lacking], set()) == [f"{first['id']}: root_line is not a substring of the log"]
    twice = check([first, dict(second, project=first["project"].swapcase())], set())
    assert len(twice) == 1 and "a second log from" in twice[0]
    refused = check([first, second], {second["project"].lower()})
    assert len(refused) == 1 and second["project"] in refused[0] and "is excluded" in refused[0]
