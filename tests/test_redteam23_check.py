"""Red-team set 23's check (issue 45): the committed set passes with at least 30 logs while the corpus's, set 9's and
set 22's projects are excluded and set 23's are not; its own list carries forward every name excluded before except
other sets' own projects (their manifests exclude those, and listing them here would make those sets' checks refuse
them); a copy of the set broken in exactly one way is refused for that reason and no other (a root_line its log lacks,
one project twice under another case, over a third of one-line logs, an excluded project)."""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path

import pytest

DIAG = Path(__file__).resolve().parent / "data" / "diagnosis"
HERE = DIAG / "redteam23"
_CHECK = runpy.run_path(str(HERE / "check_set.py"))
excluded, one_line_logs, problems = _CHECK["excluded"], _CHECK["one_line_logs"], _CHECK["problems"]
_rows = _CHECK["SET22"]["_rows"]
_names = _CHECK["SET22"]["_names"]


def _projects(folder: Path) -> set[str]:
    return {r["project"].lower() for r in _rows(folder / "manifest.jsonl")}


@pytest.fixture
def split() -> tuple[list[dict], list[dict]]:
    """The set's one-line logs and its longer ones, in manifest order."""
    rows = _rows(HERE / "manifest.jsonl")
    single = set(one_line_logs(rows))
    return [r for r in rows if r["id"] in single], [r for r in rows if r["id"] not in single]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A folder with the set's logs and no manifest, for checking broken rows against."""
    shutil.copytree(HERE / "logs", tmp_path / "logs")
    return tmp_path


def test_the_committed_set_passes_with_every_earlier_project_excluded() -> None:
    rows, banned = _rows(HERE / "manifest.jsonl"), excluded()
    assert len(rows) >= 30 and 3 * len(one_line_logs(rows)) <= len(rows)
    assert problems(rows, banned) == []
    assert _projects(DIAG / "real") | _projects(DIAG / "redteam9") | _projects(DIAG / "redteam22") <= banned
    assert not _projects(HERE) & banned


def test_the_list_carries_earlier_names_and_its_own_but_no_other_sets_projects() -> None:
    listed = _names(HERE / "excluded_projects.txt")
    others = set().union(*(_projects(d) for d in DIAG.glob("redteam*") if d != HERE and (d / "manifest.jsonl").exists()))
    assert _projects(HERE) <= listed
    assert _names(DIAG / "redteam22" / "excluded_projects.txt") - others <= listed
    assert not listed & others


def test_a_third_of_one_line_logs_is_allowed(split: tuple[list[dict], list[dict]], copy: Path) -> None:
    single, multi = split
    assert problems(single[:1] + multi[:2], set(), copy) == []


def test_more_than_a_third_of_one_line_logs_is_refused(split: tuple[list[dict], list[dict]], copy: Path) -> None:
    single, multi = split
    assert problems(single[:2] + multi[:3], set(), copy) == ["2 of 5 logs are one line: more than a third"]


def test_a_root_line_its_log_lacks_is_refused(split: tuple[list[dict], list[dict]], copy: Path) -> None:
    row = dict(split[1][0], root_line="no log of set 23 holds this line")
    assert problems([row], set(), copy) == [f"{row['id']}: root_line is not a substring of the log"]


def test_one_project_twice_under_another_case_is_refused(split: tuple[list[dict], list[dict]], copy: Path) -> None:
    first, second = split[1][:2]
    found = problems([first, dict(second, project=first["project"].swapcase())], set(), copy)
    assert len(found) == 1 and "a second log from" in found[0]


def test_an_excluded_project_is_refused(split: tuple[list[dict], list[dict]], copy: Path) -> None:
    rows = split[1][:2]
    found = problems(rows, {rows[1]["project"].lower()}, copy)
    assert len(found) == 1 and rows[1]["project"] in found[0] and "is excluded" in found[0]
