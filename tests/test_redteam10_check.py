"""Red-team set 10's check: it passes on the committed set and refuses a log under 100 lines (issue 45)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

SET10 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam10"


def _check(here: Path | None = None) -> ModuleType:
    spec = importlib.util.spec_from_file_location("redteam10_check_set", SET10 / "check_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if here is not None:
        module.HERE = here
    return module


def _row(log_id: str) -> dict:
    return {"id": log_id, "project": f"example/{log_id}", "url": "https://example.invalid", "type": "TypeError",
            "category": "script", "restartable": False, "root_line": "TypeError: boom", "label_source": "test",
            "family": "user-env-code"}


def _write_log(here: Path, log_id: str, lines: int) -> None:
    (here / "logs").mkdir(parents=True, exist_ok=True)
    # a progress bar that rewrites one line with carriage returns must not count as many lines
    body = ["step\r" * 50 + "step"] + [f"line {i}" for i in range(lines - 2)] + ["TypeError: boom"]
    (here / "logs" / f"{log_id}.log").write_text("\n".join(body) + "\n")


def test_committed_set_passes() -> None:
    check = _check()
    rows = [json.loads(ln) for ln in (SET10 / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    assert len(rows) >= 9
    assert check.problems(rows, check.excluded()) == []


def test_refuses_a_log_under_100_lines(tmp_path: Path) -> None:
    check = _check(tmp_path)
    _write_log(tmp_path, "short", 99)
    _write_log(tmp_path, "long", 100)
    assert check.problems([_row("short")], set()) == ["short: 99 lines, under 100: not a long log"]
    assert check.problems([_row("long")], set()) == []
