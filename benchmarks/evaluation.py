"""Evaluation scheduling: the 63-dataset suite's predicted makespans, and a real run that checks the predictions.

Planning (`acme63`, OpenCompass-style priors for a 7B model, see the suite file): makespan of the naive schedule
(one trial per dataset, remote loads, metrics on the GPU), of OpenCompass's default (SizePartitioner at its
max_task_size of 40,000 cost units = 1340 s here, remote loads, infer-then-eval barrier) and of the elastic
schedule, with the lower bound, on 1 node x 8 GPUs and 4 nodes x 8 GPUs. Targets (Acme section 6.2): naive /
elastic >= 1.3x and >= 1.8x; elastic within 10% of the bound.

Real run (this machine, a gpt-tiny checkpoint trained here, suite `core`: held-out loss, cloze, next-line exact
match, HumanEval with sandboxed execution; 1 inference slot, 1 CPU metric worker): a calibration run learns the
priors; then naive and elastic runs are each predicted from the learned priors and measured. Targets: the
measured order agrees with the predicted one; predictions within 20% of the measurements.

    python benchmarks/evaluation.py        # writes benchmarks/results/evaluation.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.evaluation.runner import EvalOptions, evaluate  # noqa: E402
from tasks.evaluation.schedule import plan, plan_partitioned  # noqa: E402
from tasks.evaluation.suite import load_suite  # noqa: E402

OPENCOMPASS_MAX_TASK_S = 40000 * 0.0335


def planning() -> list[dict]:
    s = load_suite("acme63")
    rows = []
    for nodes, target in ((1, 1.3), (4, 1.8)):
        t0 = time.perf_counter()
        p = plan(s, nodes, 8)
        oc = plan_partitioned(s, nodes, 8, OPENCOMPASS_MAX_TASK_S)
        rows.append({"nodes": nodes, "gpus_per_node": 8, "naive_s": p.naive_makespan_s, "opencompass_s": oc.makespan_s,
                     "elastic_s": p.elastic_makespan_s, "lower_bound_s": p.lower_bound_s, "speedup": p.speedup,
                     "speedup_vs_opencompass": oc.makespan_s / p.elastic_makespan_s, "gap_to_bound": p.gap_to_bound,
                     "trials": len(p.trials), "granularity": p.granularity, "order": p.order, "target": target,
                     "met": p.speedup >= target and p.gap_to_bound <= 0.10, "plan_s": time.perf_counter() - t0})
    return rows


def train_checkpoint(work: Path, steps: int) -> str:
    job = work / "job.yaml"
    job.write_text(f"""name: evalbench
model: {{preset: gpt-tiny}}
training:
  seq_len: 128
  global_batch: 16
  precision: fp32
  steps: {steps}
  trace_every_steps: 0
  checkpoint: {{every_steps: {steps}, uri: "file://{work}/ckpt", keep: 1}}
""")
    subprocess.run([sys.executable, "-m", "cli", "train", str(job), "--run-dir", str(work / "run"), "--json"],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return f"file://{work}/ckpt"


def real_run(work: Path, steps: int, reps: int = 3) -> dict:
    uri = train_checkpoint(work, steps)
    suite = load_suite("core")
    priors = work / "priors.json"

    def run(schedule: str, name: str, learn: bool = True) -> dict:
        r = evaluate(uri, suite, EvalOptions(schedule=schedule, cpu_workers_per_node=1, out_dir=str(work / name),
                                             priors_path=str(priors), learn_priors=learn))
        return {"schedule": schedule, "measured_s": r.makespan_s, "predicted_s": r.predicted_makespan_s,
                "error": r.predicted_makespan_s / r.makespan_s - 1, "trials": len(r.trials), "ran": r.ran,
                "priors_used": r.priors_used, "scores": r.scores}

    load_before = os.getloadavg()
    calib = [run("elastic", "calib-elastic"), run("naive", "calib-naive")]
    pairs = []
    for i in range(reps):  # alternating, so a change in the machine's load hits both schedules alike
        pairs.append((run("naive", f"naive-{i}"), run("elastic", f"elastic-{i}")))
        print(f"rep {i + 1}/{reps}: naive {pairs[-1][0]['measured_s']:.1f} s, elastic {pairs[-1][1]['measured_s']:.1f} s",
              file=sys.stderr, flush=True)
    speedups = sorted(n["measured_s"] / e["measured_s"] for n, e in pairs)
    naive, elastic = pairs[-1]
    errors = [abs(r["error"]) for pair in pairs for r in pair]
    return {"uri": uri, "train_steps": steps, "calibration": calib, "naive": naive, "elastic": elastic,
            "reps": [{"naive": n, "elastic": e} for n, e in pairs],
            "order_agrees": all((n["measured_s"] > e["measured_s"]) == (n["predicted_s"] > e["predicted_s"])
                                for n, e in pairs),
            "max_abs_error": max(errors),
            "measured_speedup": statistics.median(speedups),
            "measured_speedup_min": speedups[0], "measured_speedup_max": speedups[-1],
            "predicted_speedup": naive["predicted_s"] / elastic["predicted_s"],
            "loadavg_1m_before": load_before[0], "loadavg_1m_after": os.getloadavg()[0]}


def _load_note(before: float) -> str:
    """What the load average says of the figures: a machine busy before the benchmark started was shared with other
    work, which slowed both schedules and blurred the predictions (the learned priors included)."""
    if before <= (os.cpu_count() or 1) / 2:
        return "the benchmark's own load, the figures are for a machine doing nothing else."
    return ("other work ran beside the benchmark (the load was there before it started): every makespan is slowed by "
            "it and the predictions, made from priors learned under that load, are blurred by its changes.")


def _commit() -> str:
    """The checkout's commit (short), `-dirty` with uncommitted changes; `unknown` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps of the evaluated checkpoint")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--reps", type=int, default=3, help="naive/elastic pairs of the real run (spread reported)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = planning()
    with tempfile.TemporaryDirectory(prefix="frenzy-evalbench-") as d:
        real = real_run(Path(d), args.steps, args.reps)
    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": f"{platform.machine()}, "
           f"{os.cpu_count()} cores, {platform.system()} {platform.release()}", "command": "python benchmarks/evaluation.py",
           "commit": _commit(), "planning": rows, "real": real, "wall_s": time.perf_counter() - t0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(doc, indent=1))
    md = [f"# Evaluation scheduling ({doc['date']}, {doc['machine']})", "", f"`{doc['command']}` at commit {doc['commit']}", "",
          "## acme63 (63 datasets, 7B priors): predicted makespans", "",
          "| cluster | naive s | OpenCompass-style s | elastic s | lower bound s | naive/elastic | OC/elastic | "
          "elastic vs bound | trials | target | met |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['nodes']}x8 | {r['naive_s']:.0f} | {r['opencompass_s']:.0f} | {r['elastic_s']:.0f} | "
                  f"{r['lower_bound_s']:.0f} | {r['speedup']:.2f}x | {r['speedup_vs_opencompass']:.2f}x | "
                  f"+{100 * r['gap_to_bound']:.1f}% | {r['trials']} | >= {r['target']}x, <= 10% | "
                  f"{'yes' if r['met'] else 'NO'} |")
    md += ["", "## Real run on this machine (gpt-tiny, suite core, 1 inference slot, 1 CPU metric worker)", "",
           "| rep | schedule | predicted s | measured s | error | trials | plan that ran |", "|---|---|---|---|---|---|---|"]
    for i, pair in enumerate(real["reps"]):
        for k in ("naive", "elastic"):
            r = pair[k]
            md.append(f"| {i + 1} | {k} | {r['predicted_s']:.1f} | {r['measured_s']:.1f} | {100 * r['error']:+.1f}% | "
                      f"{r['trials']} | {r['ran']} |")
    md += ["", f"Measured speedup over {len(real['reps'])} alternating pairs: min {real['measured_speedup_min']:.2f}x / "
           f"median {real['measured_speedup']:.2f}x / max {real['measured_speedup_max']:.2f}x (predicted "
           f"{real['predicted_speedup']:.2f}x); order agrees in every pair: {real['order_agrees']}; worst prediction "
           f"error {100 * real['max_abs_error']:.1f}% (target 20%). Load: 1-minute load average "
           f"{real['loadavg_1m_before']:.2f} before, {real['loadavg_1m_after']:.2f} after, on "
           f"{os.cpu_count()} cores: {_load_note(real['loadavg_1m_before'])}",
           "", "Scores of the evaluated checkpoint: " + json.dumps(real["elastic"]["scores"]), ""]
    (out / "evaluation.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
