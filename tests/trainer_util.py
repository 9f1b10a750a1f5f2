"""Helpers for tests that run the real trainer as a subprocess (and kill it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from tasks.jobspec import JobSpec, parse_job
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage


def tiny_job(uri: str, steps: int = 60, every: int = 10, **training: object) -> JobSpec:
    t = {"seq_len": 64, "global_batch": 8, "micro_batch": 4, "precision": "fp32", "steps": steps, "lr": 3e-3,
         "warmup_steps": 5, "log_every_steps": 1, "trace_every_steps": 0,
         "checkpoint": {"every_steps": every, "uri": uri, "keep": 3}, **training}
    return parse_job({"name": "t", "model": {"preset": "gpt-tiny"}, "training": t})


def start(job: JobSpec, run_dir: Path, resume: bool = False, env: dict | None = None) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.json").write_text(job.model_dump_json())
    cmd = [sys.executable, "-m", "tasks.training.launch", "--job", str(run_dir / "job.json"), "--run-dir",
           str(run_dir), "--device", "cpu", "--threads", "1"]
    if resume:
        cmd.append("--resume")
    log = open(run_dir / "train.log", "ab")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def run(job: JobSpec, run_dir: Path, resume: bool = False, env: dict | None = None, timeout: float = 300) -> dict:
    p = start(job, run_dir, resume, env)
    rc = p.wait(timeout=timeout)
    assert rc == 0, (run_dir / "train.log").read_text()[-3000:]
    return json.loads((run_dir / "result.json").read_text())


def progress(run_dir: Path) -> list[dict]:
    f = run_dir / "progress.jsonl"
    if not f.exists():
        return []
    return [json.loads(ln) for ln in f.read_text().splitlines() if ln.endswith("}")]


def last_step(run_dir: Path) -> int:
    steps = [r["step"] for r in progress(run_dir) if r["event"] == "step"]
    return steps[-1] if steps else 0


def wait_for(pred, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def final_state(uri: str, step: int) -> dict[str, torch.Tensor]:
    storage = Storage(uri)
    m = ck.read_manifest(storage, step)
    assert m is not None, f"no manifest for step {step} at {uri}"
    return ck.read_shard(storage, m.shards[0])


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), f"{k} differs"


TRAINED_STEPS, TRAINED_EVERY = 20, 10
"""The session's trained gpt-tiny (conftest's `tiny_trained`): `tiny_job(uri, steps=20, every=10)`, steps 10 and 20."""


def train_shared(d: Path) -> None:
    """Train the session's gpt-tiny once: checkpoints under `d/ckpt`, its run directory `d/run`."""
    run(tiny_job(f"file://{d}/ckpt", steps=TRAINED_STEPS, every=TRAINED_EVERY), d / "run")


def copy_trained(src: Path, dst: Path, run_dir: str = "run") -> str:
    """A copy of the session's trained run for a test that changes it or names it: `dst/ckpt` and `dst/RUN_DIR`, the run
    directory's records (job.json, result.json, progress) pointing at the copy's checkpoints. What training the same
    job there would leave (training is deterministic), without the trainer's start-up; returns the checkpoint URI."""
    shutil.copytree(src / "ckpt", dst / "ckpt")
    shutil.copytree(src / "run", dst / run_dir)
    for f in (dst / run_dir).iterdir():
        if f.is_file() and f.suffix in (".json", ".jsonl"):
            f.write_text(f.read_text().replace(f"file://{src}/ckpt", f"file://{dst}/ckpt"))
    return f"file://{dst}/ckpt"
