"""Goodput of `checkpoint.every_steps: auto` against fixed intervals of 5, 20 and 100 steps, under injected failures.

What runs is what a user runs: `frenzy train job.yaml --resume` (one CPU rank), restarted after every failure until
the job reaches its steps. A failure is a SIGKILL of the CLI and every process under it (a lost node) after a number
of steps drawn from an exponential distribution with mean `--mtbf-steps` (a seeded draw sequence per repetition, the
same for every interval, so within a repetition each interval meets the same failures; another in each repetition, so
no interval is favoured by lining up with one sequence's failure steps). Each restart resumes from the newest commit;
the steps after it are done again. Goodput = useful steps (the newest commit) / the wall time from the first start, restarts included;
a run not done after `--budget-s` is stopped there (100 steps between commits with a failure every 40 steps on
average may never finish).

Loss-spike rollbacks are off (a spike only drops its batch): the only failures are the injected ones.

`auto` is told the failure rate as `checkpoint.mtbf_s` = mean steps between failures x the step time measured in a
failure-free warm-up run (what `frenzy submit` derives from the ledger's failure history); its checkpoint cost it
measures itself. Two failure rates, all intervals in one run, the order of the intervals rotated per repetition.

    python benchmarks/checkpoint_interval.py      # writes benchmarks/results/checkpoint_interval.{json,md}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tasks.procs import alive  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
INTERVALS: list[int | str] = [5, 20, 100, "auto"]


@dataclass(frozen=True)
class Regime:
    """The job every interval trains: the model, its batch and the torch threads of its one rank (None: the CLI's
    default, cores - 1, which leaves a core to the background persist)."""

    preset: str = "gpt-tiny"
    seq_len: int = 128
    batch: int = 8
    threads: int | None = None

    def describe(self) -> str:
        th = "the CLI's default threads (cores - 1)" if self.threads is None else f"{self.threads} torch threads"
        return f"{self.preset} (seq {self.seq_len}, batch {self.batch}, fp32, 1 CPU rank, {th})"


def _job(tmp: Path, name: str, steps: int, every: int | str, mtbf_s: float | None, regime: Regime) -> Path:
    ck = {"every_steps": every, "uri": f"file://{tmp}/{name}/ckpt", "keep": 2}
    if mtbf_s:
        ck["mtbf_s"] = mtbf_s
    job = {"name": name, "model": {"preset": regime.preset},
           "training": {"seq_len": regime.seq_len, "global_batch": regime.batch, "precision": "fp32", "steps": steps,
                        "warmup_steps": 5, "log_every_steps": 1, "trace_every_steps": 0, "checkpoint": ck,
                        # a rollback to the newest healthy checkpoint is a second failure process that auto is not
                        # told of (gpt-mini at batch 2 flags 3-7 spikes in 300 steps); spikes are still logged
                        "spike": {"rollback": False}}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _steps(progress: Path, offset: int) -> tuple[list[dict], int]:
    if not progress.exists():
        return [], offset
    with open(progress, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return [json.loads(x) for x in data[:end].splitlines() if x.strip()], offset + end


def _tree(pid: int) -> list[int]:
    kids = [int(k) for k in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    return kids + [g for k in kids for g in _tree(k)]


def kill_job(proc: subprocess.Popen) -> None:
    """A lost node: SIGKILL the CLI and every process under it (torchrun starts each rank in a session of its own,
    so killing process groups is not enough), frozen first so that none reacts to another's death (an orphaned
    rank would commit its step and exit)."""
    procs = [proc.pid, *_tree(proc.pid)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    proc.wait()
    for pid in procs[1:]:  # wait until the ranks are gone, so the next attempt finds their lease stale
        while alive(pid):
            time.sleep(0.01)


def _committed(ck_dir: Path) -> int:
    return max((int(p.name[5:]) for p in ck_dir.glob("step_*") if (p / "manifest.json").exists()), default=0)


def restart_s(progress: Path) -> float:
    """Seconds from the last step before each kill to the first step after the resume: the new process's start-up,
    the same work whatever the interval, and the noisiest part of the wall time on a shared machine."""
    total, last, resumed = 0.0, None, False
    recs, _ = _steps(progress, 0)
    for r in recs:
        if r["event"] == "resume":
            resumed = True
        elif r["event"] == "step":
            if resumed and last is not None:
                total += r["time"] - last
            resumed, last = False, r["time"]
    return total


def run_one(tmp: Path, name: str, steps: int, every: int | str, mtbf_s: float | None, draws: list[int],
            budget_s: float, regime: Regime) -> dict:
    """Train to `steps`, killing the trainer after draws[i] steps of attempt i; the wall time, failures and the
    useful steps (the newest commit). A run still short of `steps` after `budget_s` is stopped there (an interval
    longer than the failures allow may never finish): its goodput counts the steps it committed."""
    job = _job(tmp, name, steps, every, mtbf_s, regime)
    threads = [] if regime.threads is None else ["--threads", str(regime.threads)]
    run_dir = tmp / name / "run"
    progress = run_dir / "progress.jsonl"
    t0, failures, redone, offset, interval = time.monotonic(), 0, 0, 0, None
    for attempt in range(len(draws)):
        proc = subprocess.Popen([sys.executable, "-m", "cli", "train", str(job), "--resume", "--device", "cpu",
                                 *threads, "--run-dir", str(run_dir)], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        start, top, killed, out_of_time = None, 0, False, False
        while proc.poll() is None:
            recs, offset = _steps(progress, offset)
            for r in recs:
                if r["event"] == "resume":
                    start = r["step"]
                elif r["event"] == "step":
                    start = r["step"] - 1 if start is None else start
                    top = max(top, r["step"])
                elif r["event"] == "checkpoint_interval":
                    interval = r
            out_of_time = time.monotonic() - t0 > budget_s
            if (start is not None and top - start >= draws[attempt] and top < steps) or out_of_time:
                kill_job(proc)
                killed = True
                break
            time.sleep(0.01)
        if not killed and proc.returncode != 0:
            raise RuntimeError(f"{name}: frenzy train exited {proc.returncode}")
        if killed:
            failures += not out_of_time
            redone += max(top - _committed(tmp / name / "ckpt"), 0)  # 0: stopped before a step of the attempt
        if not killed or out_of_time:
            break
    useful = steps if not killed else _committed(tmp / name / "ckpt")
    return {"wall_s": time.monotonic() - t0, "failures": failures, "redone_steps": redone, "useful_steps": useful,
            "restart_s": restart_s(progress),
            "auto_every_steps": interval and interval["every_steps"], "auto_inputs": interval,
            "completed": not killed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mtbf-steps", type=int, nargs="+", default=[40, 150])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop a run after this many seconds")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "checkpoint_interval"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json of the last run")
    ap.add_argument("--preset", default="gpt-tiny")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, help="torch threads of the rank (default: the CLI's own default)")
    a = ap.parse_args()
    regime = Regime(a.preset, a.seq_len, a.batch, a.threads)
    if a.report_only:
        doc = json.loads(Path(a.out + ".json").read_text())
        Path(a.out + ".md").write_text("\n".join(_report(doc, doc.get("command", ""),
                                                        doc.get("budget_s", _budget(doc, a.budget_s)))) + "\n")
        return
    tmp = Path(tempfile.mkdtemp(prefix="frenzy-interval-"))
    warm = run_one(tmp, "warmup", a.steps, 1000, None, [10**9], 10**9, regime)
    step_s = warm["wall_s"] / a.steps  # includes the start-up: an upper bound, so auto's MTBF errs long
    rows = []
    for mtbf in a.mtbf_steps:
        for rep in range(a.reps):
            # the same failures for every interval of a repetition, other failures in the next: one fixed draw
            # sequence would favour whichever interval happens to line up with its failure steps in every repetition
            rng = random.Random(mtbf * 1000 + rep)
            draws = [max(1, round(rng.expovariate(1 / mtbf))) for _ in range(400)]
            order = INTERVALS[rep % len(INTERVALS):] + INTERVALS[:rep % len(INTERVALS)]
            for every in order:
                name = f"m{mtbf}-e{every}-r{rep}"
                r = run_one(tmp, name, a.steps, every, mtbf * step_s if every == "auto" else None, draws, a.budget_s,
                            regime)
                r.update(mtbf_steps=mtbf, every=str(every), rep=rep,
                         goodput_steps_per_s=r["useful_steps"] / r["wall_s"])
                rows.append(r)
                print(json.dumps(r), flush=True)
    doc = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()}-core {platform.machine()}, "
           "shared with other sessions, no GPU", "steps": a.steps, "warmup_wall_s": warm["wall_s"],
           "step_s_upper": step_s, "reps": a.reps, "budget_s": a.budget_s,
           "regime": regime.describe(), "command": " ".join(sys.argv[1:]), "rows": rows}
    Path(a.out + ".json").write_text(json.dumps(doc, indent=1))
    Path(a.out + ".md").write_text("\n".join(_report(doc, doc["command"], a.budget_s)) + "\n")


def _budget(doc: dict, default: float) -> float:
    """A run's `--budget-s`, from its recorded command where the document predates the `budget_s` field."""
    words = doc.get("command", "").split()
    return float(words[words.index("--budget-s") + 1]) if "--budget-s" in words[:-1] else default


def _report(doc: dict, command: str, budget_s: float) -> list[str]:
    rows = doc["rows"]
    lines = [f"# Goodput of checkpoint.every_steps: auto vs fixed intervals ({doc['date']})", "",
             f"Machine: {doc['machine']}. `frenzy train --resume` of "
             f"{doc.get('regime', 'gpt-tiny (seq 128, batch 8, fp32, 1 CPU rank, 1 torch thread)')}, "
             f"{doc['steps']} steps, restarted after each SIGKILL of the CLI and every process under it; failures "
             "after an exponential number of steps (per repetition one seeded draw sequence, the same for every interval). "
             "Goodput = useful steps "
             f"(the newest commit) / wall time (restarts included); a run not done after {budget_s:.0f} s is stopped "
             f"there. Command: `python benchmarks/checkpoint_interval.py {command}`.", "",
             "| mean steps between failures | every_steps | goodput (steps/s) | useful steps | failures | steps re-done "
             "| wall s | auto's last interval |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mtbf_steps']} | {r['every']} | {r['goodput_steps_per_s']:.2f} | {r['useful_steps']}"
                     f"{'' if r['completed'] else ' (stopped)'} | {r['failures']} | {r['redone_steps']} | "
                     f"{r['wall_s']:.1f} | {r['auto_every_steps'] or ''} |")
    lines += _summary(rows) if doc.get("reps", 1) > 1 else []
    lines += _model_table(rows)
    return lines


def _without_restarts(r: dict) -> float | None:
    """Useful steps over the wall time less the restarts' start-up (None: not recorded)."""
    return r["useful_steps"] / (r["wall_s"] - r["restart_s"]) if "restart_s" in r else None


def _summary(rows: list[dict]) -> list[str]:
    """Per failure rate and interval, the median goodput over the repetitions (and its range), and whether auto's
    median reaches the best fixed interval's; the same without the restarts' start-up time."""
    out = ["", "Over the repetitions (within a repetition every interval meets the same failures, each repetition other "
           "ones; the order of the intervals rotates). Without restarts: useful steps over the wall time less the "
           "seconds from the last step before each kill to the first step after the resume (a new process's "
           "start-up, which no interval changes and which varies by several tenths of a second on a shared machine):",
           "", "| mean steps between failures | every_steps | median goodput (steps/s) | min - max | runs | "
           "median goodput without restarts |", "|---|---|---|---|---|---|"]
    verdict = []
    for mtbf in sorted({r["mtbf_steps"] for r in rows}):
        med, med2 = {}, {}
        for every in dict.fromkeys(r["every"] for r in rows if r["mtbf_steps"] == mtbf):
            these = [r for r in rows if r["mtbf_steps"] == mtbf and r["every"] == every]
            g = [r["goodput_steps_per_s"] for r in these]
            g2 = [x for r in these if (x := _without_restarts(r)) is not None]
            med[every] = statistics.median(g)
            if g2:
                med2[every] = statistics.median(g2)
            out.append(f"| {mtbf} | {every} | {med[every]:.3f} | {min(g):.3f} - {max(g):.3f} | {len(g)} | "
                       + (f"{med2[every]:.3f} |" if g2 else "|"))
        fixed = {e: v for e, v in med.items() if e != "auto"}
        if "auto" in med and fixed:
            best = max(fixed, key=fixed.get)
            paired = _paired(rows, mtbf, best)
            line = (f"- one failure per {mtbf} steps: auto {med['auto']:.3f} against the best fixed interval "
                    f"({best} steps) {fixed[best]:.3f}: {med['auto'] / fixed[best] - 1:+.1%}; per repetition "
                    "(same failures): " + ", ".join(f"{x - 1:+.1%}" for x in paired)
                    + (f", median {statistics.median(paired) - 1:+.1%}" if paired else "") + _interval(paired))
            fixed2 = {e: v for e, v in med2.items() if e != "auto"}
            if "auto" in med2 and fixed2:
                best2 = max(fixed2, key=fixed2.get)
                paired2 = _paired(rows, mtbf, best2, _without_restarts)
                line += (f". Without restarts: auto {med2['auto']:.3f} against {best2} steps {fixed2[best2]:.3f}: "
                         f"{med2['auto'] / fixed2[best2] - 1:+.1%}; per repetition "
                         + ", ".join(f"{x - 1:+.1%}" for x in paired2))
            verdict.append(line)
    return out + [""] + verdict


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Student's t at 97.5% by degrees of freedom (a two-sided 95% interval)."""


def _interval(ratios: list[float]) -> str:
    """The geometric mean of paired ratios with a 95% t interval on their logs: the interval holds the true ratio if
    the repetitions' noise is roughly log-normal and independent. The best fixed interval was picked after the fact
    (the largest of three noisy medians), which biases the comparison towards it."""
    if len(ratios) < 3 or len(ratios) - 1 not in T975 or min(ratios) <= 0:  # a run stopped with nothing committed
        return ""
    logs = [math.log(x) for x in ratios]
    m, half = statistics.mean(logs), T975[len(logs) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return (f"; geometric mean {math.exp(m) - 1:+.1%}, 95% interval {math.exp(m - half) - 1:+.1%} to "
            f"{math.exp(m + half) - 1:+.1%}")


def _paired(rows: list[dict], mtbf: int, every: str,
            metric: Callable[[dict], float | None] = lambda r: r["goodput_steps_per_s"]) -> list[float]:
    """auto's goodput over interval `every`'s in each repetition (the two met the same failures)."""
    by = {(r["rep"], r["every"]): metric(r) for r in rows if r["mtbf_steps"] == mtbf}
    by = {k: v for k, v in by.items() if v is not None}
    return [by[(rep, "auto")] / by[(rep, every)] for rep in sorted({k[0] for k in by})
            if (rep, "auto") in by and (rep, every) in by]


def expected_loss(every: int, step_s: float, cost_s: float, mtbf_s: float) -> float:
    """Young's first-order fraction of wall time lost to checkpoints and re-done work at an interval of `every`
    steps: the checkpoint cost per interval plus half an interval re-done per failure (restarts not counted)."""
    tau = every * step_s
    return cost_s / tau + tau / (2 * mtbf_s)


def _model_table(rows: list[dict]) -> list[str]:
    """What auto measured (C, step time) and was told (M), and the expected lost work of each interval under
    Young's model with those inputs: is auto's choice the model's optimum, and how far off are the fixed ones?"""
    out = ["", "Auto's inputs (its last `checkpoint_interval` record) and the expected fraction of wall time lost "
           "(checkpoint cost + re-done work, Young's model, restarts excluded) at each interval with those inputs:",
           "", "| mean steps between failures | measured C (s) | blocked (s) | drag (s) | step (s) | M (s) | "
           "auto's Young interval (steps) | lost @5 | lost @20 | lost @100 | lost @auto |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        i = r.get("auto_inputs")
        if r["every"] != "auto" or not i or "cost_s" not in i:
            continue
        young = max(round(i["interval_s"] / i["step_s"]), 1)  # the last record may be capped at the steps left
        lost = [expected_loss(e, i["step_s"], i["cost_s"], i["mtbf_s"]) for e in (5, 20, 100, young)]
        out.append(f"| {r['mtbf_steps']} | {i['cost_s']:.3f} | {i['blocked_s']:.3f} | {i['drag_s']:.3f} | "
                   f"{i['step_s']:.3f} | {i['mtbf_s']:.0f} | {young} | "
                   + " | ".join(f"{x:.1%}" for x in lost) + " |")
    return out


if __name__ == "__main__":
    main()
