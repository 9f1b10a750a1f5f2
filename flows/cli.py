"""The `frenzy` command. Every command that computes something takes `--json` and then prints exactly one
JSON document on stdout; without it, a table. Errors go to stderr with exit status 2 and name the fix."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cluster.catalog import CatalogError, default_catalog
from cluster.inventory import PRESETS, InventoryError, load_cluster
from tasks.jobspec import JobSpecError, load_job
from tasks.planning.layout import Layout, check_layout
from tasks.planning.memory import GiB
from tasks.planning.plans import InfeasibleJobError
from tasks.presets import MODEL_PRESETS

EXAMPLE_CLUSTER = "frenzy-testbed"


def table(rows: list[dict[str, Any]], cols: Sequence[str] | None = None) -> str:
    """A plain fixed-width table."""
    if not rows:
        return "(none)"
    cols = list(cols or rows[0].keys())
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*cols), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in cells])


def _emit(args: argparse.Namespace, doc: Any, human: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(human())


def cmd_plan(args: argparse.Namespace) -> int:
    from tasks.planning.plans import plan_resources

    job = load_job(args.job)
    cluster = load_cluster(args.cluster)
    plans = plan_resources(job, cluster, rank_by=args.rank_by, margin=args.margin, top=args.top)
    doc = {"job": job.name, "model": job.model.display_name, "cluster": cluster.name, "rank_by": args.rank_by,
           "plans": [p.model_dump(mode="json") for p in plans]}

    def human() -> str:
        rows = [{"rank": p.rank, "gpu": p.gpu_type, "gpus": p.gpus, "layout": p.layout.label(),
                 "peak GiB": f"{p.predicted_device_gib:.1f}", "min GiB": f"{p.min_gpu_memory_gib:.1f}",
                 "step s": f"{p.est_step_time_s:.3f}", "GPU-s/step": f"{p.gpu_seconds_per_step:.3f}",
                 "tok/s": f"{p.tokens_per_s:,.0f}"} for p in plans]
        return (f"{job.name}: {job.model.display_name}, global batch {job.training.global_batch} x "
                f"{job.training.seq_len} tokens on {cluster.name} (ranked by {args.rank_by})\n" + table(rows))

    _emit(args, doc, human)
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    from tasks.planning.baselines import frenzy_formula_bytes, megatron_formula_bytes
    from tasks.planning.memory import predict_peak_memory

    job = load_job(args.job)
    lay = Layout(dp=args.dp, tp=args.tp, pp=args.pp, micro_batch=args.micro_batch, vpp=args.vpp,
                 sequence_parallel=args.sequence_parallel)
    problem = check_layout(job, lay)
    if problem:
        raise JobSpecError(f"layout {lay.label()} cannot run {args.job}: {problem}")
    gpu = default_catalog().get(args.gpu) if args.gpu else None
    est = predict_peak_memory(job, lay, gpu)
    doc = {"model": job.model.display_name, "layout": lay.model_dump(), "gpu": gpu.name if gpu else None,
           **est.model_dump(),
           "baselines": {"frenzy_paper_bytes": int(frenzy_formula_bytes(job, lay)),
                         "megatron_theory_bytes": int(megatron_formula_bytes(job, lay))}}
    if gpu:
        doc["fits"] = est.device_bytes <= gpu.memory_gib * GiB

    def human() -> str:
        rows = [{"term": k, "GiB": f"{v / GiB:.3f}"} for k, v in est.breakdown.items() if v]
        tot = [{"total": "allocated", "GiB": f"{est.allocated_bytes / GiB:.2f}"},
               {"total": "reserved", "GiB": f"{est.reserved_bytes / GiB:.2f}"},
               {"total": "device (nvidia-smi)", "GiB": f"{est.device_bytes / GiB:.2f}"},
               {"total": "Frenzy paper formula", "GiB": f"{doc['baselines']['frenzy_paper_bytes'] / GiB:.2f}"},
               {"total": "Megatron theory", "GiB": f"{doc['baselines']['megatron_theory_bytes'] / GiB:.2f}"}]
        head = f"{job.model.display_name} at {lay.label()}: peak at {est.peak_phase} (stage {est.stage})"
        return head + "\n" + table(rows) + "\n\n" + table(tot)

    _emit(args, doc, human)
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    gpus = [g.model_dump(exclude={"aliases"}) for g in default_catalog().gpus.values()]
    _emit(args, {"gpus": gpus}, lambda: table(gpus, ["name", "memory_gib", "bf16_tflops", "fp16_tflops",
                                                     "mem_bw_gbs", "link", "link_gbs"]))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from tasks.jobspec import ModelSpec
    from tasks.planning.layout import count_params

    rows = []
    for name in MODEL_PRESETS:
        m = ModelSpec(preset=name)
        rows.append({"preset": name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
                     "kv_heads": m.n_kv_heads, "ffn": m.ffn, "vocab": m.vocab, "mlp": m.mlp,
                     "params_m": round(count_params(m, 2048).total / 1e6, 1)})
    _emit(args, {"presets": rows}, lambda: table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="frenzy", description="Serverless LLM development on heterogeneous GPUs.")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        sp.set_defaults(fn=fn)
        return sp

    sp = add("plan", cmd_plan, "Rank the GPU types and counts that can train a job (MARP).")
    sp.add_argument("job", help="job YAML file")
    sp.add_argument("--cluster", default=EXAMPLE_CLUSTER,
                    help=f"cluster YAML file or preset ({', '.join(PRESETS)}, local); default {EXAMPLE_CLUSTER}")
    sp.add_argument("--rank-by", choices=["gpu_seconds", "time"], default="gpu_seconds",
                    help="gpu_seconds: GPU-seconds per step (efficiency, default); time: step time")
    sp.add_argument("--margin", type=float, default=0.05, help="fraction of GPU memory kept free (default 0.05)")
    sp.add_argument("--top", type=int, default=10, help="show the best N plans (default 10; 0 = all)")

    sp = add("memory", cmd_memory, "Predict peak GPU memory of a job under one parallel layout.")
    sp.add_argument("job", help="job YAML file")
    for flag, default, what in (("--dp", 1, "data-parallel degree"), ("--tp", 1, "tensor-parallel degree"),
                                ("--pp", 1, "pipeline-parallel degree"), ("--micro-batch", 1, "sequences per GPU"),
                                ("--vpp", 1, "virtual pipeline stages (interleaved 1F1B)")):
        sp.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    sp.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (tp > 1)")
    sp.add_argument("--gpu", help="GPU catalog name: calibrates overheads and reports whether it fits")

    add("gpus", cmd_gpus, "List the GPU catalog.")
    add("presets", cmd_presets, "List the built-in model presets.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "top", None) == 0:
        args.top = None
    try:
        return args.fn(args)
    except (JobSpecError, InventoryError, CatalogError, InfeasibleJobError, ValueError) as err:
        print(f"frenzy {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
