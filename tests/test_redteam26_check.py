"""Red-team set 26's pre-scoring check (issue 45).

The committed set passes its check with the corpus and every other set excluded, shares no project with them, meets
the brief's size targets (30 logs or more, one-line logs at most a third, 6 or more of 100+ lines, every family),
carries set 25's excluded names less the projects of other sets, and a copy broken in exactly one way is refused for
that one reason.
"""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path

import pytest

DIAG = Path(__file__).resolve().parent / "data" / "diagnosis"
HERE = DIAG / "redteam26"
CHECK = runpy.run_path(str(HERE / "check_set.py"))
SET22 = CHECK["SET22"]
ROWS = SET22["_rows"](HERE / "manifest.jsonl")
FAMILIES = {"cause-chain", "divergence", "network", "user-env-code", "other"}


def projects(folder: Path) -> set[str]:
    """The lower-cased projects named by the manifest in `folder`."""
    return {row["project"].lower() for row in SET22["_rows"](folder / "manifest.jsonl")}


def other_sets() -> list[Path]:
    return sorted(d for d in DIAG.glob("redteam*") if d != HERE and (d / "manifest.jsonl").is_file())


def test_the_set_is_clean_and_shares_no_project() -> None:
    banned = CHECK["excluded"]()
    mine = projects(HERE)
    assert CHECK["problems"](ROWS, banned) == []
    assert not mine & banned
    assert projects(DIAG / "real") <= banned
    for folder in other_sets():
        theirs = projects(folder)
        assert theirs <= banned and not theirs & mine, folder.name


def test_size_and_spread_meet_the_brief() -> None:
    singles, longs = CHECK["one_line_logs"](ROWS), CHECK["long_logs"](ROWS)
    assert len(projects(HERE)) == len(ROWS) >= 30
    assert len(singles) * 3 <= len(ROWS) and len(longs) >= 6
    assert {row["family"] for row in ROWS} == FAMILIES


def test_long_logs_follow_the_files(tmp_path: Path) -> None:
    shutil.copytree(HERE / "logs", tmp_path / "logs")
    before = set(CHECK["long_logs"](ROWS, here=tmp_path))
    cut = sorted(before)[0]
    grown = next(row["id"] for row in ROWS if row["id"] not in before)
    (tmp_path / "logs" / f"{cut}.log").write_text("x\n" * 99)
    (tmp_path / "logs" / f"{grown}.log").write_text("x\n" * 100)
    assert set(CHECK["long_logs"](ROWS, here=tmp_path)) == (before - {cut}) | {grown}


def test_the_excluded_list_carries_set_25s_names_less_other_sets_projects() -> None:
    listed = SET22["_names"](HERE / "excluded_projects.txt")
    taken = set().union(*map(projects, other_sets()))
    assert projects(HERE) <= listed
    assert SET22["_names"](DIAG / "redteam25" / "excluded_projects.txt") - taken <= listed
    assert not listed & taken


ONE = [row for row in ROWS if row["id"] in CHECK["one_line_logs"](ROWS)]
MANY = [row for row in ROWS if row not in ONE]
FIRST, SECOND = MANY[:2]
BREAKS = {
    "a root_line the log lacks": (
        [FIRST, {**SECOND, "root_line": "no log of set 26 holds this line"}],
        set(),
        f"{SECOND['id']}: root_line is not a substring of the log",
    ),
    "one project twice under another case": (
        [FIRST, {**SECOND, "project": FIRST["project"].swapcase()}],
        set(),
        "a second log from",
    ),
    "over a third of one-line logs": (ONE[:2] + MANY[:3], set(), "2 of 5 logs are one line: more than a third"),
    "an excluded project": ([FIRST, SECOND], {SECOND["project"].lower()}, "is excluded"),
}


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_copy_broken_one_way_is_refused_for_that_reason_alone(tmp_path: Path, broken: str) -> None:
    shutil.copytree(HERE / "logs", tmp_path / "logs")
    assert CHECK["problems"](ONE[:1] + MANY[:2], set(), here=tmp_path) == []
    rows, banned, reason = BREAKS[broken]
    refusals = CHECK["problems"](rows, banned, here=tmp_path)
    assert len(refusals) == 1 and reason in refusals[0]
