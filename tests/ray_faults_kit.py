"""A hard fault during `frenzy submit --executor ray`, as the user meets it: the real CLI in a subprocess on a loopback
Ray cluster (tests/ray_cluster.py), a worker node SIGKILLed or SIGSTOPped once a checkpoint has committed, and the
clock read from what the run writes (the `frenzy: node X lost` line in train.log, the first step record after it).
Shared by tests/test_ray_faults.py and benchmarks/ray_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster.ledger import Ledger
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tests.ray_cluster import fault

REPO = Path(__file__).resolve().parent.parent


@dataclass
class FaultRun:
    """One submit with one fault: what the user got and when."""

    signal: str
    victim: str = ""
    placed: list[str] = field(default_factory=list)
    committed_at_fault: int = 0
    detect_s: float | None = None
    """Fault to the lost-node line in train.log (the launcher gave up on the group)."""
    resume_s: float | None = None
    """Fault to the first step record of the resumed training."""
    rc: int | None = None
    doc: dict[str, Any] | None = None
    stdout: str = ""
    stderr: str = ""
    victim_state: tuple[str, str] = ("", "")
    pids: list[int] = field(default_factory=list)


def job_yaml(tmp: Path, steps: int, every: int) -> Path:
    t = {"seq_len": 256, "global_batch": 16,  # the plan spans two nodes (dp=2), as in issue 31
         "precision": "fp32", "steps": steps, "lr": 3e-3, "warmup_steps": 5,
         "log_every_steps": 5, "trace_every_steps": 0,
         "checkpoint": {"every_steps": every, "uri": f"file://{tmp}/ckpt", "keep": 20}}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "faulty", "model": {"preset": "gpt-tiny"}, "training": t}))
    (tmp / "small.yaml").write_text("name: small\ndatasets:\n  - {name: heldout-loss, examples: 8, mode: ppl, "
                                    "infer_s_per_example: 0.004}\n")
    return path


def _committed(tmp: Path) -> int:
    return max((m.step for m in ck.committed(Storage(f"file://{tmp}/ckpt"))), default=0)


def _steps_after(progress: Path, offset: int) -> bool:
    if not progress.exists() or progress.stat().st_size <= offset:
        return False
    with open(progress, "rb") as f:
        f.seek(offset)
        return any(b'"event": "step"' in line or b'"event":"step"' in line for line in f)


def submit_with_fault(tmp: Path, nodes: dict[str, Any], sig: int, *, at_step: int = 20, steps: int = 40,
                      every: int = 20, evaluation: str = "in-flow", timeout_s: float = 900.0,
                      env: dict[str, str] | None = None) -> FaultRun:
    """Run `frenzy submit --executor ray --json` in `tmp` (relative run and history dirs: the submitting side must
    resolve them), fault the allocation's first non-head node with `sig` once step `at_step` has committed, and
    wait for the command to finish."""
    from prefect.settings import PREFECT_API_URL

    job_yaml(tmp, steps, every)
    Ledger(str(tmp / "l.db"))  # `submit --ledger` takes an existing ledger (a mistyped path is refused)
    cmd = [sys.executable, "-m", "cli", "submit", "job.yaml", "--executor", "ray", "--ledger", str(tmp / "l.db"),
           "--evaluation", evaluation, "--suite", "small.yaml", "--device", "cpu", "--run-dir", "run",
           "--history-dir", "evals", "--max-wait", "120", "--json"]
    full_env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value() or "", "FRENZY_HOME": str(tmp / "home"),
                "PYTHONPATH": str(REPO), **(env or {})}
    run = FaultRun(signal=signal.Signals(sig).name)
    out_f, err_f = open(tmp / "stdout", "w+"), open(tmp / "stderr", "w+")  # noqa: SIM115 - read back below
    p = subprocess.Popen(cmd, cwd=tmp, env=full_env, stdout=out_f, stderr=err_f)
    log, progress = tmp / "run" / "train.log", tmp / "run" / "progress.jsonl"
    deadline, t_fault, offset = time.monotonic() + timeout_s, None, 0
    try:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            if t_fault is None:
                if _committed(tmp) >= at_step:
                    [alloc] = Ledger(str(tmp / "l.db")).allocations()
                    run.placed = [n.node for n in alloc.nodes]
                    run.victim = next(n for n in run.placed if n != "head")
                    run.committed_at_fault = _committed(tmp)
                    t_fault = time.monotonic()
                    run.pids = fault(nodes[run.victim], sig)
                continue
            if run.detect_s is None and log.exists() and f"node {run.victim}" in log.read_text(errors="replace"):
                run.detect_s = time.monotonic() - t_fault
                offset = progress.stat().st_size if progress.exists() else 0
            elif run.detect_s is not None and run.resume_s is None and _steps_after(progress, offset):
                run.resume_s = time.monotonic() - t_fault
        if p.poll() is None:
            p.kill()
        run.rc = p.wait()
    finally:
        out_f.seek(0), err_f.seek(0)
        run.stdout, run.stderr = out_f.read(), err_f.read()
        out_f.close(), err_f.close()
    if run.rc == 0:
        run.doc = json.loads(run.stdout)  # the whole stdout: a clean --json is exactly one document
    if run.victim:
        state = next((n for n in Ledger(str(tmp / "l.db")).nodes() if n.name == run.victim), None)
        run.victim_state = (state.state, state.reason) if state else ("", "")
    return run
