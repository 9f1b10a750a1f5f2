"""The pipeline commands of `frenzy`: `submit` (one job end to end) and `demo` (the whole pipeline on this
machine with embedded defaults). Both call the `submit` flow, the same one the deployment runs."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cli.argtypes import bounded_float, bounded_int
from cli.output import emit, table
from tasks.errors import FrenzyError
from tasks.report import straggler_line

DEMO_JOB = {
    "name": "demo",
    "model": {"preset": "gpt-tiny"},
    "training": {"seq_len": 128, "global_batch": 16, "precision": "fp32", "steps": 400, "lr": 3e-3,
                 "log_every_steps": 20, "trace_every_steps": 20,
                 "checkpoint": {"every_steps": 100, "keep": 8}},
    "evaluation": {"suite": "quick"},
}
"""The demo's job: a byte-level model small enough to learn visibly on two CPU cores in a minute."""


def _result_doc(res: object) -> dict:
    return res.model_dump(mode="json")  # type: ignore[attr-defined]


def _human(res: object, wall_s: float) -> str:
    from flows.submit import SubmitResult

    assert isinstance(res, SubmitResult)
    p, a, t = res.plan, res.allocation, res.train
    rows = [{"step": e.step, **{f"{ds} {m}": f"{v:.4g}" for ds, ms in e.scores.items() for m, v in ms.items()}}
            for e in res.evaluations]
    lines = [f"{res.job}: {t.final_step} steps on {p.gpus} x {p.gpu_type} ({p.layout.label()}), placed on "
             + ", ".join(f"{n.node}{n.gpu_indices}" for n in a.nodes)
             + f"; last loss {t.last_loss:.3f}, {t.tokens_per_s:,.0f} tok/s; {len(t.checkpoints)} checkpoints"
             + (f"; {t.spike_counts.summary()}" if t.spike_counts.summary() else ""),
             "", "scores by checkpoint:", table(rows), ""]
    for r in res.recoveries:
        d, act = r["diagnosis"], r["action"]
        lines.append(f"recovered: {d['type']} ({d['category']}) -> {act['kind']}: {act['reason']}")
    if res.stragglers:
        lines.append(f"stragglers: {straggler_line(res.stragglers)}")  # the report's words: a worst op only if one straggled
    lines += [f"GPUs released: {'yes' if res.released else 'NO'}", f"checkpoints: {t.checkpoint_uri}",
              f"report: {res.report}", f"({wall_s:.0f} s)"]
    return "\n".join(lines)


def _check_inputs(args: argparse.Namespace, run_dir: Path) -> None:
    """What the user gave, checked before anything is placed or trained: the suite, a cluster file, where the results
    go, and last the ledger (a mistyped --ledger must not become a new, empty cluster)."""
    from cluster.inventory import PRESETS, load_cluster
    from cluster.ledger import require_existing
    from tasks.evaluation.suite import load_suite
    from tasks.outdir import check_writable

    if args.suite:
        load_suite(args.suite)
    if args.cluster not in (*PRESETS, "local", "ray") and not args.cluster.startswith("ray://"):
        load_cluster(args.cluster)
    check_writable(run_dir, "--run-dir")
    check_writable(args.history_dir, "--history-dir")
    require_existing(args.ledger)


def cmd_submit(args: argparse.Namespace) -> int:
    from tasks.jobspec import load_job
    from tasks.training.launch import default_run_dir

    job = load_job(args.job)
    _check_inputs(args, Path(args.run_dir) if args.run_dir else default_run_dir(job))
    from cli.console import run_submit
    from flows.submit import SubmitRequest

    req = SubmitRequest(job=job, cluster=args.cluster, ledger=args.ledger, suite=args.suite,
                        max_wait_s=args.max_wait, evaluation=args.evaluation, device=args.device,
                        run_dir=str(Path(args.run_dir).absolute()) if args.run_dir else None, lease_s=args.lease,
                        max_restarts=args.max_restarts, hang_s=args.hang, executor=args.executor,
                        # absolute here, on the submitting side: Ray nodes write where their `ray start` ran
                        history_dir=str(Path(args.history_dir).absolute()))
    t0 = time.monotonic()
    res = run_submit("submit", req)
    if res is None:
        return 130
    emit(args, _result_doc(res), lambda: _human(res, time.monotonic() - t0))
    return 0


def demo_request(base: Path) -> object:
    """The demo's SubmitRequest, everything under `base` (its own ledger, run, checkpoints and evaluations)."""
    from flows.submit import SubmitRequest
    from tasks.jobspec import parse_job

    base = base.absolute()
    data = {**DEMO_JOB, "training": {**DEMO_JOB["training"],
                                     "checkpoint": {**DEMO_JOB["training"]["checkpoint"],
                                                    "uri": f"file://{base}/runs/demo/ckpt"}}}
    return SubmitRequest(job=parse_job(data, "demo job"), cluster="local", ledger=str(base / "ledger.db"),
                         evaluation="in-flow", device="cpu", run_dir=str(base / "runs" / "demo"),
                         history_dir=str(base / "evals"), max_wait_s=600)


def cmd_demo(args: argparse.Namespace) -> int:
    from cli.console import run_submit
    from tasks.outdir import check_writable

    base = Path(args.dir)
    if base.exists() and not base.is_dir():
        raise FrenzyError(f"--dir {base} is a file; give a directory for the demo (default ./frenzy-demo)")
    check_writable(base, "--dir")
    for old in (base / "runs" / "demo", base / "evals" / "demo"):  # the demo's own previous run, nothing else
        if old.exists():
            print(f"removing the previous demo run {old}", file=sys.stderr)
            shutil.rmtree(old)
    print(f"frenzy demo: plan -> place -> train -> evaluate -> analyse -> release, everything under {base}/ "
          "(about 1.5 minutes on 2 cores)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    res = run_submit("demo", demo_request(base))
    if res is None:
        return 130
    emit(args, _result_doc(res), lambda: _human(res, time.monotonic() - t0))
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("submit", cmd_submit, "Run a job end to end: plan, place, train with evaluations of each checkpoint, "
             "straggler analysis, GPUs released; prints where the results are.")
    sp.add_argument("job", help="job YAML file")
    sp.add_argument("--cluster", default="local", help="cluster preset or YAML (default local: this machine; with "
                    "--executor ray, the Ray cluster's nodes)")
    sp.add_argument("--executor", default="local",
                    help="local (processes on this machine, default), ray (the Ray cluster this machine joined, or "
                         "$RAY_ADDRESS) or ray://HOST:PORT: the allocation's ranks as Ray actors on its nodes")
    sp.add_argument("--ledger", help="SQLAlchemy URL or SQLite path (default $FRENZY_LEDGER or ~/.frenzy/ledger.db)")
    sp.add_argument("--suite", help="evaluation suite (core, quick or a YAML; default the job's, else core)")
    sp.add_argument("--evaluation", choices=["auto", "in-flow", "deployment", "off"], default="auto",
                    help="where checkpoints are evaluated (default auto: the evaluate-on-checkpoint deployment when "
                         "the Prefect server has it, else in this run)")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="default: CUDA when allocated")
    sp.add_argument("--max-wait", type=bounded_float(0.0, 30 * 86400.0), default=3600.0,
                    help="seconds to wait in the queue, 0 to 30 days (default 3600)")
    sp.add_argument("--run-dir", help="progress, log, traces and report (default runs/<job name>)")
    sp.add_argument("--history-dir", default="evals",
                    help="evaluation results and the per-run score history (default ./evals; on Ray, a directory "
                         "every node sees)")
    sp.add_argument("--lease", type=bounded_float(5.0, 86400.0), default=60.0,
                    help="allocation lease in seconds, 5 to 86400: a crashed run's GPUs come back this long after it "
                         "died (60)")
    sp.add_argument("--max-restarts", type=bounded_int(0, 20), default=2,
                    help="automatic recoveries from training failures, diagnosed from the log (default 2)")
    sp.add_argument("--hang", type=bounded_float(5.0, 86400.0), default=900.0,
                    help="seconds without a progress record after which the trainer counts as hung (900)")

    sp = add("demo", cmd_demo, "The whole pipeline on this machine with embedded defaults, ending in a run report.")
    sp.add_argument("--dir", default="frenzy-demo", help="where everything goes (default ./frenzy-demo)")
