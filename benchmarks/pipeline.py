"""The pipeline's figures: `frenzy demo` wall time, the `submit` flow's overhead over running the same stages by
hand, and the latency from a checkpoint commit to the start of its evaluation on the event path and on the
schedule path (a real Prefect server, deploy.sh, a process worker).

    python benchmarks/pipeline.py                 # everything, about 10 minutes on 2 cores
    python benchmarks/pipeline.py --skip-server   # without the Prefect server part
    python benchmarks/pipeline.py --demo-only     # `frenzy demo` alone, the other figures kept

Writes benchmarks/results/pipeline.{json,md}. Wall times are absolute seconds on this machine; the overhead is a
ratio of runs made one after the other in the same process.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from tasks.jobspec import parse_job  # noqa: E402


def _job(tmp: Path, name: str) -> dict:
    return {"name": name, "model": {"preset": "gpt-tiny"},
            "training": {"seq_len": 128, "global_batch": 16, "precision": "fp32", "steps": 200, "lr": 3e-3,
                         "trace_every_steps": 20, "log_every_steps": 50,
                         "checkpoint": {"every_steps": 50, "uri": f"file://{tmp}/{name}/ckpt", "keep": 8}},
            "evaluation": {"suite": "quick"}}


def demo_wall(runs: int) -> list[float]:
    out = []
    for i in range(runs):
        d = Path(tempfile.mkdtemp(prefix="frenzy-bench-demo-"))
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "cli", "demo", "--dir", str(d), "--json"], cwd=REPO,
                           capture_output=True, text=True)
        out.append(time.monotonic() - t0)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-3000:])
        doc = json.loads(r.stdout)
        assert doc["released"] and len(doc["evaluations"]) == len(doc["train"]["checkpoints"])
        print(f"demo run {i + 1}: {out[-1]:.1f} s", file=sys.stderr)
        shutil.rmtree(d, ignore_errors=True)
    return out


def by_hand(tmp: Path, name: str, evaluate: bool) -> float:
    """The same stages without the flow: plan, allocate, train, evaluate each checkpoint, analyse, release."""
    from cluster.inventory import load_cluster
    from cluster.ledger import Ledger
    from flows.place import requests_for
    from tasks.evaluation.record import evaluate_and_record
    from tasks.evaluation.runner import EvalOptions
    from tasks.evaluation.suite import load_suite
    from tasks.planning.plans import plan_resources
    from tasks.stragglers.analyze import analyze_path
    from tasks.training.launch import launch

    t0 = time.monotonic()
    job = parse_job(_job(tmp, name))
    cluster = load_cluster("local")
    plans = plan_resources(job, cluster, rank_by="balanced", top=1000)
    led = Ledger(str(tmp / f"{name}.db"))
    led.sync(cluster)
    alloc = led.allocate(name, requests_for(plans, job.training.precision))
    job.training.micro_batch = plans[alloc.plan_index].layout.micro_batch
    res = launch(job, tmp / name / "run", device="cpu", resume=True)
    if evaluate:
        suite = load_suite("quick")
        for c in res.checkpoints:
            evaluate_and_record(c.uri, suite, EvalOptions(device="cpu"), str(tmp / "evals-hand"))
    analyze_path(res.trace)
    led.release(alloc.id)
    return time.monotonic() - t0


def via_submit(tmp: Path, name: str, evaluate: bool) -> float:
    from flows.submit import SubmitRequest, submit

    t0 = time.monotonic()
    submit(SubmitRequest(job=parse_job(_job(tmp, name)), ledger=str(tmp / f"{name}.db"),
                         evaluation="in-flow" if evaluate else "off", device="cpu", run_dir=str(tmp / name / "run"),
                         history_dir=str(tmp / "evals-submit")))
    return time.monotonic() - t0


def overhead(reps: int) -> dict:
    from prefect.testing.utilities import prefect_test_harness

    rows: dict[str, list[float]] = {}
    with prefect_test_harness(server_startup_timeout=120):
        tmp = Path(tempfile.mkdtemp(prefix="frenzy-bench-pipe-"))
        via_submit(tmp, "warmup", False)  # the first flow call pays for imports and the API client
        for i in range(reps):
            for evaluate in (False, True):
                tag = "with evaluation" if evaluate else "training only"
                rows.setdefault(f"hand {tag}", []).append(by_hand(tmp, f"h{i}{int(evaluate)}", evaluate))
                rows.setdefault(f"submit {tag}", []).append(via_submit(tmp, f"s{i}{int(evaluate)}", evaluate))
                print(f"rep {i + 1} {tag}: hand {rows[f'hand {tag}'][-1]:.1f} s, submit "
                      f"{rows[f'submit {tag}'][-1]:.1f} s", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def latency() -> dict:
    """Commit -> evaluation start on the event path (trigger -> deployment run on a worker) and the schedule
    path (an hourly schedule's run, brought forward, from its scheduled time to its start)."""
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.deployments import run_deployment
    from prefect.events.filters import EventFilter, EventNameFilter
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Scheduled

    from flows.train import CHECKPOINT_EVENT
    from tests.prefect_stack import prefect_stack
    from tests.trainer_util import run as train_run
    from tests.trainer_util import tiny_job

    tmp = Path(tempfile.mkdtemp(prefix="frenzy-bench-stack-"))
    out: dict = {}
    with prefect_stack(tmp) as st, temporary_settings({PREFECT_API_URL: st.api_url}), \
            get_client(sync_client=True) as client:
        job = _job(Path("."), "lat")
        job["training"]["checkpoint"]["uri"] = "file://./runs/lat/ckpt"  # relative to the deployed checkout
        form = {"request": {"job": job, "cluster": "local"}}
        t0 = time.monotonic()
        run = run_deployment("submit/submit", parameters=form, timeout=900)
        out["submit_deployment_wall_s"] = time.monotonic() - t0
        assert run.state.is_completed(), run.state
        events = [e for e in client.read_events(filter=EventFilter(event=EventNameFilter(name=[CHECKPOINT_EVENT])),
                                                limit=50).events if e.payload.get("run") == "lat"]
        dep = client.read_deployment_by_name("evaluate-checkpoint/evaluate-on-checkpoint")
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))
        by_uri = {r.parameters["request"]["uri"]: r for r in runs}
        lat = [(by_uri[e.payload["uri"]].start_time - e.occurred).total_seconds() for e in events
               if e.payload["uri"] in by_uri and by_uri[e.payload["uri"]].start_time]
        out["event_commit_to_eval_start_s"] = lat
        # schedule path: a checkpoint with no score, the next hourly run brought forward to now
        root = st.workdir / "runs" / "tiny" / "ckpt"
        train_run(tiny_job(f"file://{root}", steps=10, every=10), st.workdir / "runs" / "tiny-train")
        dep = client.read_deployment_by_name("evaluate-pending/evaluate-pending")
        deadline = time.monotonic() + 60
        while not (sched := [r for r in client.read_flow_runs(deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[dep.id]))) if r.state_name == "Scheduled"
                and r.expected_start_time > datetime.now(UTC)]):
            assert time.monotonic() < deadline, "the scheduler created no run"
            time.sleep(1)
        first = min(sched, key=lambda r: r.expected_start_time)
        due = datetime.now(UTC)
        client.set_flow_run_state(first.id, Scheduled(scheduled_time=due), force=True)
        while not (r := client.read_flow_run(first.id)).state.is_final():
            time.sleep(1)
        out["schedule_due_to_start_s"] = (r.start_time - due).total_seconds()
        out["schedule_interval_s"] = 3600
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo-runs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--demo-only", action="store_true",
                    help="time `frenzy demo` again and keep the other figures of the last run's pipeline.json")
    a = ap.parse_args()
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    out = REPO / "benchmarks" / "results"
    if a.demo_only:
        res = json.loads((out / "pipeline.json").read_text())
    else:
        res = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU", "date": today,
               "command": "python benchmarks/pipeline.py"}
    res["demo_wall_s"] = demo_wall(a.demo_runs)
    res["demo_date"] = today
    if not a.demo_only:
        res["overhead_s"] = overhead(a.reps)
        if not a.skip_server:
            res["latency"] = latency()
    (out / "pipeline.json").write_text(json.dumps(res, indent=1))
    med = {k: statistics.median(v) for k, v in res["overhead_s"].items()}
    lines = [f"# Pipeline figures ({res['date']}, {res['machine']})", "", f"`{res['command']}`", "",
             "- `frenzy demo` wall time: " + ", ".join(f"{x:.0f} s" for x in res["demo_wall_s"]) +
             f" (target < 300 s; measured {res.get('demo_date', res['date'])}, `--demo-only` reruns it alone)", "",
             "| stages of one 200-step gpt-tiny job | by hand (median) | submit flow (median) |"
             " submit / hand |", "|---|---|---|---|"]
    for tag in ("training only", "with evaluation"):
        h, s = med[f"hand {tag}"], med[f"submit {tag}"]
        lines.append(f"| {tag} | {h:.1f} s | {s:.1f} s | {s / h:.2f}x |")
    if "latency" in res:
        lat = res["latency"]
        ev = lat["event_commit_to_eval_start_s"]
        lines += ["", "- Event path, commit -> evaluate-on-checkpoint run started: " +
                  ", ".join(f"{x:.1f} s" for x in ev) + (f" (median {statistics.median(ev):.1f} s)" if ev else ""),
                  f"- Schedule path: a commit waits for the next hourly run (mean {lat['schedule_interval_s'] / 2:.0f} s, "
                  f"at most {lat['schedule_interval_s']} s), then the run starts {lat['schedule_due_to_start_s']:.1f} s "
                  "after it is due (worker polling + process start)",
                  f"- `submit` from its deployment on the worker: {lat['submit_deployment_wall_s']:.0f} s"]
    (out / "pipeline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
