"""Red-team set 20's check (issue 45): the committed set passes with at least 25 logs, and the projects of set 17
and of set 9 (which /work/notes' excluded list of sets up to 19 lacked) are excluded while set 20's are not; a copy
of the set broken in one way (a root_line its log lacks, one project twice under another case, more than a third of
one-line logs, an excluded project) is refused for that reason alone."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

SET20 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam20"
CHECK = runpy.run_path(str(SET20 / "check_set.py"))


def _manifest(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines() if line.strip()]


ROWS = _manifest(SET20)
SINGLE = set(CHECK["one_line_logs"](ROWS))
ONE = [row for row in ROWS if row["id"] in SINGLE]
MULTI = [row for row in ROWS if row["id"] not in SINGLE]


def _broken_copies() -> list[tuple[str, list[dict], set[str], str]]:
    """(name, manifest rows, projects banned on top, words of the one refusal expected) for each way to break it."""
    first, second = MULTI[0], MULTI[1]
    return [
        ("root_line", [dict(first, root_line="no log of set 20 holds this line")], set(),
         "root_line is not a substring of the log"),
        ("twice", [first, dict(second, project=first["project"].swapcase())], set(), "a second log from"),
        ("one_line_share", ONE[:2] + MULTI[:3], set(), "2 of 5 logs are one line: more than a third"),
        ("excluded", [first, second], {second["project"].lower()}, second["project"]),
    ]


def _refusals(rows: list[dict], banned: set[str], dest: Path) -> list[str]:
    """What the check refuses in a folder holding this set's logs with only `rows` as its manifest."""
    shutil.copytree(SET20 / "logs", dest / "logs")
    return CHECK["problems"](rows, banned, dest)


def test_the_committed_set_passes_and_sets_9_and_17_are_excluded() -> None:
    banned = CHECK["excluded"]()
    earlier = {row["project"].lower() for name in ("redteam9", "redteam17") for row in _manifest(SET20.parent / name)}
    assert len(ROWS) >= 25 and 3 * len(ONE) <= len(ROWS)
    assert CHECK["problems"](ROWS, banned) == []
    assert earlier <= banned
    assert not {row["project"].lower() for row in ROWS} & banned


def test_one_line_logs_up_to_a_third_pass(tmp_path: Path) -> None:
    assert _refusals(ONE[:1] + MULTI[:2], set(), tmp_path) == []


@pytest.mark.parametrize(("name", "rows", "banned", "words"), _broken_copies(), ids=lambda value: str(value)[:20])
def test_a_copy_broken_one_way_is_refused_for_that_reason_alone(
    name: str, rows: list[dict], banned: set[str], words: str, tmp_path: Path
) -> None:
    found = _refusals(rows, banned, tmp_path)
    assert len(found) == 1 and words in found[0], name
