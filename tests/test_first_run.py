"""Issue 30, point 8: the first offline run prints no telemetry error (Prefect's usage heartbeat logged "Failed to
send telemetry" on every offline run and, on the first, raced the ephemeral server into "database is locked")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FLOW = """
import flows  # what `frenzy` and the notebook import before Prefect
from prefect import flow

@flow
def hello() -> int:
    return 1

print("result", hello())
"""


@pytest.mark.slow  # a fresh Prefect home's first flow run (about 25 s)
def test_a_first_offline_flow_run_logs_no_telemetry_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_API_URL")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(ROOT))  # a first run: a fresh database
    p = subprocess.run([sys.executable, "-c", FLOW], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "result 1" in p.stdout, out[-3000:]
    assert "telemetry" not in out.lower(), out[-3000:]
    assert "database is locked" not in out and "Traceback" not in out, out[-3000:]


def test_telemetry_stays_on_when_the_user_opts_in(tmp_path):
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "true", "PYTHONPATH": str(ROOT)}
    code = "import flows; from prefect.settings import get_current_settings as g; print(g().server.analytics_enabled)"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "True", p.stderr[-2000:]
