"""What the default spike guard costs an ordinary run, and whether it still catches bad batches.

What runs is what a user runs: `frenzy train job.yaml --json` (one CPU rank, gpt-tiny, 1,500 steps, a checkpoint every
100 steps, the default `training.spike` settings), at the default learning rate and at 1e-3, two seeds each. Three
batches are replaced by random bytes (`data.inject_spike_steps`: steps 400, 800, 1200): those are the spikes to catch.
Every other flagged step is a false alarm; a false alarm that rolls back re-trains the steps since its checkpoint.

Per run: the injected spikes caught (a spike record whose skipped samples start at an injected batch: after a
rollback a batch meets another step number), false alarms (by kind: loss or gradient norm), rollbacks
of false alarms, the steps re-trained by rollbacks (the spike's step minus the checkpoint it went back to), the wall
time and the final loss.

    python benchmarks/spike_guard.py      # writes benchmarks/results/spike_guard.{json,md}
    python benchmarks/spike_guard.py --replay benchmarks/results/spike_guard_gpu/*.jsonl.gz   # recorded runs
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
INJECTED = (400, 800, 1200)
GLOBAL_BATCH = 8


def job(lr: float, seed: int, steps: int) -> dict:
    return {"name": f"spikes-{lr:g}-{seed}", "model": {"preset": "gpt-tiny"},
            "training": {"seq_len": 128, "global_batch": GLOBAL_BATCH, "precision": "fp32", "steps": steps, "lr": lr,
                         "seed": seed, "data": {"inject_spike_steps": [s for s in INJECTED if s < steps]},
                         "checkpoint": {"every_steps": 100, "keep": 2}}}


def one_run(lr: float, seed: int, steps: int, work: Path) -> dict:
    d = work / f"lr{lr:g}-s{seed}"
    d.mkdir(parents=True)
    (d / "job.yaml").write_text(yaml.safe_dump(job(lr, seed, steps)))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "cli", "train", "job.yaml", "--json", "--device", "cpu", "--threads", "1",
                          "--run-dir", str(d / "run"), "--checkpoint-uri", str(d / "ck")],
                         cwd=d, capture_output=True, text=True, env=None)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"frenzy train failed ({out.returncode}): {out.stderr[-2000:]}")
    spikes = [r for r in map(json.loads, (d / "run" / "progress.jsonl").read_text().splitlines())
              if r.get("event") == "spike"]
    last = [r for r in map(json.loads, (d / "run" / "progress.jsonl").read_text().splitlines()) if r.get("event") == "step"]
    bad = {(s - 1) * GLOBAL_BATCH for s in INJECTED if s < steps}  # first samples of the injected batches

    def injected(rec: dict) -> bool:  # after a rollback a bad batch meets another step number: judge by its samples
        return rec["skipped_samples"][0] in bad if rec.get("skipped_samples") else rec["step"] in INJECTED

    false = [s for s in spikes if not injected(s)]
    return {"lr": lr, "seed": seed, "wall_s": round(wall, 1), "final_loss": round(last[-1]["loss"], 4),
            "injected_caught": len({s["skipped_samples"][0] for s in spikes if s.get("skipped_samples") and injected(s)}),
            "injected": len([s for s in INJECTED if s < steps]),
            "false_alarms": len(false),
            "false_by_gradient_norm": sum(s["reason"].startswith("gradient norm") for s in false),
            "false_rollbacks": sum(s.get("action") == "rolled_back" for s in false),
            "steps_retrained": sum(s["step"] - s["rolled_back_to"] for s in spikes if s.get("rolled_back_to") is not None)}


def replay(progress: Path) -> dict:
    """The default detector over a run's recorded steps (`training.spike.zscore` set huge so that nothing was skipped,
    `log_every_steps: 1`): which steps it flags, and of which kind."""
    from tasks.training.spikes import SpikeDetector

    opener = gzip.open if progress.suffix == ".gz" else open
    with opener(progress, "rt") as f:
        steps = [r for r in map(json.loads, f) if r.get("event") == "step"]
    det, flags = SpikeDetector(), []
    for r in steps:
        v = det.check(r["loss"], r["grad_norm"])
        if v.spike:
            flags.append({"step": r["step"], "kind": v.kind, "loss_z": round(v.loss_z, 1), "grad_z": round(v.grad_z, 1)})
    return {"run": progress.name, "steps": len(steps), "injected": [f for f in flags if f["step"] in INJECTED],
            "false": [f for f in flags if f["step"] not in INJECTED]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "spike_guard")
    ap.add_argument("--replay", type=Path, nargs="+", help="replay recorded progress.jsonl(.gz) files instead")
    a = ap.parse_args(argv)
    if a.replay:
        for p in a.replay:
            print(json.dumps(replay(p)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for lr in a.lrs:
            for seed in a.seeds:
                rows.append(one_run(lr, seed, a.steps, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    meta = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": f"{platform.machine()}, "
            "2 cores, no GPU", "commit": commit, "steps": a.steps, "command": "python benchmarks/spike_guard.py"}
    a.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1) + "\n")
    lines = [f"# The spike guard on ordinary runs ({meta['date']}, {meta['machine']}, commit {commit})", "",
             f"`{meta['command']}`: gpt-tiny, {a.steps} steps, checkpoint every 100, default `training.spike`; "
             "random-byte batches injected at steps 400, 800, 1200.", "",
             "| lr | seed | injected caught | false alarms (gradient norm) | false rollbacks | steps re-trained | "
             "final loss | wall s |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['lr']:g} | {r['seed']} | {r['injected_caught']}/{r['injected']} | {r['false_alarms']} "
              f"({r['false_by_gradient_norm']}) | {r['false_rollbacks']} | {r['steps_retrained']} | {r['final_loss']} | "
              f"{r['wall_s']} |" for r in rows]
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
