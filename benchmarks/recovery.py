"""Recovery time: from a killed trainer to training progress again, through the whole `frenzy submit` path.

A gpt-tiny job runs under `frenzy submit` (ephemeral Prefect, SQLite ledger, CPU); once it has committed a
checkpoint the trainer process is killed with SIGKILL (what the OOM killer or a lost node does). The flow sees the
failure, diagnoses the log (`ChildFailed`, restartable), releases and re-places the job, relaunches the trainer,
which resumes from the newest verified checkpoint. Measured: kill -> the resumed trainer's first step record
(`--runs` times), and the steps lost (re-done) against the last commit.

    python benchmarks/recovery.py        # writes benchmarks/results/recovery.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.training import checkpoint as ck  # noqa: E402
from tasks.training.launch import request_stop  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402


def one(tmp: Path) -> dict:
    job = {"name": "recbench", "model": {"preset": "gpt-tiny"},
           "training": {"seq_len": 64, "global_batch": 8, "precision": "fp32", "steps": 100000, "warmup_steps": 5,
                        "log_every_steps": 1, "trace_every_steps": 0,
                        "checkpoint": {"every_steps": 20, "uri": f"file://{tmp}/ckpt", "keep": 3}}}
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    env = {**os.environ, "FRENZY_HOME": str(tmp / "home")}
    env.pop("PREFECT_API_URL", None)
    p = subprocess.Popen([sys.executable, "-m", "cli", "submit", "job.yaml", "--ledger", str(tmp / "l.db"),
                          "--evaluation", "off", "--device", "cpu", "--run-dir", str(tmp / "run"), "--json"],
                         cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run, storage = tmp / "run", Storage(f"file://{tmp}/ckpt")
    while not ck.committed(storage):
        if p.poll() is not None:
            raise RuntimeError(p.stderr.read()[-3000:])
        time.sleep(0.05)
    pid = int(subprocess.run(["pgrep", "-f", "--", f"tasks.training.launch --job {run}"], capture_output=True,
                             text=True).stdout.split()[0])
    progress = run / "progress.jsonl"
    before = len(progress.read_text().splitlines())
    last_step = max(json.loads(x)["step"] for x in progress.read_text().splitlines() if '"event": "step"' in x)
    committed = max(m.step for m in ck.committed(storage))
    os.kill(pid, signal.SIGKILL)
    t_kill = time.monotonic()
    first = None
    while first is None:
        if p.poll() is not None:
            raise RuntimeError(p.stderr.read()[-3000:])
        recs = [json.loads(x) for x in progress.read_text().splitlines()[before:] if x.endswith("}")]
        if any(r["event"] == "resume" for r in recs):
            first = next((r for r in recs if r["event"] == "step"), None)
        time.sleep(0.02)
    t_progress = time.monotonic()
    request_stop(run)
    out, err = p.communicate(timeout=300)
    if p.returncode:
        raise RuntimeError(err[-3000:])
    res = json.loads(out)
    return {"kill_to_progress_s": t_progress - t_kill, "resumed_from": res["train"]["resumed_from_step"],
            "last_step_before_kill": last_step, "committed_before_kill": committed,
            "steps_redone": last_step - res["train"]["resumed_from_step"],
            "diagnosis": res["recoveries"][0]["diagnosis"]["type"], "action": res["recoveries"][0]["action"]["kind"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for i in range(a.runs):
        tmp = Path(tempfile.mkdtemp(prefix="frenzy-recbench-"))
        try:
            rows.append(one(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"run {i + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    t = sorted(r["kill_to_progress_s"] for r in rows)
    lost_free = sum(r["resumed_from"] >= r["committed_before_kill"] for r in rows)
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
           "no GPU", "command": "python benchmarks/recovery.py " + " ".join(sys.argv[1:]), "runs": rows,
           "kill_to_progress_s_min_median_max": [t[0], statistics.median(t), t[-1]]}
    out = REPO / "benchmarks" / "results"
    (out / "recovery.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Recovery from a killed trainer ({doc['date']}, {doc['machine']})", "", f"`{doc['command']}`", "",
             "| run | diagnosis | action | kill -> progress again | resumed from | last step before the kill | "
             "steps re-done |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {i + 1} | {r['diagnosis']} | {r['action']} | {r['kill_to_progress_s']:.1f} s | {r['resumed_from']} | "
              f"{r['last_step_before_kill']} | {r['steps_redone']} |" for i, r in enumerate(rows)]
    lines += ["", f"Kill to training progress again: min {t[0]:.1f} s / median {statistics.median(t):.1f} s / max "
              f"{t[-1]:.1f} s (the flow's 2 s poll of the trainer, the diagnosis, release and re-placement through "
              "the ledger, a new trainer process: Python, torch, the model, the checkpoint). Runs that resumed from "
              f"the newest step committed before the kill (or a later one): {lost_free} of {len(rows)} (no committed "
              "step lost); the steps after that commit are re-done."]
    (out / "recovery.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
