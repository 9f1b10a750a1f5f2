"""Red-team set 18's check (issue 45): set 17's tests of its check, pointed at set 18, plus set 17's own projects.

Set 17's test module is loaded afresh under another name and its set (folder, check, rows) replaced by set 18's, so
the same cases hold here: the committed set passes with at least 25 logs and at most a third of one-line logs; a copy
broken in one way (a root_line its log lacks, one project twice under another case, more than a third of one-line
logs, an excluded project) is refused for that reason alone. Added here: set 17's projects are excluded and set
18's are not."""

from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path

SET18 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam18"
_SPEC = importlib.util.spec_from_file_location("redteam17_cases_on_set18",
                                               Path(__file__).resolve().parent / "test_redteam17_check.py")
CASES = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(CASES)
CASES.SET17 = SET18  # the cases read the set's folder, check, rows and one-line split from these names
CASES.CHECK = runpy.run_path(str(SET18 / "check_set.py"))
CASES.ROWS = [json.loads(ln) for ln in (SET18 / "manifest.jsonl").read_text().splitlines() if ln.strip()]
_SINGLE = set(CASES.CHECK["one_line_logs"](CASES.ROWS))
CASES.ONE, CASES.MULTI = ([r for r in CASES.ROWS if (r["id"] in _SINGLE) is single] for single in (True, False))

test_the_committed_set_passes = CASES.test_the_committed_set_passes_and_set_16_is_excluded
test_a_third_of_one_line_logs_is_allowed = CASES.test_a_third_of_one_line_logs_is_allowed
test_a_copy_broken_one_way_is_refused_for_that_reason_alone = (
    CASES.test_a_copy_broken_one_way_is_refused_for_that_reason_alone)


def test_set_17_is_excluded_and_set_18_is_not() -> None:
    banned = CASES.CHECK["excluded"]()
    set17 = (SET18.parent / "redteam17" / "manifest.jsonl").read_text().splitlines()
    assert {json.loads(ln)["project"].lower() for ln in set17 if ln.strip()} <= banned
    assert not {r["project"].lower() for r in CASES.ROWS} & banned
