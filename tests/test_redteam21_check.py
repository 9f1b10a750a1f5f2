"""Red-team set 21's check (issue 45).

The committed set passes with at least 25 logs, none of its projects is banned while every project of set 20 and of
the excluded list it was gathered against is; a copy of the set broken in exactly one way (a root_line no log holds,
one project twice under another case, two one-line logs among five, a banned project) is refused once, for that
reason.
"""

from __future__ import annotations

import json
import runpy
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam21"
CHECK = runpy.run_path(str(HERE / "check_set.py"))


def _rows(folder: Path) -> list[dict]:
    lines = (folder / "manifest.jsonl").read_text().splitlines()
    return [json.loads(text) for text in lines if text.strip()]


SET21 = _rows(HERE)
ONE_LINE_IDS = set(CHECK["one_line_logs"](SET21))
SHORT = [row for row in SET21 if row["id"] in ONE_LINE_IDS]
LONGER = [row for row in SET21 if row["id"] not in ONE_LINE_IDS]


@dataclass(frozen=True)
class Break:
    """A manifest broken one way, the projects banned on top, and the words of the single refusal it must get."""

    rows: list[dict]
    banned: set[str]
    words: str


BREAKS = {
    "root_line": Break([dict(LONGER[0], root_line="a line that no log of set 21 holds")], set(),
                       "root_line is not a substring of the log"),
    "same_project_other_case": Break([LONGER[0], dict(LONGER[1], project=LONGER[0]["project"].upper())], set(),
                                     "a second log from"),
    "too_many_one_line_logs": Break(SHORT[:2] + LONGER[:3], set(), "2 of 5 logs are one line: more than a third"),
    "banned_project": Break(LONGER[:2], {LONGER[1]["project"].lower()}, LONGER[1]["project"]),
}


def _check_copy(rows: list[dict], banned: set[str], folder: Path) -> list[str]:
    """The refusals for a folder with this set's logs whose manifest is only `rows`."""
    shutil.copytree(HERE / "logs", folder / "logs")
    return CHECK["problems"](rows, banned, folder)


def test_the_set_passes_and_earlier_projects_are_banned() -> None:
    banned = CHECK["excluded"]()
    listed = {name.strip().lower() for name in (HERE / "excluded_projects.txt").read_text().splitlines()}
    set20 = {row["project"].lower() for row in _rows(HERE.parent / "redteam20")}
    ours = {row["project"].lower() for row in SET21}
    assert len(SET21) >= 25 and 3 * len(SHORT) <= len(SET21)
    assert CHECK["problems"](SET21, banned) == []
    assert set20 <= banned and (listed - ours) <= banned
    assert not ours & banned


def test_a_third_of_one_line_logs_is_accepted(tmp_path: Path) -> None:
    assert _check_copy(SHORT[:1] + LONGER[:2], set(), tmp_path) == []


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_one_break_gets_one_refusal_naming_it(name: str, tmp_path: Path) -> None:
    case = BREAKS[name]
    refusals = _check_copy(case.rows, case.banned, tmp_path)
    assert len(refusals) == 1 and case.words in refusals[0]
