"""The Ray executor's overhead against local processes on the same job (`frenzy train`'s two ways of running two
ranks): start-up (the call to the first step record) and step time (median interval between step records), on a
three-raylet Ray cluster on this machine (head + two nodes with fake GPU resources, every address on loopback).

    python benchmarks/ray_executor.py            # writes benchmarks/results/ray_executor.{json,md}
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.ray_cluster import LOOPBACK_ENV, start_cluster  # noqa: E402

os.environ.update(LOOPBACK_ENV)  # before ray is imported

from tasks.jobspec import parse_job  # noqa: E402


def _job(uri: str, steps: int):
    return parse_job({"name": "bench", "model": {"preset": "gpt-mini"}, "training": {
        "seq_len": 128, "global_batch": 8, "precision": "fp32", "steps": steps, "log_every_steps": 1,
        "trace_every_steps": 0, "checkpoint": {"every_steps": 10 ** 6, "uri": uri}}})


def _measure(fn, run_dir: Path) -> dict:
    t0 = time.time()
    res = fn()
    recs = [json.loads(x) for x in (run_dir / "progress.jsonl").read_text().splitlines()]
    times = [r["time"] for r in recs if r["event"] == "step"]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {"startup_s": times[0] - t0, "step_s": statistics.median(gaps), "wall_s": time.time() - t0,
            "tokens_per_s": res.tokens_per_s, "world_size": res.world_size}


def main() -> int:
    import ray

    from cluster.ray_exec import launch_ray
    from tasks.training.launch import launch

    steps, pairs = int(os.environ.get("BENCH_STEPS", "40")), int(os.environ.get("BENCH_PAIRS", "3"))
    c, _ = start_cluster(["n1", "n2"], cpus=1)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as d:
            for i in range(pairs):
                for kind in ("local", "ray"):
                    run = Path(d) / f"{kind}{i}"
                    job = _job(f"file://{run}/ckpt", steps)
                    if kind == "local":
                        row = _measure(lambda j=job, r=run: launch(j, r, nproc=2, device="cpu", threads=1), run)
                    else:
                        row = _measure(lambda j=job, r=run: launch_ray(j, [("n1", 1), ("n2", 1)], r, device="cpu",
                                                                       threads=1), run)
                    rows.append({"executor": kind, "pair": i, **row})
                    print(rows[-1], file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
        c.shutdown()

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["executor"] == kind)

    summary = {k: {"startup_s": med(k, "startup_s"), "step_s": med(k, "step_s"), "wall_s": med(k, "wall_s")}
               for k in ("local", "ray")}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, no GPU"
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": machine, "steps": steps, "rows": rows,
           "summary": summary}
    out = REPO / "benchmarks" / "results"
    (out / "ray_executor.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Ray executor vs local processes ({doc['date']}, {machine})", "",
             f"`python benchmarks/ray_executor.py`: gpt-mini, seq 128, batch 8, fp32, {steps} steps, 2 ranks (gloo), "
             f"{pairs} alternating pairs; local = torchrun on this machine, ray = one actor on each of two Ray nodes "
             "(a three-raylet cluster on loopback, warm: the cluster is up before the first run)", "",
             "| executor | start-up s (call -> first step) | step s (median) | wall s |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['startup_s']:.2f} | {v['step_s']:.4f} | {v['wall_s']:.1f} |" for k, v in summary.items()]
    lines += ["", f"Ray / local: start-up {summary['ray']['startup_s'] / summary['local']['startup_s']:.2f}x, "
                  f"step time {summary['ray']['step_s'] / summary['local']['step_s']:.3f}x.", "",
              "| executor | pair | start-up s | step s | tokens/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['executor']} | {r['pair']} | {r['startup_s']:.2f} | {r['step_s']:.4f} | {r['tokens_per_s']:,.0f} |"
              for r in rows]
    (out / "ray_executor.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
