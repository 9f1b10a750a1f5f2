"""Red-team set 15's check (issue 45): the committed set passes; a broken copy is refused for the right reason (a
root_line missing from its log, a second log from one project, too many one-line logs); set 14's projects are
excluded and set 15's are not."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

SET15 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam15"
CHECK = runpy.run_path(str(SET15 / "check_set.py"))
ROWS = [json.loads(ln) for ln in (SET15 / "manifest.jsonl").read_text().splitlines() if ln.strip()]
SINGLE = set(CHECK["one_line_logs"](ROWS))


def _variant(kind: str) -> list[dict]:
    """A small copy of the set broken in one way (or not broken, for kind 'healthy')."""
    longer = [r for r in ROWS if r["id"] not in SINGLE]
    single = [r for r in ROWS if r["id"] in SINGLE]
    variants = {
        "root": [dict(longer[0], root_line="a line that no log of set 15 holds")],
        "twice": [longer[0], dict(longer[1], project=longer[0]["project"].upper())],
        "one-line": single[:2] + longer[:3],
        "healthy": single[:1] + longer[:2],
    }
    return variants[kind]


def _problems_in_copy(rows: list[dict], dest: Path) -> list[str]:
    for r in rows:
        target = dest / "logs" / f"{r['id']}.log"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SET15 / "logs" / f"{r['id']}.log", target)
    return CHECK["problems"](rows, set(), dest)


def test_committed_set_passes_with_at_most_a_third_one_line() -> None:
    assert len(ROWS) >= 25 and 3 * len(SINGLE) <= len(ROWS)
    assert CHECK["problems"](ROWS, CHECK["excluded"]()) == []


@pytest.mark.parametrize(("kind", "reason"), [
    ("root", "root_line is not a substring of the log"),
    ("twice", "a second log from"),
    ("one-line", "2 of 5 logs are one line: more than a third"),
])
def test_a_broken_copy_is_refused_for_its_reason(tmp_path: Path, kind: str, reason: str) -> None:
    found = _problems_in_copy(_variant(kind), tmp_path)
    assert len(found) == 1 and reason in found[0]


def test_a_healthy_copy_is_refused_nothing(tmp_path: Path) -> None:
    assert _problems_in_copy(_variant("healthy"), tmp_path) == []


def test_set_14_is_excluded_and_set_15_is_not() -> None:
    banned = CHECK["excluded"]()
    set14 = (SET15.parent / "redteam14" / "manifest.jsonl").read_text().splitlines()
    assert {json.loads(ln)["project"].lower() for ln in set14 if ln.strip()} <= banned
    assert not {r["project"].lower() for r in ROWS} & banned
