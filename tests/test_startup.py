"""Start-up: `frenzy --help` and the light commands import only what they need (no torch, no Prefect), as a user
runs them: a fresh interpreter, the real command line, the modules read from `python -X importtime`. The times
themselves are a benchmark's (benchmarks/startup.py), not a test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "prefect", "pandas", "matplotlib", "pyarrow", "sqlalchemy", "ray", "transformers"}


def imported(args: list[str], cwd: Path) -> tuple[set[str], subprocess.CompletedProcess]:
    """The top-level packages a `frenzy ARGS` process imported, and the finished process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    mods = {ln.split("|")[-1].strip().split(".")[0] for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    return mods, proc


def test_help_imports_nothing_but_the_command_table(tmp_path: Path) -> None:
    mods, proc = imported(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "submit" in proc.stdout and "diagnose" in proc.stdout
    assert not mods & (HEAVY | {"pydantic", "numpy", "yaml"}), sorted(mods & (HEAVY | {"pydantic", "numpy", "yaml"}))
    assert not mods & {"tasks", "cluster"}, "the command table alone answers --help"


@pytest.mark.parametrize("args", [
    ["plan", str(REPO / "examples" / "jobs" / "tiny.yaml"), "--json"],
    ["simulate", "--trace", "newworkload:6", "--policy", "fcfs", "--policy", "has", "--json"],
    ["diagnose", str(REPO / "tests" / "data" / "diagnosis" / "pytorch-16417-oom.log"), "--json"],
    ["plan", "--help"],
], ids=["plan", "simulate", "diagnose", "plan-help"])
def test_light_commands_import_no_torch_or_prefect(args: list[str], tmp_path: Path) -> None:
    mods, proc = imported(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not mods & HEAVY, f"frenzy {args[0]} imported {sorted(mods & HEAVY)}"


@pytest.mark.parametrize("module", ["tasks.pipeline.request", "tasks.training.request", "flows.submit"])
def test_the_submit_records_and_flow_import_no_torch(module: str, tmp_path: Path) -> None:
    """`frenzy submit` and `frenzy train` read requests and results, and drive trainers and evaluations that are
    processes of their own; torch loads where a model runs (an in-flow evaluation), not for the records."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    mods = {ln.split("|")[-1].strip().split(".")[0] for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert module.split(".")[0] in mods  # the control: the import was seen
    assert not mods & {"torch", "transformers", "pandas"}, f"{module} imported {sorted(mods & {'torch', 'transformers', 'pandas'})}"


def test_an_untraced_trainers_end_merges_no_trace_and_imports_no_pandas(tmp_path: Path) -> None:
    """Every trainer merges its op trace as it ends (`merge_traces`); one with `trace_every_steps: 0` has no rank
    files, and imported pandas for nothing (0.3 CPU s per trainer process, most of the suite's trainers). A traced
    run's merge: test_trainer_parts and the submit tests that check the straggler analysis."""
    code = ("import json, sys\nfrom pathlib import Path\nfrom tasks.training.optrace import merge_traces\n"
            "assert merge_traces(Path(sys.argv[1]), 'r', 1, 1, 1) is None\nprint(json.dumps(sorted(sys.modules)))")
    (tmp_path / "trace").mkdir()
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "trace")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    mods = {m.split(".")[0] for m in json.loads(proc.stdout)}
    assert "tasks" in mods and "pandas" not in mods, sorted(mods & HEAVY)


def test_every_command_is_built_by_the_module_the_table_names() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(COMMANDS)
    for name, sp in sub.choices.items():
        assert callable(sp.get_default("fn")), f"{name}: its module registered no handler"
        assert sp.get_default("fn").__module__ == COMMANDS[name][0]


def test_one_command_builds_only_its_own_arguments() -> None:
    sub = next(a for a in build_parser("plan")._actions if a.dest == "command")
    assert sub.choices["plan"].get_default("fn") is not None
    assert sub.choices["submit"].get_default("fn") is None  # listed, not built
