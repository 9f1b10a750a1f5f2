"""`frenzy cluster` (the ledger: show, init, cordon, uncordon, the two-round node check) and `frenzy simulate`
(a job trace replayed under several placement policies)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, get_args

from cli.argtypes import bounded_float, bounded_int
from cli.output import emit, progress, table
from cluster.inventory import load_cluster
from cluster.traces import ALL_POLICIES, FORMATS, POLICIES, REFERENCE_GPU
from tasks.errors import FrenzyError
from tasks.planning.plans import RankBy


def _cluster_check(args: argparse.Namespace, ledger: Any) -> int:
    from cluster.nodecheck import check_nodes, cordon_faulty, local_probe

    names = [n for n in (args.nodes or "").split(",") if n] or [n.name for n in ledger.nodes() if n.state == "up"]
    known = {n.name for n in ledger.nodes()}
    if args.cordon and (unknown := [n for n in names if n not in known]):
        raise FrenzyError(f"--cordon: {', '.join(unknown)} not in the ledger ({ledger.url}); `frenzy cluster init` first")
    verdicts: dict[str, Any] = {}
    if args.executor == "local":
        where, probe = "each probe a local process here", local_probe(timeout_s=args.timeout, backend=args.backend)
        print(f"checking {len(names)} nodes in pairs ({where})...", file=sys.stderr, flush=True)
        res = check_nodes(names, probe=probe)
        if args.cordon:
            res.cordoned = cordon_faulty(ledger, res)
    else:
        from cluster.ray_health import check_ray_nodes, cordon_gone

        print(f"checking {len(names)} Ray nodes: alive?, then in pairs (each probe on its node)...", file=sys.stderr,
              flush=True)
        res, verdicts = check_ray_nodes(names, None if args.executor == "ray" else args.executor,
                                        timeout_s=args.timeout, backend=args.backend)
        if args.cordon:
            gone = cordon_gone(ledger, verdicts)
            res.cordoned = gone + cordon_faulty(ledger, res.model_copy(update={
                "faulty": [n for n in res.faulty if n not in gone]}))
            for n in res.unverified:  # on a cluster, a node no peer could clear is not a pass
                ledger.cordon(n, "node check: unverified (no healthy peer to test it against)")
                res.cordoned.append(n)

    def human() -> str:
        lines = [f"{len(res.nodes)} nodes checked in {len(res.rounds)} round(s), {res.seconds:.1f} s"]
        for label, xs in (("faulty", res.faulty), ("slow (> 2x the median pair)", res.slow),
                          ("unverified (no node passed round 1)", res.unverified), ("cordoned", res.cordoned)):
            if xs:
                lines.append(f"  {label}: {', '.join(xs)}")
        if not (res.faulty or res.slow or res.unverified):
            lines.append("  every node passed")
        return "\n".join(lines)

    doc = res.model_dump()
    if verdicts:
        doc["verdicts"] = {n: v.model_dump() for n, v in verdicts.items()}
    emit(args, doc, human)
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from cluster.ledger import Ledger, require_existing

    if args.action != "init":  # a mistyped --ledger must not become a new, empty cluster
        require_existing(args.ledger)
    ledger = Ledger(args.ledger)
    if args.action == "check":
        return _cluster_check(args, ledger)
    if args.action in ("cordon", "uncordon"):
        if not args.node:
            raise FrenzyError(f"frenzy cluster {args.action} needs a node name; see `frenzy cluster show`")
        ledger.cordon(args.node, args.reason) if args.action == "cordon" else ledger.uncordon(args.node)
    elif args.action == "init" or not ledger.nodes():
        ledger.sync(load_cluster(args.cluster))
        if args.cluster == "ray" or args.cluster.startswith("ray://"):  # nodes Ray knows dead go down
            from cluster.ray_health import sync_ledger

            sync_ledger(ledger, None if args.cluster == "ray" else args.cluster)
    nodes = ledger.nodes()
    allocs = [a.model_dump() for a in ledger.allocations()]
    queue = ledger.queue()
    doc = {"ledger": ledger.url, "nodes": [n.model_dump() for n in nodes], "allocations": allocs,
           "queue": [q.model_dump() for q in queue]}

    def human() -> str:
        rows = [{"node": n.name, "gpu": n.gpu_type, "gpus": n.gpus, "free": len(n.free_indices),
                 "free idx": ",".join(map(str, n.free_indices)) or "-", "link": n.link,
                 "state": n.state + (f" ({n.reason})" if n.reason else ""),
                 "jobs": ",".join(n.jobs) or "-"} for n in nodes]
        free = sum(len(n.free_indices) for n in nodes if n.state == "up")
        return (f"ledger {ledger.url}: {len(nodes)} nodes, {free} of {sum(n.gpus for n in nodes)} GPUs free, "
                f"{len(allocs)} allocations, {len(queue)} waiting\n" + table(rows) +
                "".join(f"\n{a['job']}: {a['decision']}" for a in allocs if a.get("decision")))

    emit(args, doc, human)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from cluster.compare import compare_policies
    from cluster.simulator import SimConfig
    from tasks.outdir import check_file_target

    for flag, out in (("--plot", args.plot), ("--jobs-csv", args.jobs_csv)):
        if out:  # before the simulation: a wrong path should not cost its minutes
            check_file_target(out, f"cluster simulate {flag}", (args.trace,), overwrite=args.overwrite)
    cfg = SimConfig(reference_gpu=args.reference_gpu, rank_by=args.rank_by, queue_order=args.queue_order,
                    elastic=args.elastic)
    comp = compare_policies(args.cluster, args.trace, args.policy or list(POLICIES), cfg, fmt=args.format,
                            max_jobs=args.max_jobs, load=args.load, progress=progress)
    doc = comp.to_json()
    if args.plot:
        from cluster.report import plot_jct_cdf

        plot_jct_cdf(comp.results, args.plot, title=f"{args.trace} on {comp.cluster}", overwrite=args.overwrite)
        doc["plot"] = args.plot
    if args.jobs_csv:
        from cluster.report import write_jobs_csv

        doc["jobs_csv"] = {"path": args.jobs_csv, "rows": write_jobs_csv(comp.results, args.jobs_csv, args.overwrite)}

    def human() -> str:
        from cluster.report import summary_rows

        lb, given = comp.lower_bounds, comp.offered_load_as_given
        load = f"offered load {comp.offered_load:.2f}" + (f" (rescaled from {given:.2f})" if args.load else "")
        return (f"{comp.jobs} jobs on {comp.cluster}, {load}; lower bounds: avg JCT {lb.avg_jct_s:.0f} s, "
                f"makespan {lb.makespan_s:.0f} s\n" + table(summary_rows(comp.policies)))

    emit(args, doc, human)
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("cluster", cmd_cluster)
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

    sp = add("simulate", cmd_simulate)
    sp.add_argument("--cluster", default="phoebe", help="cluster preset or YAML (default phoebe)")
    sp.add_argument("--trace", required=True,
                    help="trace CSV, or newworkload:N[:SEED] (the Frenzy NewWorkload), production:N[:SEED] or "
                    "mixed:N[:SEED] (cluster/synth_traces.py)")
    sp.add_argument("--format", choices=list(FORMATS), help="trace format (default: from the header)")
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
    sp.add_argument("--load", type=bounded_float(0.01, 10.0),
                    help="rescale the arrival times to this offered load (GPU-seconds asked for over the cluster's "
                         "GPU-seconds in the arrival span; benchmarks/placement_load.py reports 0.5-1.1); default: "
                         "the trace's own times")
    sp.add_argument("--elastic", choices=["trace", "all", "none"], default="trace",
                    help="whether jobs may change their GPU count: as each trace job says (default; philly, openb, "
                         "helios, kalos and the generic CSV without an elastic column are rigid), all, or none")
    sp.add_argument("--plot", help="write a JCT CDF plot (PNG) here")
    sp.add_argument("--jobs-csv", help="write one row per policy and job here (has: the plan chosen and why)")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing --plot or --jobs-csv file")
