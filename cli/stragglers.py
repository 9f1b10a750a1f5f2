"""`frenzy stragglers analyze|generate`: the what-if analysis of a training op trace, or a synthetic trace."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.argtypes import bounded_float, bounded_int
from cli.output import emit, progress
from tasks.errors import FrenzyError


def _flag_error(e: Any) -> str:
    """A SynthSpec validation error named by its flag: `--slow-worker (factor)`, not a field path."""
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:
        return msg
    flag, rest = f"--{str(e['loc'][0]).replace('_', '-')}", ".".join(str(p) for p in e["loc"][1:])
    return f"{flag}{f' ({rest})' if rest else ''}: {msg}"


def _numbers(text: str, what: str, count: int | None = None) -> list[float]:
    """`text` as finite numbers separated by commas (exactly `count` of them when given)."""
    try:
        xs = [float(x) for x in text.split(",")]
    except ValueError:
        xs = []
    if not xs or not all(math.isfinite(x) for x in xs) or (count is not None and len(xs) != count):
        n = f"{count} " if count else ""
        raise FrenzyError(f"{what} takes {n}finite numbers separated by commas, got {text!r}")
    return xs


def _implicit_meta(trace: Path) -> Path | None:
    """The meta YAML `analyze` reads when --meta is not given (an input an output must not overwrite)."""
    from tasks.stragglers.trace import TraceError, find_meta

    try:
        return find_meta(trace / "trace.parquet" if trace.is_dir() else trace)
    except TraceError:
        return None


def cmd_stragglers(args: argparse.Namespace) -> int:
    if args.action == "generate":
        if Path(args.path).is_dir():
            raise FrenzyError(f"{args.path} is a directory; give the .parquet file to write (its meta YAML goes beside)")
        from tasks.outdir import check_file_target
        from tasks.stragglers.synth import SynthSpec, generate
        from tasks.stragglers.trace import write_trace

        check_file_target(args.path, "stragglers generate")  # before the work: its directory must exist

        spec: dict[str, Any] = {"schedule": args.schedule, "dp": args.dp, "pp": args.pp, "vpp": args.vpp,
                                "microbatches": args.microbatches, "steps": args.steps, "dp_mode": args.dp_mode,
                                "seq_imbalance": args.seq_imbalance, "seed": args.seed, "noise": args.noise}
        if args.slow_worker:
            d, st, f = _numbers(args.slow_worker, "--slow-worker DP,STAGE,FACTOR", 3)
            spec["slow_worker"] = {"dp": int(d), "stage": int(st), "factor": f}
        for flag, key in ((args.slow_stage, "slow_stage"), (args.slow_link, "slow_link")):
            if flag:
                st, f = _numbers(flag, f"--{key.replace('_', '-')} STAGE,FACTOR", 2)
                spec[key] = {"stage": int(st), "factor": f}
        from pydantic import ValidationError

        try:
            sp = SynthSpec.model_validate(spec)
        except ValidationError as err:
            raise FrenzyError("stragglers generate: " + "; ".join(_flag_error(e) for e in err.errors())) from None
        run = generate(sp)
        path = write_trace(Path(args.path), run.columns(), sp.meta, overwrite=args.overwrite)
        doc = {"trace": str(path), "meta": sp.meta.model_dump(), "ops": int(sum(d.size for d in run.durs)),
               "true_slowdown": run.truth(), "spec": sp.model_dump()}
        emit(args, doc, lambda: f"wrote {doc['ops']:,} ops to {path} (true slowdown {doc['true_slowdown']:.3f})")
        return 0

    from tasks.outdir import check_file_target
    from tasks.stragglers.analyze import analyze_path
    from tasks.stragglers.report import heatmap, markdown, timeline

    inputs = (args.path, args.meta or _implicit_meta(Path(args.path)))
    for flag, out in (("--heatmap", args.heatmap), ("--timeline", args.timeline)):
        if out:  # before the analysis: a wrong path should not cost its minutes
            check_file_target(out, f"stragglers analyze {flag}", inputs, overwrite=args.overwrite)
    res, prep = analyze_path(args.path, args.meta, progress=progress)
    doc = res.model_dump()
    if args.heatmap:
        doc["heatmap"] = str(heatmap(res, args.heatmap, inputs=inputs, overwrite=args.overwrite))
    if args.timeline:
        ranks = [int(x) for x in _numbers(args.timeline_dp_ranks, "--timeline-dp-ranks")] if args.timeline_dp_ranks \
            else None
        doc["timeline"] = str(timeline(prep, args.timeline, first_step=args.timeline_step,
                                       n_steps=args.timeline_steps, dp_ranks=ranks,
                                       inputs=inputs, overwrite=args.overwrite))
    emit(args, doc, lambda: markdown(res) + "".join(f"\n{k}: {doc[k]}" for k in ("heatmap", "timeline") if k in doc))
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("stragglers", cmd_stragglers)
    sp.add_argument("action", choices=["analyze", "generate"])
    sp.add_argument("path", help="analyze: trace parquet (or its directory); generate: the parquet file to write")
    sp.add_argument("--meta", help="analyze: the job's meta YAML (default: the one meta*.yaml beside the trace)")
    sp.add_argument("--heatmap", help="analyze: write the DP x PP slowdown heatmap (PNG) here")
    sp.add_argument("--timeline", help="analyze: write a Perfetto/Chrome trace of original vs ideal (.json.gz) here")
    sp.add_argument("--timeline-step", type=bounded_int(0, 10**12),
                    help="first step of the timeline window (default: the first); a step of the trace")
    sp.add_argument("--timeline-steps", type=bounded_int(1, 1000), default=3,
                    help="steps in the timeline window, 1-1000 (default 3)")
    sp.add_argument("--timeline-dp-ranks", help="DP ranks in the timeline, e.g. 0,5 (default: the first 8)")
    sp.add_argument("--overwrite", action="store_true",
                    help="replace an existing output file (generate: the trace; analyze: --heatmap, --timeline)")
    sp.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default="1f1b", help="generate: schedule")
    for flag, default, (lo, hi), what in (("--dp", 4, (1, 4096), "DP ranks"), ("--pp", 4, (1, 127), "pipeline stages"),
                                          ("--vpp", 1, (1, 64), "chunks per stage (interleaved; default 2 there)"),
                                          ("--microbatches", 8, (1, 127), "micro-batches per step"),
                                          ("--steps", 10, (1, 100_000), "steps"), ("--seed", 0, (0, 2**31 - 1), "random seed")):
        sp.add_argument(flag, type=bounded_int(lo, hi), default=default,
                        help=f"generate: {what}, {lo}-{hi} (default {default})")
    sp.add_argument("--dp-mode", choices=["allreduce", "zero"], default="allreduce",
                    help="generate: gradient all-reduce at the end of the step, or per-chunk all-gather/reduce-scatter")
    sp.add_argument("--noise", type=bounded_float(0.0, 0.5), default=0.02,
                    help="generate: relative s.d. of op durations, 0-0.5 (0.02)")
    sp.add_argument("--slow-worker", help="generate: DP,STAGE,FACTOR, e.g. 1,2,1.3")
    sp.add_argument("--slow-stage", help="generate: STAGE,FACTOR")
    sp.add_argument("--slow-link", help="generate: STAGE,FACTOR (the link from STAGE to STAGE+1)")
    sp.add_argument("--seq-imbalance", type=bounded_float(0.0, 2.0), default=0.0,
                    help="generate: s.d. of log compute time per (step, DP rank), 0-2, e.g. 0.1")
