"""Start-up time of the `frenzy` command as a user meets it: a fresh process per run, the real command line, the
wall time from exec to exit (median of `--runs`). `--repo` times another checkout (an older commit, for the figure
before a change) with this interpreter.

    python benchmarks/startup.py                          # writes benchmarks/results/startup.{json,md}
    python benchmarks/startup.py --repo /tmp/old --label before --out /tmp/startup-before
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

REPO = Path(__file__).resolve().parents[1]
LOG12 = REPO / "tests" / "data" / "diagnosis" / "pytorch-16417-oom.log"
TARGETS_S = {"--help": 0.5, "diagnose (12 lines)": 1.0, "diagnose (100 lines)": 1.0}


def hundred_line_log(where: Path) -> Path:
    """A 100-line training log: progress lines of two ranks, then an out-of-memory failure with its traceback."""
    lines = [f"[rank{r}] step {s:5d} | loss {4.0 - s / 500:.4f} | lr 3.0e-04 | 1{r}{s % 10}ms/step"
             for s in range(1, 42) for r in (0, 1)]
    lines += ["Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
              "    loss.backward()", '  File "torch/_tensor.py", line 522, in backward',
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
              "23.65 GiB of which 1.02 GiB is free.",
              "E1125 12:00:01 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "train.py FAILED"]
    lines += [f"[rank1] waiting for rank 0 ({i})" for i in range(100 - len(lines))]
    path = where / "train100.log"
    path.write_text("\n".join(lines[:100]) + "\n")
    return path


def commands(tmp: Path, repo: Path) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "diagnose (12 lines)": ["diagnose", str(LOG12)],
        "diagnose (100 lines)": ["diagnose", str(hundred_line_log(tmp))],
        "plan": ["plan", str(repo / "examples" / "jobs" / "tiny.yaml")],
        "simulate (30 jobs, fcfs)": ["simulate", "--trace", "newworkload:30", "--policy", "fcfs"],
    }


def time_command(args: list[str], repo: Path, cwd: Path, runs: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True)
        out.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"frenzy {' '.join(args)} exited {r.returncode}: {r.stderr[-1500:]}")
    return out


def report(label: str, rows: dict[str, list[float]], runs: int) -> str:
    head = [f"# `frenzy` start-up, {label} ({datetime.now(UTC):%Y-%m-%d}, {platform.machine()}, {os.cpu_count()} cores, "
            "no GPU, machine shared with other work)", "",
            f"`python benchmarks/startup.py`: a fresh process per run, wall time from exec to exit, median of {runs}.",
            "", "| command | median s | min s | max s | target |", "|---|---|---|---|---|"]
    body = [f"| `frenzy {name}` | {statistics.median(ts):.2f} | {min(ts):.2f} | {max(ts):.2f} | "
            f"{f'< {TARGETS_S[name]} s' if name in TARGETS_S else ''} |" for name, ts in rows.items()]
    return "\n".join(head + body) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout whose `frenzy` to time (default this one)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--label", default="now")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "startup")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="frenzy-startup-") as d:
        cwd = Path(d)
        rows = {name: time_command(args, a.repo, cwd, a.runs) for name, args in commands(cwd, a.repo).items()}
    doc = {"label": a.label, "repo": str(a.repo), "runs": a.runs, "date": f"{datetime.now(UTC):%Y-%m-%d}",
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
           "seconds": rows, "median_s": {k: statistics.median(v) for k, v in rows.items()}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    md = report(a.label, rows, a.runs)
    a.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
