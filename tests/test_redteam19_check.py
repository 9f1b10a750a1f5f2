"""Red-team set 19's check (issue 45): the committed set passes it with 25 logs or more and draws on no project of
set 17 or earlier; a copy that holds one fault (a root_line no log holds, one project twice under another case, two
one-line logs in five, a project banned on top) gets exactly one refusal, and the refusal names that fault."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam19"
CHECK = runpy.run_path(str(HERE / "check_set.py"))


def _manifest(folder: Path) -> list[dict]:
    with (folder / "manifest.jsonl").open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _single_and_multi() -> tuple[list[dict], list[dict]]:
    """Set 19's rows split into the one-line logs and the rest."""
    rows = _manifest(HERE)
    single = set(CHECK["one_line_logs"](rows))
    return [r for r in rows if r["id"] in single], [r for r in rows if r["id"] not in single]


def _refusals(rows: list[dict], banned: set[str], folder: Path) -> list[str]:
    """What the check says of `folder` holding set 19's logs with `rows` as its manifest."""
    shutil.copytree(HERE / "logs", folder / "logs")
    return CHECK["problems"](rows, banned, folder)


def _faulty(fault: str) -> tuple[list[dict], set[str], str]:
    """(rows, projects banned on top, words the one refusal must hold) for a copy with `fault` in it."""
    single, multi = _single_and_multi()
    first, second = multi[0], multi[1]
    return {
        "root_line": ([{**first, "root_line": "this line is in none of set 19's logs"}], set(),
                      "root_line is not a substring of the log"),
        "twice": ([first, {**second, "project": first["project"].upper()}], set(), "a second log from"),
        "single_share": (single[:2] + multi[:3], set(), "2 of 5 logs are one line: more than a third"),
        "banned": ([first, second], {second["project"].lower()}, second["project"]),
    }[fault]


def test_set_19_passes_and_holds_no_project_of_set_17_or_before() -> None:
    rows, banned = _manifest(HERE), CHECK["excluded"]()
    single, _ = _single_and_multi()
    set17 = {r["project"].lower() for r in _manifest(HERE.parent / "redteam17")}
    assert len(rows) >= 25 and 3 * len(single) <= len(rows)
    assert set17 <= banned and not banned & {r["project"].lower() for r in rows}
    assert CHECK["problems"](rows, banned) == []


def test_one_single_line_log_in_three_is_accepted(tmp_path: Path) -> None:
    single, multi = _single_and_multi()
    assert _refusals(single[:1] + multi[:2], set(), tmp_path) == []


@pytest.mark.parametrize("fault", ["root_line", "twice", "single_share", "banned"])
def test_a_copy_with_one_fault_gets_one_refusal_that_names_it(fault: str, tmp_path: Path) -> None:
    rows, banned, words = _faulty(fault)
    found = _refusals(rows, banned, tmp_path)
    assert len(found) == 1 and words in found[0]
