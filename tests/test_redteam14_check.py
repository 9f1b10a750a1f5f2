"""Red-team set 14's check (issue 45): the committed set passes; a broken copy of it is refused for the right reason
(a root_line missing from its log, a second log from one project, too many one-line logs); set 13's projects are
excluded and set 14's are not."""

from __future__ import annotations

import json
import runpy
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DIAG = Path(__file__).resolve().parent / "data" / "diagnosis"
CHECK = runpy.run_path(str(DIAG / "redteam14" / "check_set.py"))
ROWS = [json.loads(ln) for ln in (DIAG / "redteam14" / "manifest.jsonl").read_text().splitlines() if ln.strip()]
SINGLE = set(CHECK["one_line_logs"](ROWS))
ONE = [r for r in ROWS if r["id"] in SINGLE]
LONGER = [r for r in ROWS if r["id"] not in SINGLE]


def _copy_logs(rows: list[dict], dest: Path) -> None:
    for r in rows:
        (dest / "logs" / r["id"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DIAG / "redteam14" / "logs" / f"{r['id']}.log", dest / "logs" / f"{r['id']}.log")


def _missing_root(rows: list[dict]) -> list[dict]:
    return [dict(rows[0], root_line="a line that no log of set 14 holds")]


def _same_project(rows: list[dict]) -> list[dict]:
    return [rows[0], dict(rows[1], project=rows[0]["project"].swapcase())]


def _mostly_one_line(_rows: list[dict]) -> list[dict]:
    return ONE[:2] + LONGER[:3]


BROKEN: list[tuple[Callable[[list[dict]], list[dict]], str]] = [
    (_missing_root, "root_line is not a substring of the log"),
    (_same_project, "a second log from"),
    (_mostly_one_line, "2 of 5 logs are one line: more than a third"),
]


def test_committed_set_passes() -> None:
    assert len(ROWS) >= 25
    assert 3 * len(ONE) <= len(ROWS)
    assert CHECK["problems"](ROWS, CHECK["excluded"]()) == []


@pytest.mark.parametrize(("breaks", "reason"), BROKEN)
def test_a_broken_copy_is_refused(tmp_path: Path, breaks: Callable[[list[dict]], list[dict]], reason: str) -> None:
    rows = breaks(LONGER)
    _copy_logs(rows, tmp_path)
    found = CHECK["problems"](rows, set(), tmp_path)
    assert len(found) == 1 and reason in found[0]


def test_a_healthy_copy_is_not_refused(tmp_path: Path) -> None:
    rows = ONE[:1] + LONGER[:2]
    _copy_logs(rows, tmp_path)
    assert CHECK["problems"](rows, set(), tmp_path) == []


def test_set_13_projects_are_excluded_and_set_14_projects_are_not() -> None:
    excluded = CHECK["excluded"]()
    set13 = (DIAG / "redteam13" / "manifest.jsonl").read_text().splitlines()
    assert all(json.loads(ln)["project"].lower() in excluded for ln in set13 if ln.strip())
    assert not {r["project"].lower() for r in ROWS} & excluded
