"""Checkpoint blocking and speed of `frenzy train` itself (the CLI a user runs, not the checkpointer in a harness).

For one job (default: gpt-100m, fp32, seq 64, batch 2: 1.2 GB of model + AdamW state) it runs, as subprocesses:
  * `frenzy train --json` with a checkpoint interval longer than a persist, `--runs` times: median blocked time
    per checkpoint (first included), tokens/s per run (min/median/max), and the time of steps that overlapped a
    persist against clean steps (from the step records' timestamps and each commit's persist window);
  * the same with an interval shorter than a persist (every 2 steps): blocked time and deferred steps;
and in this process:
  * a synchronous `torch.save({model, optimizer})` + fsync of the same state (the baseline a save would block for);
  * a minimal hand-written loop on the same model, batch, optimizer (fused AdamW) and thread count: tokens/s.

    python benchmarks/trainer.py                       # writes benchmarks/results/trainer.{json,md}
    python benchmarks/trainer.py --preset gpt-mini --steps 40 --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.jobspec import parse_job  # noqa: E402
from tasks.training.launch import default_threads  # noqa: E402
from tasks.training.model import GPT  # noqa: E402


def job_dict(preset: str, steps: int, every: int, uri: str, seq: int, batch: int) -> dict:
    return {"name": "bench", "model": {"preset": preset},
            "training": {"seq_len": seq, "global_batch": batch, "precision": "fp32", "steps": steps,
                         "log_every_steps": 1, "trace_every_steps": 0, "warmup_steps": 2,
                         "checkpoint": {"every_steps": every, "uri": uri, "keep": 2}}}


def frenzy_train(tmp: Path, job: dict, tag: str) -> dict:
    d = tmp / tag
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    job = json.loads(json.dumps(job))
    job["training"]["checkpoint"]["uri"] = f"file://{d}/ckpt"
    (d / "job.yaml").write_text(yaml.safe_dump(job))
    r = subprocess.run([sys.executable, "-m", "cli", "train", str(d / "job.yaml"), "--run-dir", str(d / "run"),
                        "--device", "cpu", "--json"], cwd=REPO, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    res = json.loads(r.stdout)
    recs = [json.loads(x) for x in (d / "run" / "progress.jsonl").read_text().splitlines()]
    steps = [x for x in recs if x["event"] == "step"]
    commits = [x for x in recs if x["event"] == "checkpoint"]
    windows = [(c["time"] - c["persist_s"], c["time"]) for c in commits]
    during, clean = [], []
    for a, b in zip(steps, steps[1:], strict=False):
        if b["step"] != a["step"] + 1:
            continue
        dt = b["time"] - a["time"]
        saved_here = any(c["step"] == b["step"] for c in commits) or any(c["step"] == a["step"] for c in commits)
        if saved_here:
            continue  # the step that took the snapshot (its blocked time is reported apart)
        overlaps = any(a["time"] < e and b["time"] > s for s, e in windows)
        (during if overlaps else clean).append(dt)
    res["step_s_during_persist"] = during
    res["step_s_clean"] = clean
    shutil.rmtree(d / "ckpt", ignore_errors=True)
    return res


def sync_baseline(preset: str, seq: int, batch: int, tmp: Path, reps: int = 3) -> tuple[list[float], int]:
    spec = parse_job(job_dict(preset, 1, 1, "file:///x", seq, batch)).model
    torch.manual_seed(0)
    model = GPT(spec, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, 256, (batch, seq))
    model(x, x).backward()
    opt.step()
    out = []
    for _ in range(reps):
        p = tmp / "sync.pt"
        t0 = time.perf_counter()
        with open(p, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        out.append(time.perf_counter() - t0)
        size = p.stat().st_size
        p.unlink()
    return out, size


def bare_loop(preset: str, seq: int, batch: int, steps: int) -> float:
    """Tokens/s of the simplest loop on the same model, batch, optimizer and thread count."""
    torch.set_num_threads(default_threads(1))
    spec = parse_job(job_dict(preset, 1, 1, "file:///x", seq, batch)).model
    torch.manual_seed(0)
    model = GPT(spec, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    data = torch.randint(0, 256, (steps, batch, seq + 1))
    t0 = time.perf_counter()  # from the first step, as the trainer's tokens/s counts (model already built)
    for i in range(steps):
        x, y = data[i, :, :-1], data[i, :, 1:]
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss)  # the trainer reads the loss every step (spike detection)
    return steps * batch * seq / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt-100m")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10, help="the interval longer than a persist")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="frenzy-bench-train-"))
    res: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU", "command":
                 "python benchmarks/trainer.py " + " ".join(sys.argv[1:]),
                 "date": datetime.now(UTC).strftime("%Y-%m-%d"), "preset": a.preset, "seq": a.seq, "batch": a.batch,
                 "threads": default_threads(1)}
    sync, size = sync_baseline(a.preset, a.seq, a.batch, tmp)
    res["sync_save_fsync_s"], res["state_bytes"] = sync, size
    print(f"sync torch.save+fsync: {sync}", file=sys.stderr)
    runs, bare = [], []
    for i in range(a.runs):  # each trainer run paired with a bare loop right after it: both see the same machine
        r = frenzy_train(tmp, job_dict(a.preset, a.steps, a.every, "", a.seq, a.batch), f"long{i}")
        runs.append(r)
        bare.append(bare_loop(a.preset, a.seq, a.batch, a.steps))
        print(f"frenzy train run {i + 1}: {r['tokens_per_s']:.0f} tok/s (bare loop {bare[-1]:.0f}), blocked "
              f"{[round(c['blocked_s'], 4) for c in r['checkpoints']]}", file=sys.stderr)
    short = frenzy_train(tmp, job_dict(a.preset, a.steps, 2, "", a.seq, a.batch), "short")
    print(f"every 2 steps: blocked {[round(c['blocked_s'], 4) for c in short['checkpoints']]}, deferred "
          f"{[c['deferred_steps'] for c in short['checkpoints']]}", file=sys.stderr)
    blocked = [c["blocked_s"] for r in runs for c in r["checkpoints"]]
    during = [x for r in runs for x in r["step_s_during_persist"]]
    clean = [x for r in runs for x in r["step_s_clean"]]
    tps = [r["tokens_per_s"] for r in runs]
    res.update({"runs": runs, "short_interval": short, "bare_loop_tokens_per_s": bare})
    sync_med = statistics.median(sync)
    short_blocked = [c["blocked_s"] for c in short["checkpoints"][:-1]] or [float("nan")]
    summary = {
        "blocked_median_s": statistics.median(blocked), "sync_median_s": sync_med,
        "blocked_ratio": sync_med / statistics.median(blocked),
        "short_blocked_median_s": statistics.median(short_blocked),
        "short_blocked_ratio": sync_med / statistics.median(short_blocked),
        "short_deferred_steps": [c["deferred_steps"] for c in short["checkpoints"]],
        "persist_median_s": statistics.median(c["persist_s"] for r in runs for c in r["checkpoints"]),
        "step_during_persist_vs_clean": (statistics.median(during) / statistics.median(clean)) if during and clean
        else None,
        "tokens_per_s_min_median_max": [min(tps), statistics.median(tps), max(tps)],
        "bare_tokens_per_s_min_median_max": [min(bare), statistics.median(bare), max(bare)],
        "trainer_vs_bare": statistics.median(tps) / statistics.median(bare),
        "trainer_vs_bare_per_pair": sorted(t / b for t, b in zip(tps, bare, strict=True))}
    res["summary"] = summary
    out = REPO / "benchmarks" / "results"
    (out / "trainer.json").write_text(json.dumps(res, indent=1))
    s = summary
    lines = [f"# `frenzy train`: checkpoint blocking and speed ({res['date']}, {res['machine']})", "",
             f"`{res['command']}`; {a.preset}, fp32, seq {a.seq}, batch {a.batch}, {a.steps} steps, "
             f"{size / 1e9:.2f} GB of model + AdamW state, {res['threads']} torch thread(s) (the default here)", "",
             "| figure | target | measured |", "|---|---|---|",
             f"| median blocked per checkpoint (first included), every {a.every} steps | >= 20x below sync | "
             f"{s['blocked_median_s'] * 1e3:.1f} ms vs {s['sync_median_s']:.2f} s sync: **{s['blocked_ratio']:.0f}x** |",
             f"| median blocked, every 2 steps (shorter than a persist) | >= 5x below sync | "
             f"{s['short_blocked_median_s'] * 1e3:.1f} ms: **{s['short_blocked_ratio']:.0f}x**; deferred steps "
             f"{s['short_deferred_steps']} |",
             "| step time during a persist / clean step | within 5% | "
             + (f"{s['step_during_persist_vs_clean']:.3f}" if s["step_during_persist_vs_clean"] else "n/a") + " |",
             f"| tokens/s of frenzy train (min / median / max over {a.runs} runs) | same run after run | "
             + " / ".join(f"{x:,.0f}" for x in s["tokens_per_s_min_median_max"]) + " |",
             f"| frenzy train / bare loop tokens/s, median / median (per pair) | >= 0.90 | "
             f"**{s['trainer_vs_bare']:.2f}** ({', '.join(f'{x:.2f}' for x in s['trainer_vs_bare_per_pair'])}; bare "
             + " / ".join(f"{x:,.0f}" for x in s["bare_tokens_per_s_min_median_max"]) + ") |",
             "", f"Persist median {s['persist_median_s']:.2f} s. Tokens/s of `frenzy train` count its loop from the "
             "first step to the last optimizer update (the in-loop checkpoints included; the final checkpoint, "
             "taken after training, is in its blocked time). The bare loop runs right after each trainer run, in "
             "the benchmark's process, with the same threads, model, batch, fused AdamW, grad clipping and a loss "
             "read per step."]
    (out / "trainer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
