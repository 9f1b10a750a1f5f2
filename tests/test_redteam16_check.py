"""Red-team set 16's check (issue 45): the committed set passes with at least 25 logs; copies of it broken in one
way each (a root_line its log lacks, one project twice under another case, too many one-line logs, an excluded
project) are refused for that reason alone; set 15's projects are excluded and set 16's are not."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

SET16 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam16"
CHECK = runpy.run_path(str(SET16 / "check_set.py"))
ROWS = [json.loads(ln) for ln in (SET16 / "manifest.jsonl").read_text().splitlines() if ln.strip()]
ONE_LINE = set(CHECK["one_line_logs"](ROWS))
LONG = [r for r in ROWS if r["id"] not in ONE_LINE]
SHORT = [r for r in ROWS if r["id"] in ONE_LINE]


def _refusals(rows: list[dict], dest: Path, banned: frozenset[str] = frozenset()) -> list[str]:
    """What the check refuses in a folder holding only `rows` and their logs."""
    for row in rows:
        log = dest / "logs" / f"{row['id']}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SET16 / "logs" / f"{row['id']}.log", log)
    return CHECK["problems"](rows, set(banned), dest)


def test_the_committed_set_passes() -> None:
    assert len(ROWS) >= 25
    assert 3 * len(ONE_LINE) <= len(ROWS)
    assert CHECK["problems"](ROWS, CHECK["excluded"]()) == []


def test_a_root_line_missing_from_its_log_is_refused(tmp_path: Path) -> None:
    found = _refusals([dict(LONG[0], root_line="no log of set 16 holds this line")], tmp_path)
    assert len(found) == 1 and "root_line is not a substring of the log" in found[0]


def test_one_project_twice_is_refused_whatever_its_case(tmp_path: Path) -> None:
    found = _refusals([LONG[0], dict(LONG[1], project=LONG[0]["project"].swapcase())], tmp_path)
    assert len(found) == 1 and "a second log from" in found[0]


def test_more_than_a_third_of_one_line_logs_is_refused(tmp_path: Path) -> None:
    assert _refusals(SHORT[:1] + LONG[:2], tmp_path / "third") == []
    found = _refusals(SHORT[:2] + LONG[:3], tmp_path / "two_of_five")
    assert len(found) == 1 and "2 of 5 logs are one line: more than a third" in found[0]


def test_an_excluded_project_is_refused(tmp_path: Path) -> None:
    found = _refusals(LONG[:2], tmp_path, frozenset({LONG[1]["project"].lower()}))
    assert len(found) == 1 and LONG[1]["project"] in found[0]


def test_set_15_is_excluded_and_set_16_is_not() -> None:
    banned = CHECK["excluded"]()
    set15 = (SET16.parent / "redteam15" / "manifest.jsonl").read_text().splitlines()
    assert {json.loads(ln)["project"].lower() for ln in set15 if ln.strip()} <= banned
    assert not {r["project"].lower() for r in ROWS} & banned
