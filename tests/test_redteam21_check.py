"""Red-team set 21's check (issue 45): the committed set passes with at least 25 logs and set 20's projects are
excluded while set 21's are not; a copy of the set broken in one way (a root_line its log lacks, one project twice
under another case, more than a third of one-line logs, an excluded project) is refused for that reason alone."""

from __future__ import annotations

import json
import runpy
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

SET21 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam21"
CHECK = runpy.run_path(str(SET21 / "check_set.py"))
ROWS = [json.loads(ln) for ln in (SET21 / "manifest.jsonl").read_text().splitlines() if ln.strip()]
_SINGLE = set(CHECK["one_line_logs"](ROWS))
ONE, MULTI = ([r for r in ROWS if (r["id"] in _SINGLE) is single] for single in (True, False))

# name -> (rows of the broken copy, projects banned on top, the words of the one refusal expected)
BREAKS: dict[str, Callable[[], tuple[list[dict], set[str], str]]] = {
    "root_line": lambda: ([dict(MULTI[0], root_line="no log of set 21 holds this line")], set(),
                          "root_line is not a substring of the log"),
    "twice": lambda: ([MULTI[0], dict(MULTI[1], project=MULTI[0]["project"].swapcase())], set(),
                      "a second log from"),
    "one_line_share": lambda: (ONE[:2] + MULTI[:3], set(), "2 of 5 logs are one line: more than a third"),
    "excluded": lambda: (MULTI[:2], {MULTI[1]["project"].lower()}, MULTI[1]["project"]),
}


def _copy_and_check(rows: list[dict], banned: set[str], dest: Path) -> list[str]:
    """The check's refusals for a folder that holds the set's logs and only `rows` as its manifest."""
    shutil.copytree(SET21 / "logs", dest / "logs")
    return CHECK["problems"](rows, banned, dest)


def test_the_committed_set_passes_and_set_20_is_excluded() -> None:
    banned = CHECK["excluded"]()
    set20 = (SET21.parent / "redteam20" / "manifest.jsonl").read_text().splitlines()
    assert len(ROWS) >= 25 and 3 * len(ONE) <= len(ROWS)
    assert CHECK["problems"](ROWS, banned) == []
    assert {json.loads(ln)["project"].lower() for ln in set20 if ln.strip()} <= banned
    assert not {r["project"].lower() for r in ROWS} & banned


def test_a_third_of_one_line_logs_is_allowed(tmp_path: Path) -> None:
    assert _copy_and_check(ONE[:1] + MULTI[:2], set(), tmp_path) == []


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_copy_broken_one_way_is_refused_for_that_reason_alone(name: str, tmp_path: Path) -> None:
    rows, banned, words = BREAKS[name]()
    found = _copy_and_check(rows, banned, tmp_path)
    assert len(found) == 1 and words in found[0]
