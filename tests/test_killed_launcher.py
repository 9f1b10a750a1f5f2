"""`kill -9` of `frenzy train` after its first commit, then `frenzy train --resume` at once (issue 28): the orphaned
rank still holds the checkpoint root's writer lease; the resume waits for it (a progress line says so, bounded by the
orphan grace), takes over when it is gone and continues from the newest commit, instead of exiting 2 ("two
writers"). The orphan here hangs (a rank stuck in I/O or a collective), so the wait lasts until its hard exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tasks.training import checkpoint as ck
from tasks.training.storage import Storage

STEPS = 30


def _cli(args: list[str], cwd: Path, env: dict[str, str], err: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=cwd, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=open(cwd / err, "wb"), text=True, start_new_session=True)


@pytest.mark.slow  # about 30 s of training and waiting
def test_a_resume_right_after_a_killed_launcher_waits_for_the_orphan_and_continues(tmp_path):
    t = {"seq_len": 64, "global_batch": 8, "precision": "fp32", "steps": STEPS, "lr": 3e-3, "warmup_steps": 5,
         "log_every_steps": 1, "checkpoint": {"every_steps": 5, "uri": f"file://{tmp_path}/ckpt", "keep": 5}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "killed", "model": {"preset": "gpt-tiny"},
                                                       "training": t}))
    # the orphan hangs at step 12 (after the commit of step 10) and exits hard 20 s after its launcher died: long
    # enough that the resume (a fresh interpreter importing torch, slow on a loaded CI host) still finds it alive
    env = {"FRENZY_FAULT_HANG": "12", "FRENZY_ORPHAN_GRACE_S": "20"}
    args = ["train", "job.yaml", "--run-dir", str(tmp_path / "run"), "--device", "cpu", "--threads", "1"]
    first = _cli(args, tmp_path, env, "first.err")
    deadline = time.monotonic() + 180
    while not any(m.step >= 10 for m in ck.committed(Storage(f"file://{tmp_path}/ckpt"))):
        assert first.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint committed in time"
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)  # the launcher only: its rank is orphaned, still holding the lease
    first.wait(timeout=30)
    again = _cli([*args, "--resume", "--json"], tmp_path, env, "again.err")
    out, _ = again.communicate(timeout=300)
    err = (tmp_path / "again.err").read_text()
    assert again.returncode == 0, err[-3000:]
    assert "an orphan of launcher" in err and f"launcher {first.pid} (dead)" in err  # the progress line
    assert "taking over" in err
    res = json.loads(out)
    assert res["resumed_from_step"] == 10 and res["final_step"] == STEPS
