"""Red-team set 11's check (issue 45): it passes on the committed set, refuses a short log, and an earlier set's
check ignores the lists of later sets (set 11's list names set 10's projects on purpose)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SET11 = Path(__file__).resolve().parent / "data" / "diagnosis" / "redteam11"


def _check(here: Path = SET11) -> ModuleType:
    spec = importlib.util.spec_from_file_location("redteam11_check_set", SET11 / "check_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.set10_checks(here)


def test_committed_set_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _check().main() == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: ") and "all of 100+ lines" in out


def test_refuses_a_log_under_100_lines(tmp_path: Path) -> None:
    check = _check(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "short.log").write_text("".join(f"line {i}\n" for i in range(98)) + "KeyError: 'x'\n")
    row = {"id": "short", "project": "example/short", "url": "https://example.invalid", "type": "KeyError",
           "category": "script", "restartable": False, "root_line": "KeyError: 'x'", "label_source": "test",
           "family": "user-env-code"}
    assert check.problems([row], set()) == ["short: 99 lines, under 100: not a long log"]


def _write_set(diag: Path, name: str, projects: list[str], listed: list[str]) -> Path:
    folder = diag / name
    folder.mkdir()
    (folder / "manifest.jsonl").write_text("".join(json.dumps({"project": p}) + "\n" for p in projects))
    (folder / "excluded_projects.txt").write_text("".join(p + "\n" for p in listed))
    return folder


def test_only_earlier_sets_exclude_projects(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "manifest.jsonl").write_text(json.dumps({"project": "corpus/one"}) + "\n")
    _write_set(tmp_path, "redteam4", ["earlier/own"], ["earlier/listed"])
    here = _write_set(tmp_path, "redteam5", ["this/own"], ["earlier/listed", "this/own"])
    _write_set(tmp_path, "redteam6", ["later/own"], ["earlier/listed", "this/own", "later/own"])
    check = _check(here)
    check.DIAG = tmp_path
    assert check.excluded() == {"corpus/one", "earlier/own", "earlier/listed"}
