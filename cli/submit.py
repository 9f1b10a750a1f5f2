"""The pipeline commands of `frenzy`: `submit` (one job end to end) and `demo` (the whole pipeline on this
machine with embedded defaults). Both call the `submit` flow, the same one the deployment runs."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cli.output import emit, table
from tasks.errors import FrenzyError

if TYPE_CHECKING:
    from tasks.evaluation.summary import EvalSummary

DEMO_JOB = {
    "name": "demo",
    "model": {"preset": "gpt-tiny"},
    "training": {"seq_len": 128, "global_batch": 16, "precision": "fp32", "steps": 400, "lr": 3e-3,
                 "log_every_steps": 20, "trace_every_steps": 20,
                 "checkpoint": {"every_steps": 100, "keep": 8}},
    "evaluation": {"suite": "quick"},
}
"""The demo's job: a byte-level model small enough to learn visibly on two CPU cores in a minute."""

DEMO_TIME = "60 s"
"""What the banner promises; README.md and benchmarks/results/pipeline.md give the measured range (a test holds them
together)."""


def _result_doc(res: object) -> dict:
    return res.model_dump(mode="json")  # type: ignore[attr-defined]


def _human(res: object, wall_s: float) -> str:
    from tasks.pipeline.request import SubmitResult
    from tasks.report import straggler_line  # here: it imports torch, which a refused job never needs

    assert isinstance(res, SubmitResult)
    p, a, t = res.plan, res.allocation, res.train
    lines = [f"{res.job}: {t.final_step} steps on {p.gpus} x {p.gpu_type} ({p.layout.label()}), placed on "
             + ", ".join(f"{n.node}{n.gpu_indices}" for n in a.nodes)
             + f"; last loss {t.last_loss:.3f}, {t.tokens_per_s:,.0f} tok/s; {len(t.checkpoints)} checkpoints"
             + (f"; {t.spike_counts.summary()}" if t.spike_counts.summary() else "")
             + (" (it had already finished: nothing trained again)" if res.already_finished else ""),
             "", "scores by checkpoint:", scores_table(res.evaluations, res.report), ""]
    lines += [f"note: {n}" for n in res.notes]
    lines += [f.line() for f in res.evaluation_failures]
    lines += [line for e in res.evaluations for line in e.failed_lines()]
    for r in res.recoveries:
        lines.append(f"recovered: {r.diagnosis.type} ({r.diagnosis.category}) -> {r.action.kind}: {r.action.reason}")
    if res.stragglers:
        lines.append(f"stragglers: {straggler_line(res.stragglers)}")  # the report's words: a worst op only if one straggled
    lines += [f"GPUs released: {'yes' if res.released else 'NO'}", f"checkpoints: {t.checkpoint_uri}",
              f"report: {res.report}", f"({wall_s:.0f} s)"]
    return "\n".join(lines)


TABLE_WIDTH = 120
"""The widest the summary's scores table is printed as one row per checkpoint; a wider one (many datasets) is turned
to one row per dataset and metric, with as many of the newest checkpoints as fit."""


def scores_table(evaluations: Sequence[EvalSummary], report: str | None, width: int = TABLE_WIDTH) -> str:
    """The summary's "scores by checkpoint" table, readable in a terminal for any number of datasets (red team 41g
    S09: 40 datasets made a 41-column table about 750 characters wide). Every score is in the report."""
    cols = list(dict.fromkeys(f"{ds} {m}" for e in evaluations for ds, ms in e.scores.items() for m in ms))
    vals = {e.step: {f"{ds} {m}": f"{v:.4g}" for ds, ms in e.scores.items() for m, v in ms.items()} for e in evaluations}
    wide = table([{"step": s, **v} for s, v in vals.items()], ["step", *cols])
    if max(len(line) for line in wide.splitlines()) <= width:
        return wide
    steps: list[int] = []
    for s in sorted(vals, reverse=True):  # the newest checkpoints first, as many as fit (one at least)
        tall = table([{"dataset metric": c, **{f"step {t}": vals[t].get(c, "") for t in sorted([s, *steps])}}
                      for c in cols])
        if steps and max(len(line) for line in tall.splitlines()) > width:
            break
        steps.append(s)
    rows = [{"dataset metric": c, **{f"step {t}": vals[t].get(c, "") for t in sorted(steps)}} for c in cols]
    left = len(vals) - len(steps)
    return table(rows) + (f"\n(the newest {len(steps)} of {len(vals)} checkpoints; the report has every one: {report})"
                          if left else "")


def _check_inputs(req: object) -> None:
    """What the user gave, checked before anything is placed or trained: the suite, a cluster file, where the results
    go, and last the ledger (a mistyped --ledger must not become a new, empty cluster)."""
    from cluster.inventory import PRESETS, load_cluster
    from cluster.ledger import require_existing
    from tasks.evaluation.suite import load_suite
    from tasks.outdir import check_writable
    from tasks.pipeline.request import SubmitRequest
    from tasks.training.data import check_cache

    assert isinstance(req, SubmitRequest)
    if req.suite:
        load_suite(req.suite)
    if req.cluster not in (*PRESETS, "local", "ray") and not req.cluster.startswith("ray://"):
        load_cluster(req.cluster)
    check_writable(req.run_dir or "", "--run-dir")
    check_writable(req.history_dir, "--history-dir")
    check_cache()  # the trainer's corpus cache: an unusable HOME is named here, not after placement
    require_existing(req.ledger)


def cmd_submit(args: argparse.Namespace) -> int:
    from cli.console import run_submit
    from cli.fields import build, given
    from tasks.jobspec import load_job
    from tasks.paths import job_dir
    from tasks.pipeline.request import SubmitRequest

    req = build(SubmitRequest, {"job": load_job(args.job), **given(args, SubmitRequest, skip={"job"})})
    req = req.resolved(Path.cwd(), job_base=job_dir(args.job))  # the job's paths are relative to its file
    _check_inputs(req)
    t0 = time.monotonic()
    res = run_submit("submit", req)
    if res is None:
        return 130
    emit(args, _result_doc(res), lambda: _human(res, time.monotonic() - t0))
    # trained, but a step's evaluation (or one of its datasets) failed: the cause is printed
    return 2 if res.evaluation_failures or any(e.failed for e in res.evaluations) else 0


def demo_request(base: Path) -> object:
    """The demo's SubmitRequest, everything under `base` (its own ledger, run, checkpoints and evaluations)."""
    from tasks.jobspec import parse_job
    from tasks.pipeline.request import SubmitRequest

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
          f"(about {DEMO_TIME} on 2 idle cores)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    res = run_submit("demo", demo_request(base))
    if res is None:
        return 130
    emit(args, _result_doc(res), lambda: _human(res, time.monotonic() - t0))
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    from cli.fields import add_fields
    from tasks.pipeline.request import SubmitRequest

    sp = add("submit", cmd_submit)
    sp.add_argument("job", help="job YAML file")
    add_fields(sp, SubmitRequest, skip={"job"})

    sp = add("demo", cmd_demo)
    sp.add_argument("--dir", default="frenzy-demo", help="where everything goes (default ./frenzy-demo)")
