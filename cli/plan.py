"""`frenzy plan` and `frenzy memory`: MARP's ranked resource plans and one layout's predicted peak memory."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cli.argtypes import bounded_int
from cli.output import emit, table
from cluster.catalog import default_catalog
from cluster.inventory import load_cluster
from tasks.jobspec import JobSpec, JobSpecError, load_job, parse_job
from tasks.planning.layout import Layout, check_layout
from tasks.planning.memory import GiB


def _job_or_model_dir(args: argparse.Namespace) -> JobSpec:
    """A job YAML, or a Hugging Face model directory planned as a job; --seq-len / --global-batch override the job's
    (a model directory: default its context, at most 4096, and 8)."""
    import os
    from pathlib import Path

    from cli.fields import apply_overrides, overridden

    over = overridden(args)
    p = Path(args.job).expanduser()
    if p.is_dir() and os.path.lexists(p / "config.json"):  # a FIFO or a loop there is named by read_config
        from tasks.hf.config import max_positions

        return parse_job({"name": p.resolve().name[:128] or "model", "model": {"hf": str(p)},
                          "training": {"seq_len": over.get("training.seq_len") or min(max_positions(p), 4096),
                                       "global_batch": over.get("training.global_batch") or 8}}, str(p))
    return apply_overrides(load_job(args.job), over)


def cmd_plan(args: argparse.Namespace) -> int:
    from cli.fields import build, given
    from tasks.planning.calibration import load_observations
    from tasks.planning.plans import plan_resources
    from tasks.planning.request import PlanRequest

    req = build(PlanRequest, {"job": _job_or_model_dir(args), **given(args, PlanRequest, skip={"job"})})
    job, cluster = req.job, load_cluster(req.cluster)
    plans = plan_resources(job, cluster, rank_by=req.rank_by, margin=req.margin, top=req.top or None,
                           observations=load_observations())
    doc = {"job": job.name, "model": job.model.display_name, "cluster": cluster.name, "rank_by": req.rank_by,
           "plans": [p.model_dump(mode="json") for p in plans]}

    def human() -> str:
        rows = [{"rank": p.rank, "gpu": p.gpu_type, "gpus": p.gpus, "layout": p.layout.label(),
                 "peak GiB": f"{p.predicted_device_gib:.1f}", "min GiB": f"{p.min_gpu_memory_gib:.1f}",
                 "step s": f"{p.est_step_time_s:.3f}", "GPU-s/step": f"{p.gpu_seconds_per_step:.3f}",
                 "tok/s": f"{p.tokens_per_s:,.0f}"} for p in plans]
        cal = plans[0].memory_calibration if plans else 1.0
        note = (f"\npredicted peaks include x{cal:.3f} learned from recorded out-of-memory failures of this model "
                "($FRENZY_HOME/oom-observations.jsonl)") if cal > 1.0 else ""
        return (f"{job.name}: {job.model.display_name}, global batch {job.training.global_batch} x "
                f"{job.training.seq_len} tokens on {cluster.name} (ranked by {req.rank_by})\n" + table(rows) + note)

    emit(args, doc, human)
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

    emit(args, doc, human)
    return 0



def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    from cli.fields import add_fields, add_overrides
    from tasks.planning.request import PlanRequest

    sp = add("plan", cmd_plan)
    sp.add_argument("job", help="job YAML file, or a Hugging Face model directory (config.json)")
    add_overrides(sp, JobSpec, {"--seq-len": "training.seq_len", "--global-batch": "training.global_batch"})
    add_fields(sp, PlanRequest, skip={"job"})

    sp = add("memory", cmd_memory)
    sp.add_argument("job", help="job YAML file")
    for flag, default, what in (("--dp", 1, "data-parallel degree"), ("--tp", 1, "tensor-parallel degree"),
                                ("--pp", 1, "pipeline-parallel degree"), ("--micro-batch", 1, "sequences per GPU"),
                                ("--vpp", 1, "virtual pipeline stages (interleaved 1F1B)")):
        sp.add_argument(flag, type=bounded_int(1, 1 << 20), default=default, help=f"{what} (default {default})")
    sp.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (tp > 1)")
    sp.add_argument("--gpu", help="GPU catalog name: calibrates overheads and reports whether it fits")
