"""The evaluation commands of `frenzy`: `evaluate`, `eval-plan` and `eval-datasets`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator

from cli.argtypes import bounded_float, bounded_int
from cli.output import emit, table


def cmd_eval_plan(args: argparse.Namespace) -> int:
    from tasks.evaluation.schedule import plan
    from tasks.evaluation.suite import load_suite

    suite = load_suite(args.suite)
    if suite.lmeval is not None:  # lm-eval tasks: one dataset per task, counted by loading them
        from tasks.evaluation.lmeval.source import expand

        suite = expand(suite)
    p = plan(suite, args.nodes, args.gpus_per_node, args.cpu_workers_per_node)
    doc = p.model_dump(mode="json", exclude={"naive_trials"} if not args.naive_trials else set())

    def human() -> str:
        rows = [{"trial": t.id, "node": t.node, "gpu": t.gpu, "start s": f"{t.start_s:.0f}", "end s": f"{t.end_s:.0f}",
                 "GPU s": f"{t.infer_s:.0f}", "CPU s": f"{t.metric_s:.0f}",
                 "chunks": ", ".join(f"{c.dataset}[{c.start}:{c.stop}]" for c in t.chunks[:3]) +
                 (f" +{len(t.chunks) - 3}" if len(t.chunks) > 3 else "")} for t in p.trials]
        return (f"suite {suite.name}: {len(suite.datasets)} datasets on {args.nodes} node(s) x {args.gpus_per_node} "
                f"GPUs, {p.cpu_workers_per_node} CPU workers per node\n"
                f"naive makespan   {p.naive_makespan_s:10.0f} s  (one trial per dataset, remote loads, metrics on GPU)\n"
                f"elastic makespan {p.elastic_makespan_s:10.0f} s  ({p.speedup:.2f}x; granularity {p.granularity}, "
                f"order {p.order})\n"
                f"lower bound      {p.lower_bound_s:10.0f} s  (elastic is {100 * p.gap_to_bound:.1f}% above)\n\n"
                + table(rows))

    emit(args, doc, human)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from cli.fields import build, given
    from tasks.evaluation.request import EvaluateRequest
    from tasks.evaluation.suite import load_suite

    req = build(EvaluateRequest, given(args, EvaluateRequest))
    suite = load_suite(req.suite)
    from tasks.evaluation import warmstart

    if req.schedule == "elastic" and req.executor == "local":  # the model copy's process starts beside our imports
        warmstart.start_precursor(req.device)
    from tasks.evaluation.record import evaluate_and_record

    def progress(msg: str, frac: float) -> None:
        print(f"[{100 * frac:5.1f}%] {msg}", file=sys.stderr, flush=True)

    try:
        with _stop_cleanly_on_sigterm(), _full_disk_names_the_flags(req.out_dir):
            res, summary = evaluate_and_record(req.uri, suite, req.options(), req.history_dir, progress,
                                               req.reevaluate, overwrite=req.overwrite)
    finally:
        warmstart.discard_precursor()  # not taken: the evaluation failed before its copy, or was recorded already
    doc = res.model_dump(mode="json") | {"history_plot": summary.history_plot}

    def human() -> str:
        rows = [{"dataset": ds, "metric": k, "value": f"{v:.4f}"} for ds, ms in res.scores.items() for k, v in ms.items()]
        ran = f"{res.schedule}, ran {res.ran}" if res.ran and res.ran != res.schedule else res.schedule
        return (f"{res.run} step {res.step} on {suite.name} ({ran}): makespan {res.makespan_s:.1f}s "
                f"(predicted {res.predicted_makespan_s:.1f}s)\n" + table(rows)
                + "".join(f"\n{ds}: FAILED (not scored): {why}" for ds, why in res.failed.items())
                + f"\n\nresults: {res.out_dir}" + (f"\n{res.kept_earlier}" if res.kept_earlier else ""))

    emit(args, doc, human)
    if res.failed:  # the others are scored and recorded; the step stays pending for `evaluate-pending`
        print(f"frenzy evaluate: {len(res.failed)} dataset(s) not scored: "
              f"{', '.join(res.failed)} (causes above; logs in {res.out_dir}/trials)", file=sys.stderr)
        if res.kept_earlier:
            print(f"frenzy evaluate: {res.kept_earlier}", file=sys.stderr)
        return 2
    return 0


@contextlib.contextmanager
def _full_disk_names_the_flags(out_dir: str | None = None) -> Iterator[None]:
    """A full disk (or quota) while evaluating: its message (the path that filled, `free space there`) also names
    where else this command can write (red team 41n C4: `[Errno 28] No space left on device` was all it said); a
    read-only file system names the option of the directory it refused (`--out-dir` when it is under the one given,
    else `--history-dir`)."""
    import errno

    from tasks.errors import EnvironmentProblem, causes, environment_problem

    try:
        yield
    except (EnvironmentProblem, OSError) as err:  # (a bare OSError: a lock the history's file system refused)
        hit = next((c for c in causes(err) if isinstance(c, OSError) and c.errno in (errno.ENOSPC, errno.EDQUOT,
                                                                                         errno.EROFS)), None)
        said = str(err) if isinstance(err, EnvironmentProblem) else environment_problem(err)
        if hit is None or said is None:
            raise
        if hit.errno == errno.EROFS:
            flag = ("--history-dir" if not out_dir else "--out-dir" if _under(hit.filename, out_dir) else
                    "--history-dir" if hit.filename else "--out-dir or --history-dir")
            old, fix = "give a writable location", f"give a writable location with {flag}"
        else:
            old, fix = ("free space there or write somewhere else",
                        "free space there, or point --out-dir and --history-dir at another disk")
        text = said.replace(old, fix)
        raise EnvironmentProblem(text if fix in text else f"{text}; {fix}") from err


def _under(path: object, top: str) -> bool:
    """Whether `path` (an OSError's filename) is `top`, inside it, or one of its siblings made while writing it
    (`.TOP.tmp-PID`, `TOP.failed`)."""
    from pathlib import Path

    if not isinstance(path, str | Path):
        return False
    p, t = Path(path).expanduser().absolute(), Path(top).expanduser().absolute()
    return any(q == t or (q.parent == t.parent and q.name.startswith((f".{t.name}.", f"{t.name}.")))
               for q in (p, *p.parents))


@contextlib.contextmanager
def _stop_cleanly_on_sigterm() -> Iterator[None]:
    """While it is held, SIGTERM (`kill`, a batch system's stop) ends the evaluation as Ctrl-C does: its trials'
    process groups killed, its shared-memory copy removed, exit 143. Without it the process died at once, its trials
    (in groups of their own) ended only by their parent-death watch and the copy left for the next evaluation to
    sweep. The previous handler is put back after (a caller in Python keeps its own)."""
    import signal
    import threading

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)  # None: not set from Python


def cmd_eval_datasets(args: argparse.Namespace) -> int:
    from tasks.evaluation.datasets import describe
    from tasks.evaluation.suite import builtin_suites

    infos = describe(check=args.check, timeout_s=args.plugin_timeout_s)
    doc = {"datasets": [d.to_json() for d in infos], "suites": builtin_suites()}
    bad = [f"{d.name}: {d.check}" for d in infos if d.check not in ("", "ok")]
    cols = None if args.check else [c for c in doc["datasets"][0] if c != "check"] if doc["datasets"] else None
    emit(args, doc, lambda: table(doc["datasets"], cols) + f"\n\nsuites: {', '.join(doc['suites'])}"
         + "".join(f"\ncannot be used: {b}" for b in bad))
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    def shape(sp: argparse.ArgumentParser, gpus: int) -> None:
        sp.add_argument("--nodes", type=bounded_int(1, 4096), default=1, help="nodes, 1-4096 (default 1)")
        sp.add_argument("--gpus-per-node", type=bounded_int(1, 64), default=gpus,
                        help=f"GPUs (inference slots) per node, 1-64 ({gpus})")
        sp.add_argument("--cpu-workers-per-node", type=bounded_int(1, 1024),
                        help="metric jobs at once per node (default: the suite's)")

    sp = add("eval-plan", cmd_eval_plan)
    sp.add_argument("--suite", required=True, help="built-in suite name (core, acme63) or suite YAML")
    shape(sp, 8)
    sp.add_argument("--naive-trials", action="store_true", help="include the naive schedule's trials in the JSON")

    from cli.fields import add_fields
    from tasks.evaluation.request import EvaluateRequest

    sp = add("evaluate", cmd_evaluate)
    add_fields(sp, EvaluateRequest, positional={"uri"})

    from tasks.evaluation.suite import PLUGIN_TIMEOUT_S

    sp = add("eval-datasets", cmd_eval_datasets)
    sp.add_argument("--check", action="store_true",
                    help="import each installed plugin (in a process of its own) to list its mode and priors, and "
                         "name the ones that fail; without it plugins are listed from their packages' metadata only")
    sp.add_argument("--plugin-timeout-s", type=bounded_float(0.1, 86400.0), default=PLUGIN_TIMEOUT_S,
                    help=f"--check: seconds each plugin's import may take before it is named as hung "
                         f"(default {PLUGIN_TIMEOUT_S:g}, a suite's plugin_timeout_s default)")
