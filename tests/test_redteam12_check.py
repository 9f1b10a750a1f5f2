"""Red-team set 12's check (issue 45): the committed set has no problems, one of its own logs cut to 99 lines is
refused, and a project that set 11 already holds is excluded."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import ModuleType

SET12 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam12"


def _check(here: Path = SET12) -> ModuleType:
    """Set 10's check module as set 12's `check_set.py` hands it out, pointed at `here`."""
    return runpy.run_path(str(SET12 / "check_set.py"))["checks"](here)


def _rows(folder: Path) -> list[dict]:
    return [json.loads(ln) for ln in (folder / "manifest.jsonl").read_text().splitlines() if ln.strip()]


def test_committed_set_has_no_problems() -> None:
    check = _check()
    rows = _rows(SET12)
    assert rows and check.problems(rows, check.excluded()) == []


def test_a_set_log_cut_to_99_lines_is_refused(tmp_path: Path) -> None:
    row = next(r for r in _rows(SET12) if r["id"] == "tarseus__eam-rl4co-train-out")
    lines = (SET12 / "logs" / f"{row['id']}.log").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{row['id']}.log").write_text("".join(lines[-99:]), encoding="utf-8")
    found = _check(tmp_path).problems([row], set())
    assert found == [f"{row['id']}: 99 lines, under 100: not a long log"]


def test_a_set_11_project_is_excluded() -> None:
    excluded = _check().excluded()
    taken = _rows(SET12.parent / "redteam11")[0]["project"]
    assert taken.lower() in excluded
    assert "heisenyan/openpi" not in excluded
