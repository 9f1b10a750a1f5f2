"""Red-team set 22's check (issue 45): the committed set passes with at least 25 logs while the corpus's and set 9's
projects are excluded and set 22's are not; a copy of the set broken in exactly one way is refused for that reason and
no other (a root_line its log lacks, one project twice under another case, over a third of one-line logs, an excluded
project)."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam22"
_CHECK = runpy.run_path(str(HERE / "check_set.py"))
excluded, one_line_logs, problems = _CHECK["excluded"], _CHECK["one_line_logs"], _CHECK["problems"]


def _manifest(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _single_and_multi() -> tuple[list[dict], list[dict]]:
    """The set's one-line logs and its longer ones, in manifest order."""
    rows = _manifest(HERE / "manifest.jsonl")
    single = set(one_line_logs(rows))
    return [r for r in rows if r["id"] in single], [r for r in rows if r["id"] not in single]


@pytest.fixture
def logs_copy(tmp_path: Path) -> Path:
    """A folder holding a copy of the set's logs, for checking a broken manifest against."""
    shutil.copytree(HERE / "logs", tmp_path / "logs")
    return tmp_path


def test_the_committed_set_passes_and_earlier_projects_are_excluded() -> None:
    rows = _manifest(HERE / "manifest.jsonl")
    banned = excluded()
    assert len(rows) >= 25 and 3 * len(one_line_logs(rows)) <= len(rows)
    assert problems(rows, banned) == []
    for earlier in ("real", "redteam9"):
        assert {r["project"].lower() for r in _manifest(HERE.parent / earlier / "manifest.jsonl")} <= banned
    assert not {r["project"].lower() for r in rows} & banned


def test_the_sets_own_list_names_its_projects_without_refusing_them() -> None:
    listed = {ln.strip().lower() for ln in (HERE / "excluded_projects.txt").read_text().splitlines() if ln.strip()}
    assert {r["project"].lower() for r in _manifest(HERE / "manifest.jsonl")} <= listed


def test_a_third_of_one_line_logs_is_allowed(logs_copy: Path) -> None:
    single, multi = _single_and_multi()
    assert problems(single[:1] + multi[:2], set(), logs_copy) == []


def test_a_root_line_its_log_lacks_is_refused(logs_copy: Path) -> None:
    row = dict(_single_and_multi()[1][0], root_line="no log of set 22 holds this line")
    assert problems([row], set(), logs_copy) == [f"{row['id']}: root_line is not a substring of the log"]


def test_one_project_twice_under_another_case_is_refused(logs_copy: Path) -> None:
    first, second = _single_and_multi()[1][:2]
    found = problems([first, dict(second, project=first["project"].swapcase())], set(), logs_copy)
    assert len(found) == 1 and "a second log from" in found[0]


def test_more_than_a_third_of_one_line_logs_is_refused(logs_copy: Path) -> None:
    single, multi = _single_and_multi()
    assert problems(single[:2] + multi[:3], set(), logs_copy) == ["2 of 5 logs are one line: more than a third"]


def test_an_excluded_project_is_refused(logs_copy: Path) -> None:
    rows = _single_and_multi()[1][:2]
    found = problems(rows, {rows[1]["project"].lower()}, logs_copy)
    assert len(found) == 1 and rows[1]["project"] in found[0] and "is excluded" in found[0]
