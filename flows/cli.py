"""The `frenzy` command. Every command that computes something takes `--json` and then prints exactly one
JSON document on stdout; without it, a table. Errors go to stderr with exit status 2 and name the fix."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, get_args

from cluster.catalog import CatalogError, default_catalog
from cluster.inventory import PRESETS, InventoryError, load_cluster
from cluster.traces import ALL_POLICIES, POLICIES, REFERENCE_GPU
from flows.cli_data import add_commands as add_data_commands
from flows.cli_diagnose import add_commands as add_diagnose_commands
from flows.cli_eval import add_commands as add_eval_commands
from flows.cli_submit import add_commands as add_submit_commands
from flows.cli_types import bounded_float, bounded_int
from tasks.jobspec import JobSpec, JobSpecError, load_job, parse_job
from tasks.planning.layout import Layout, check_layout
from tasks.planning.memory import GiB
from tasks.planning.plans import InfeasibleJobError, RankBy
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


def _job_or_model_dir(args: argparse.Namespace) -> JobSpec:
    """A job YAML, or a Hugging Face model directory planned as a job (with --seq-len / --global-batch)."""
    from pathlib import Path

    p = Path(args.job).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        from tasks.hf.config import max_positions

        job = parse_job({"name": p.resolve().name[:128] or "model", "model": {"hf": str(p)},
                         "training": {"seq_len": args.seq_len or min(max_positions(p), 4096),
                                      "global_batch": args.global_batch or 8}}, str(p))
    else:
        job = load_job(args.job)
        if args.seq_len:
            job.training.seq_len = args.seq_len
        if args.global_batch:
            job.training.global_batch = args.global_batch
    return job


def cmd_plan(args: argparse.Namespace) -> int:
    from tasks.planning.plans import plan_resources

    job = _job_or_model_dir(args)
    cluster = load_cluster(args.cluster)
    from tasks.planning.calibration import load_observations

    plans = plan_resources(job, cluster, rank_by=args.rank_by, margin=args.margin, top=args.top,
                           observations=load_observations())
    doc = {"job": job.name, "model": job.model.display_name, "cluster": cluster.name, "rank_by": args.rank_by,
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
                f"{job.training.seq_len} tokens on {cluster.name} (ranked by {args.rank_by})\n" + table(rows) + note)

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


def _cluster_check(args: argparse.Namespace, ledger: Any) -> int:
    from cluster.nodecheck import check_nodes, cordon_faulty, local_probe

    names = [n for n in (args.nodes or "").split(",") if n] or [n["name"] for n in ledger.nodes() if n["state"] == "up"]
    known = {n["name"] for n in ledger.nodes()}
    if args.cordon and (unknown := [n for n in names if n not in known]):
        raise ValueError(f"--cordon: {', '.join(unknown)} not in the ledger ({ledger.url}); `frenzy cluster init` first")
    if args.executor == "local":
        where, probe = "each probe a local process here", local_probe(timeout_s=args.timeout, backend=args.backend)
    else:
        from cluster.ray_exec import ray_probe

        where = "each probe on its Ray node"
        probe = ray_probe(timeout_s=args.timeout, backend=args.backend,
                          address=None if args.executor == "ray" else args.executor)
    print(f"checking {len(names)} nodes in pairs ({where})...", file=sys.stderr, flush=True)
    res = check_nodes(names, probe=probe)
    if args.cordon:
        res.cordoned = cordon_faulty(ledger, res)

    def human() -> str:
        lines = [f"{len(res.nodes)} nodes checked in {len(res.rounds)} round(s), {res.seconds:.1f} s"]
        for label, xs in (("faulty", res.faulty), ("slow (> 2x the median pair)", res.slow),
                          ("unverified (no node passed round 1)", res.unverified), ("cordoned", res.cordoned)):
            if xs:
                lines.append(f"  {label}: {', '.join(xs)}")
        if not (res.faulty or res.slow or res.unverified):
            lines.append("  every node passed")
        return "\n".join(lines)

    _emit(args, res.model_dump(), human)
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from cluster.ledger import Ledger

    ledger = Ledger(args.ledger)
    if args.action == "check":
        return _cluster_check(args, ledger)
    if args.action in ("cordon", "uncordon"):
        if not args.node:
            raise ValueError(f"frenzy cluster {args.action} needs a node name; see `frenzy cluster show`")
        ledger.cordon(args.node, args.reason) if args.action == "cordon" else ledger.uncordon(args.node)
    elif args.action == "init" or not ledger.nodes():
        ledger.sync(load_cluster(args.cluster))
    nodes = ledger.nodes()
    allocs = [a.model_dump() for a in ledger.allocations()]
    doc = {"ledger": ledger.url, "nodes": nodes, "allocations": allocs, "queue": ledger.queue()}

    def human() -> str:
        rows = [{"node": n["name"], "gpu": n["gpu_type"], "gpus": n["gpus"], "free": len(n["free_indices"]),
                 "free idx": ",".join(map(str, n["free_indices"])) or "-", "link": n["link"],
                 "state": n["state"] + (f" ({n['reason']})" if n["reason"] else ""),
                 "jobs": ",".join(n["jobs"]) or "-"} for n in nodes]
        free = sum(len(n["free_indices"]) for n in nodes if n["state"] == "up")
        return (f"ledger {ledger.url}: {len(nodes)} nodes, {free} of {sum(n['gpus'] for n in nodes)} GPUs free, "
                f"{len(allocs)} allocations, {len(doc['queue'])} waiting\n" + table(rows) +
                "".join(f"\n{a['job']}: {a['decision']}" for a in allocs if a.get("decision")))

    _emit(args, doc, human)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from cluster.compare import compare_policies
    from cluster.simulator import SimConfig

    cfg = SimConfig(reference_gpu=args.reference_gpu, rank_by=args.rank_by, queue_order=args.queue_order)
    doc, results = compare_policies(args.cluster, args.trace, args.policy or list(POLICIES), cfg, fmt=args.format,
                                    max_jobs=args.max_jobs, progress=lambda m: print(m, file=sys.stderr, flush=True))
    cluster_name, n_jobs = doc["cluster"], doc["jobs"]
    if args.plot:
        from cluster.report import plot_jct_cdf

        plot_jct_cdf(results, args.plot, title=f"{args.trace} on {cluster_name}")
        doc["plot"] = args.plot
    if args.jobs_csv:
        from cluster.report import write_jobs_csv

        doc["jobs_csv"] = {"path": args.jobs_csv, "rows": write_jobs_csv(results, args.jobs_csv)}

    def human() -> str:
        from cluster.report import summary_rows

        lb = doc["lower_bounds"]
        return (f"{n_jobs} jobs on {cluster_name}; lower bounds: avg JCT {lb['avg_jct_s']:.0f} s, "
                f"makespan {lb['makespan_s']:.0f} s\n" + table(summary_rows(doc["policies"])))

    _emit(args, doc, human)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tasks.training.launch import TrainFailed, launch
    from tasks.training.progress import describe

    job = load_job(args.job)
    if args.steps:
        job.training.steps = args.steps
    if args.checkpoint_uri:
        job.training.checkpoint.uri = args.checkpoint_uri

    def show(rec: dict) -> None:
        print(describe(rec), file=sys.stderr, flush=True)

    try:
        result = launch(job, Path(args.run_dir) if args.run_dir else None, nproc=args.nproc,
                        resume=args.resume or args.from_scratch, from_scratch=args.from_scratch,
                        device=args.device, threads=args.threads, tp=args.tp, on_record=show)
    except TrainFailed as err:
        print(f"frenzy train: error: {err}", file=sys.stderr)
        return 2 if err.returncode == 2 else 1  # 2: a problem the message says how to fix

    def human() -> str:
        rows = [{"step": c["step"], "uri": c["uri"], "MB": f"{c['bytes'] / 1e6:.1f}",
                 "blocked ms": f"{c['blocked_s'] * 1e3:.1f}", "persist s": f"{c['persist_s']:.2f}"}
                for c in result["checkpoints"]]
        start = result["resumed_from_step"]
        return (f"{job.name}: trained to step {result['final_step']}"
                f"{f' (resumed from {start})' if start is not None else ''}, last loss {result['last_loss']:.4f}, "
                f"{result['tokens_per_s']:,.0f} tok/s\n" + table(rows))

    _emit(args, result, human)
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    storage = Storage(args.uri)
    rows = []
    if storage.local is not None and not storage.local.is_dir():
        raise ValueError(f"{storage.uri}: no such checkpoint directory" if not storage.local.exists() else
                         f"{storage.uri} is a file; give the checkpoint root (the directory of step_* folders)")
    for s in ck.list_steps(storage):
        try:
            m, bad = ck.read_manifest(storage, s), None
        except ck.CheckpointError as err:
            m, bad = None, str(err)
        row = {"step": s, "committed": m is not None, "healthy": m.healthy if m else None,
               "bytes": m.total_bytes if m else None, "loss": m.loss.get("last") if m else None,
               "verified": None, "problem": bad or (None if m else "no manifest (never committed)")}
        if m is not None and args.verify:
            try:
                ck.verify(storage, m)
                row["verified"] = True
            except ck.CheckpointError as err:
                row["verified"], row["problem"] = False, str(err)
        rows.append(row)
    doc = {"uri": storage.uri, "steps": rows}
    _emit(args, doc, lambda: f"{storage.uri}\n" + table(rows))
    return 0


def _numbers(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError as err:
        raise ValueError(f"{what} takes numbers separated by commas, got {text!r}") from err


def cmd_stragglers(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.action == "generate":
        if Path(args.path).is_dir():
            raise ValueError(f"{args.path} is a directory; give the .parquet file to write (its meta YAML goes beside)")
        from tasks.stragglers.synth import SynthSpec, generate
        from tasks.stragglers.trace import write_trace

        spec: dict[str, Any] = {"schedule": args.schedule, "dp": args.dp, "pp": args.pp, "vpp": args.vpp,
                                "microbatches": args.microbatches, "steps": args.steps, "dp_mode": args.dp_mode,
                                "seq_imbalance": args.seq_imbalance, "seed": args.seed, "noise": args.noise}
        if args.slow_worker:
            d, st, f = _numbers(args.slow_worker, "--slow-worker DP,STAGE,FACTOR")
            spec["slow_worker"] = {"dp": int(d), "stage": int(st), "factor": f}
        for flag, key in ((args.slow_stage, "slow_stage"), (args.slow_link, "slow_link")):
            if flag:
                st, f = _numbers(flag, f"--{key.replace('_', '-')} STAGE,FACTOR")
                spec[key] = {"stage": int(st), "factor": f}
        from pydantic import ValidationError

        try:
            sp = SynthSpec.model_validate(spec)
        except ValidationError as err:
            raise ValueError(str(err)) from err
        run = generate(sp)
        path = write_trace(Path(args.path), run.columns(), sp.meta)
        doc = {"trace": str(path), "meta": sp.meta.model_dump(), "ops": int(sum(d.size for d in run.durs)),
               "true_slowdown": run.truth(), "spec": sp.model_dump()}
        _emit(args, doc, lambda: f"wrote {doc['ops']:,} ops to {path} (true slowdown {doc['true_slowdown']:.3f})")
        return 0

    from tasks.stragglers.analyze import analyze_path
    from tasks.stragglers.report import heatmap, markdown, timeline

    res, prep = analyze_path(args.path, args.meta, progress=lambda m: print(m, file=sys.stderr, flush=True))
    doc = res.model_dump()
    if args.heatmap:
        doc["heatmap"] = str(heatmap(res, args.heatmap))
    if args.timeline:
        ranks = [int(x) for x in _numbers(args.timeline_dp_ranks, "--timeline-dp-ranks")] if args.timeline_dp_ranks \
            else None
        doc["timeline"] = str(timeline(prep, args.timeline, first_step=args.timeline_step,
                                       n_steps=args.timeline_steps, dp_ranks=ranks))
    _emit(args, doc, lambda: markdown(res) + "".join(f"\n{k}: {doc[k]}" for k in ("heatmap", "timeline") if k in doc))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="frenzy", description="Serverless LLM development on heterogeneous GPUs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        sp.set_defaults(fn=fn)
        return sp

    sp = add("plan", cmd_plan, "Rank the GPU types and counts that can train a job (MARP).")
    sp.add_argument("job", help="job YAML file, or a Hugging Face model directory (config.json)")
    sp.add_argument("--seq-len", type=bounded_int(1, 1 << 22), help="override training.seq_len (a model directory: "
                    "default its context, at most 4096)")
    sp.add_argument("--global-batch", type=bounded_int(1, 1 << 22),
                    help="override training.global_batch (a model directory: default 8)")
    sp.add_argument("--cluster", default=EXAMPLE_CLUSTER,
                    help=f"cluster YAML file or preset ({', '.join(PRESETS)}, local); default {EXAMPLE_CLUSTER}")
    sp.add_argument("--rank-by", choices=list(get_args(RankBy)), default="gpu_seconds",
                    help="gpu_seconds: GPU-seconds per step (efficiency, default); time: step time; compute: "
                         "GPU-seconds weighted by each GPU's peak TFLOPS; balanced: fastest first among plans "
                         "within 25%% of the cheapest compute")
    sp.add_argument("--margin", type=bounded_float(0.0, 0.5), default=0.05,
                    help="fraction of GPU memory kept free, 0 to 0.5 (default 0.05)")
    sp.add_argument("--top", type=bounded_int(0, 100000), default=10, help="show the best N plans (default 10; 0 = all)")

    sp = add("memory", cmd_memory, "Predict peak GPU memory of a job under one parallel layout.")
    sp.add_argument("job", help="job YAML file")
    for flag, default, what in (("--dp", 1, "data-parallel degree"), ("--tp", 1, "tensor-parallel degree"),
                                ("--pp", 1, "pipeline-parallel degree"), ("--micro-batch", 1, "sequences per GPU"),
                                ("--vpp", 1, "virtual pipeline stages (interleaved 1F1B)")):
        sp.add_argument(flag, type=bounded_int(1, 1 << 20), default=default, help=f"{what} (default {default})")
    sp.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (tp > 1)")
    sp.add_argument("--gpu", help="GPU catalog name: calibrates overheads and reports whether it fits")

    sp = add("cluster", cmd_cluster, "Show the cluster ledger; cordon or uncordon nodes; load nodes into it.")
    sp.add_argument("action", choices=["show", "cordon", "uncordon", "init", "check"],
                    help="show: nodes, free GPUs, allocations, queue; init: add the nodes of --cluster; check: the "
                         "two-round pairwise collective test (faulty and slow nodes)")
    sp.add_argument("--nodes", help="check: comma-separated node names (default: the ledger's nodes that are up)")
    sp.add_argument("--cordon", action="store_true", help="check: cordon the faulty nodes in the ledger")
    sp.add_argument("--timeout", type=bounded_float(1.0, 3600.0), default=30.0,
                    help="check: seconds a pair's collective may take before it counts as failed (30)")
    sp.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                    help="check: collective backend (nccl: on GPUs, one per probe process)")
    sp.add_argument("--executor", default="local",
                    help="check: local (one process per node on this machine) or ray / ray://HOST:PORT (each probe on "
                         "its Ray node, named by its frenzy_node: resource)")
    sp.add_argument("node", nargs="?", help="node name (cordon, uncordon)")
    sp.add_argument("--cluster", default="local",
                    help="cluster preset or YAML for init (default local; ray or ray://HOST:PORT: the Ray cluster's nodes)")
    sp.add_argument("--reason", default="", help="why the node is cordoned (kept in the ledger)")
    sp.add_argument("--ledger", help="SQLAlchemy URL or SQLite path (default $FRENZY_LEDGER or ~/.frenzy/ledger.db)")

    sp = add("simulate", cmd_simulate, "Replay a job trace on a cluster under several placement policies.")
    sp.add_argument("--cluster", default="phoebe", help="cluster preset or YAML (default phoebe)")
    sp.add_argument("--trace", required=True,
                    help="trace CSV, or newworkload:N[:SEED] (the Frenzy NewWorkload), production:N[:SEED] or "
                    "mixed:N[:SEED] (cluster/synth_traces.py)")
    sp.add_argument("--format", choices=["generic", "philly", "sia"], help="trace format (default: from the header)")
    sp.add_argument("--policy", action="append", choices=list(ALL_POLICIES),
                    help="policy to run (repeat; default: has fcfs fifo ilp). has is Frenzy's default "
                         "(MARP + HAS, shortest predicted run time first with aging, load-adaptive sizing); "
                         "has-arrival the same placement in arrival order; has-sjf the old name of has")
    sp.add_argument("--rank-by", choices=list(get_args(RankBy)), default="balanced",
                    help="MARP plan ranking for has (default balanced)")
    sp.add_argument("--queue-order", choices=["shortest", "backfill", "strict"], default="shortest",
                    help="has queue (cluster/queue.py, the live ledger's too): shortest predicted run time first with "
                         "aging (default), arrival order with backfilling, or strict head-of-line")
    sp.add_argument("--reference-gpu", default=REFERENCE_GPU, help=f"GPU the trace durations refer to ({REFERENCE_GPU})")
    sp.add_argument("--max-jobs", type=bounded_int(1, 100000), default=160, help="philly: jobs to take (default 160)")
    sp.add_argument("--plot", help="write a JCT CDF plot (PNG) here")
    sp.add_argument("--jobs-csv", help="write one row per policy and job here (has: the plan chosen and why)")

    sp = add("train", cmd_train, "Train a job on this machine with asynchronous, verified checkpoints.")
    sp.add_argument("job", help="job YAML file")
    sp.add_argument("--resume", action="store_true",
                    help="continue from the newest checkpoint that verifies (walks back past corrupt ones)")
    sp.add_argument("--from-scratch", action="store_true",
                    help="with checkpoints none of which verifies: discard them and train from step 0 (without "
                         "it, such a resume is refused)")
    sp.add_argument("--nproc", type=bounded_int(1, 1024), default=1,
                    help="ranks (torchrun; gloo on CPU, NCCL on GPUs; default 1)")
    sp.add_argument("--tp", type=bounded_int(1, 1024), default=1,
                    help="tensor-parallel degree (DTensor); data parallel = nproc / tp")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="default: CUDA when present")
    sp.add_argument("--threads", type=bounded_int(1, 1024),
                    help="torch threads per rank (default: (cores - 1) / ranks, one core left for "
                         "the checkpoint persist and the loader)")
    sp.add_argument("--run-dir", help="progress, log, op traces and result (default runs/<job name>)")
    sp.add_argument("--steps", type=bounded_int(1, 10**9), help="override training.steps")
    sp.add_argument("--checkpoint-uri", help="override training.checkpoint.uri (file://DIR or s3://BUCKET/PREFIX)")

    sp = add("checkpoints", cmd_checkpoints, "List a checkpoint directory: committed steps, health, checksums.")
    sp.add_argument("uri", help="checkpoint root (file://DIR, DIR or s3://BUCKET/PREFIX)")
    sp.add_argument("--verify", action="store_true", help="re-read every shard and check its sha256")

    sp = add("stragglers", cmd_stragglers, "What-if analysis of a training op trace: the slowdown stragglers cost, "
             "attributed to op types, stages, DP ranks and workers; or generate a synthetic trace.")
    sp.add_argument("action", choices=["analyze", "generate"])
    sp.add_argument("path", help="analyze: trace parquet (or its directory); generate: the parquet file to write")
    sp.add_argument("--meta", help="analyze: the job's meta YAML (default: the one meta*.yaml beside the trace)")
    sp.add_argument("--heatmap", help="analyze: write the DP x PP slowdown heatmap (PNG) here")
    sp.add_argument("--timeline", help="analyze: write a Perfetto/Chrome trace of original vs ideal (.json.gz) here")
    sp.add_argument("--timeline-step", type=int, help="first step of the timeline window (default: the first)")
    sp.add_argument("--timeline-steps", type=int, default=3, help="steps in the timeline window (default 3)")
    sp.add_argument("--timeline-dp-ranks", help="DP ranks in the timeline, e.g. 0,5 (default: the first 8)")
    sp.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default="1f1b", help="generate: schedule")
    for flag, default, what in (("--dp", 4, "DP ranks"), ("--pp", 4, "pipeline stages"),
                                ("--vpp", 1, "chunks per stage (interleaved; default 2 there)"),
                                ("--microbatches", 8, "micro-batches per step"), ("--steps", 10, "steps"),
                                ("--seed", 0, "random seed")):
        sp.add_argument(flag, type=int, default=default, help=f"generate: {what} (default {default})")
    sp.add_argument("--dp-mode", choices=["allreduce", "zero"], default="allreduce",
                    help="generate: gradient all-reduce at the end of the step, or per-chunk all-gather/reduce-scatter")
    sp.add_argument("--noise", type=float, default=0.02, help="generate: relative s.d. of op durations (0.02)")
    sp.add_argument("--slow-worker", help="generate: DP,STAGE,FACTOR, e.g. 1,2,1.3")
    sp.add_argument("--slow-stage", help="generate: STAGE,FACTOR")
    sp.add_argument("--slow-link", help="generate: STAGE,FACTOR (the link from STAGE to STAGE+1)")
    sp.add_argument("--seq-imbalance", type=float, default=0.0,
                    help="generate: s.d. of log compute time per (step, DP rank), e.g. 0.1")

    add_submit_commands(add)
    add_diagnose_commands(add)
    add_eval_commands(add)
    add_data_commands(add)
    add("gpus", cmd_gpus, "List the GPU catalog.")
    add("presets", cmd_presets, "List the built-in model presets.")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "top", None) == 0:
        args.top = None
    try:
        return args.fn(args)
    # ValueError covers LedgerError and TraceError; RuntimeError covers checkpoint and storage errors
    except (JobSpecError, InventoryError, CatalogError, InfeasibleJobError, ValueError, RuntimeError) as err:
        print(f"frenzy {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError) as err:
        what = {IsADirectoryError: "is a directory; give a file", NotADirectoryError: "is a file; give a directory",
                FileExistsError: "exists and is not a directory", PermissionError: "is not accessible"}[type(err)]
        print(f"frenzy {args.command}: error: {err.filename or err}: {what}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
