"""What `frenzy submit` / `frenzy demo` print on the terminal (issue 30, points 4 and 7): the cause, in one
paragraph, with the tracebacks left to the logs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import yaml

from cli.console import OneLineFormatter, interrupted_message
from tests.trainer_util import run as train_run
from tests.trainer_util import tiny_job


def test_an_infeasible_job_is_refused_with_marps_message_alone(tmp_path):
    """Before: MARP's message came after about 60 lines of Prefect traceback."""
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "huge", "model": {"preset": "llama3-70b"},
                                                       "training": {"global_batch": 8}}))
    env = {**os.environ, "FRENZY_HOME": str(tmp_path / "home")}
    from cluster.ledger import Ledger

    Ledger(str(tmp_path / "l.db"))  # `submit --ledger` takes an existing ledger (a mistyped path is refused)
    p = subprocess.run([sys.executable, "-m", "cli", "submit", "job.yaml", "--ledger", str(tmp_path / "l.db")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frenzy submit: error: ") and "GiB per GPU" in lines[0], p.stderr


def test_console_records_lose_their_traceback_but_other_handlers_keep_it():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "task failed", None, sys.exc_info())
    line = OneLineFormatter(logging.Formatter("%(levelname)s %(message)s")).format(rec)
    assert line == "ERROR task failed (traceback in the flow run's logs)"
    assert "Traceback" in logging.Formatter().format(rec)  # the API log handler still sends it


def test_the_interrupt_line_names_the_newest_committed_step(tmp_path):
    root = f"file://{tmp_path}/ckpt"
    assert interrupted_message("demo", root) == ("frenzy demo: stopped before the first checkpoint was committed; "
                                                 "rerun the same command to resume")
    train_run(tiny_job(root, steps=20, every=10), Path(tmp_path / "run"))
    assert interrupted_message("submit", root) == (f"frenzy submit: stopped at step 20, committed under {root}; "
                                                   "rerun the same command to resume")
