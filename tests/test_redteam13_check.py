"""Red-team set 13's check (issue 45): the committed set has no problems; a root_line missing from its log, a second
log from one project and too many one-line logs are refused; a project that set 12 already holds is excluded."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

SET13 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam13"


def _check() -> dict:
    return runpy.run_path(str(SET13 / "check_set.py"))


def _rows(folder: Path) -> list[dict]:
    return [json.loads(ln) for ln in (folder / "manifest.jsonl").read_text().splitlines() if ln.strip()]


def _copy_logs(rows: list[dict], dest: Path) -> None:
    for r in rows:
        target = dest / "logs" / f"{r['id']}.log"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SET13 / "logs" / f"{r['id']}.log", target)


def test_committed_set_has_no_problems() -> None:
    check = _check()
    rows = _rows(SET13)
    assert len(rows) >= 25
    assert check["problems"](rows, check["excluded"]()) == []


def test_a_root_line_not_in_its_log_is_refused(tmp_path: Path) -> None:
    row = dict(_rows(SET13)[0], root_line="a line that no log of this set holds")
    _copy_logs([row], tmp_path)
    found = _check()["problems"]([row], set(), tmp_path)
    assert found == [f"{row['id']}: root_line is not a substring of the log"]


def test_a_second_log_from_one_project_is_refused(tmp_path: Path) -> None:
    first, second = _rows(SET13)[:2]
    second = dict(second, project=first["project"].upper())
    _copy_logs([first, second], tmp_path)
    found = _check()["problems"]([first, second], set(), tmp_path)
    assert found == [f"{second['id']}: a second log from {second['project']}"]


def test_more_than_a_third_of_one_line_logs_is_refused(tmp_path: Path) -> None:
    check = _check()
    rows = _rows(SET13)
    single = [r for r in rows if r["id"] in set(check["one_line_logs"](rows))]
    longer = [r for r in rows if r not in single]
    _copy_logs(single[:2] + longer[:3], tmp_path)
    assert check["problems"](single[:1] + longer[:2], set(), tmp_path) == []
    found = check["problems"](single[:2] + longer[:3], set(), tmp_path)
    assert len(found) == 1 and found[0].startswith("2 of 5 logs are one line: more than a third")


def test_a_set_12_project_is_excluded() -> None:
    excluded = _check()["excluded"]()
    taken = _rows(SET13.parent / "redteam12")[0]["project"]
    assert taken.lower() in excluded
    assert _rows(SET13)[0]["project"].lower() not in excluded
