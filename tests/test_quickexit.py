"""The entry points of the heavy processes (trainer, evaluation trial, `frenzy`) end through `exit_now`: the objects
alive when the work is done are frozen out of the interpreter's last collections, and the exit code is kept."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import atexit, gc
atexit.register(lambda: print("frozen" if gc.get_freeze_count() else "not frozen", flush=True))
from tasks.quickexit import exit_now
exit_now(3)
"""


def test_exit_now_keeps_the_code_and_freezes_before_the_atexit_handlers():
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == "frozen"


@pytest.mark.parametrize("module", ["tasks/training/launch.py", "tasks/evaluation/trial.py"])
def test_each_heavy_entry_point_exits_through_exit_now(module):
    tree = ast.parse((REPO / module).read_text())
    guarded = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert guarded, module
    assert ast.unparse(guarded[0].body[-1]).startswith("exit_now("), module


CLI_PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen" if gc.get_freeze_count() else "not frozen", flush=True))
from cli.main import entry
sys.argv = ["frenzy", "presets"]
sys.exit(entry())
"""


def test_the_frenzy_script_and_python_m_cli_exit_frozen_through_entry():
    # the installed console script (pyproject) and `python -m cli` both go through cli.main:entry
    assert 'frenzy = "cli.main:entry"' in (REPO / "pyproject.toml").read_text()
    assert "sys.exit(entry())" in (REPO / "cli" / "__main__.py").read_text()
    proc = subprocess.run([sys.executable, "-c", CLI_PROBE], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "frozen"
