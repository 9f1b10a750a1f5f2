"""What one attempt of a run needs around the trainer: the training request for exactly the allocation, the checks
that the allocation can be used from here, the node check after a failure, and the out-of-memory record MARP learns
from. No Prefect here; `flows/submit.py` calls these from its stages."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from cluster.catalog import default_catalog
from cluster.inventory import Cluster
from cluster.ledger import Allocation, Ledger
from cluster.nodecheck import check_nodes, cordon_faulty, local_probe
from tasks.diagnosis.diagnose import Diagnosis
from tasks.errors import FrenzyError
from tasks.jobspec import JobSpec
from tasks.pipeline.request import SubmitRequest
from tasks.planning.calibration import OomObservation, model_key, record_oom
from tasks.planning.plans import ResourcePlan
from tasks.training.request import NodeRanks, TrainRequest

Logger = logging.Logger | logging.LoggerAdapter


class PipelineError(FrenzyError, RuntimeError):
    """The pipeline cannot go on; the message names the cause and the fix."""


def host_node(alloc: Allocation) -> str:
    """The allocation's node, which must be this worker's host: training runs as local processes."""
    host = socket.gethostname()
    names = [n.node for n in alloc.nodes]
    if len(names) != 1 or not (names[0] == host or names[0].startswith(f"{host}-")):
        raise PipelineError(f"HAS placed the job on {', '.join(names)}, but this worker ({host}) trains only on its "
                            "own GPUs; run the worker on that node, or submit with cluster=local")
    return names[0]


def training_request(request: SubmitRequest, alloc: Allocation, chosen: ResourcePlan, run_dir: Path,
                     suite: str = "") -> TrainRequest:
    """The trainer's request for exactly the allocation's GPUs and the chosen plan's layout."""
    job = request.job.model_copy(deep=True)
    if job.training.micro_batch is None:
        job.training.micro_batch = chosen.layout.micro_batch
    if request.executor != "local":  # Ray: one actor per allocated GPU on its node, the nodes may be several
        placement = [NodeRanks(node=n.node, ranks=len(n.gpu_indices), gpus=n.gpu_type != "cpu") for n in alloc.nodes]
        return TrainRequest(job=job, nproc=sum(p.ranks for p in placement), tp=chosen.layout.tp, resume=True,
                            device="cpu" if not placement[0].gpus else request.device, run_dir=str(run_dir),
                            analyze_stragglers=False, evaluation_suite=suite or None, executor=request.executor,
                            history_dir=request.history_dir,
                            placement=placement)
    host_node(alloc)
    node = alloc.nodes[0]
    on_cpu = node.gpu_type == "cpu"
    return TrainRequest(job=job, nproc=len(node.gpu_indices), tp=chosen.layout.tp, resume=True,
                        device="cpu" if on_cpu else request.device, run_dir=str(run_dir),
                        gpu_indices=None if on_cpu else node.gpu_indices, analyze_stragglers=False,
                        evaluation_suite=suite or None, history_dir=request.history_dir)


def cpu_fallback(request: SubmitRequest, treq: TrainRequest, alloc: Allocation) -> str | None:
    """The warning when `--device cuda` was asked for and the allocation's trainer gets no CUDA GPU (a `cpu` node):
    it trains on the CPU, and says so (red team 41g S15: it trained there silently). None otherwise."""
    if request.device != "cuda" or treq.gpu_indices:
        return None
    return (f"--device cuda, but the allocation on {', '.join(n.node for n in alloc.nodes)} holds no CUDA GPU: "
            "training runs on the CPU (give a cluster with GPUs, or --device cpu to say so)")


def check_shared_paths(request: SubmitRequest, alloc: Allocation, run_dir: Path) -> None:
    """On Ray: the run directory, the evaluation history and a local checkpoint root are the same directories on every
    node of the allocation (cluster/ray_exec.check_shared_paths); a PipelineError naming the fix when not."""
    from cluster.ray_exec import RayExecutorError
    from cluster.ray_exec import check_shared_paths as check

    folders: list[str | Path] = [run_dir, request.history_dir]
    uri = request.job.training.checkpoint.uri
    if "://" not in uri or uri.startswith("file://"):
        folders.append(uri.removeprefix("file://"))
    try:
        check([n.node for n in alloc.nodes], folders, None if request.executor == "ray" else request.executor)
    except RayExecutorError as err:
        raise PipelineError(f"{request.job.name}: {err}") from None


def check_allocation_nodes(ledger: Ledger, alloc: Allocation, log: Logger, executor: str = "local") -> None:
    """The recovery's node check on the allocation's nodes: on Ray, each is first asked whether it is alive at all
    (cluster/ray_health.py: dead nodes go `down`, unreachable ones are cordoned), then the rest run the two-round
    collective test on the nodes themselves; a node the test cannot clear (unverified) is cordoned too."""
    nodes = [n.node for n in alloc.nodes]
    probe = local_probe()
    if executor != "local":
        from cluster.ray_exec import ray_probe
        from cluster.ray_health import settle_suspects

        address = None if executor == "ray" else executor
        nodes, verdicts = settle_suspects(ledger, nodes, address)
        for v in verdicts.values():
            if v.verdict != "alive":
                log.warning("node check: %s is %s (%s after %.1f s); %s", v.node, v.verdict, v.how, v.seconds,
                            "down" if v.verdict == "dead" else "cordoned")
        probe = ray_probe(address=address)
    if len(nodes) < 2:
        log.info("node check skipped: %s healthy node(s) left in the allocation (%s) and the pairwise test needs two; "
                 "resuming on healthy GPUs as the ledger sees them", len(nodes), ", ".join(nodes) or "-")
        return
    res = check_nodes(nodes, probe=probe)
    for n in cordon_faulty(ledger, res):
        log.warning("node check: %s failed its collective twice; cordoned", n)
    for n in res.unverified if executor != "local" else []:  # no node cleared it: not a pass on a cluster
        ledger.cordon(n, "unverified by the node check after a lost rank")
        log.warning("node check: %s could not be verified; cordoned", n)


def note_oom(job: JobSpec, plan: ResourcePlan, d: Diagnosis, cluster: Cluster) -> None:
    """An out-of-memory observation MARP learns from (tasks/planning/calibration.py): what it predicted, and the
    GPU it ran out on."""
    gpu = next(g for g in cluster.gpu_types(default_catalog()) if g.name == plan.gpu_type)
    record_oom(OomObservation(model_key=model_key(job), model=job.model.display_name, seq_len=job.training.seq_len,
                              gpu_type=plan.gpu_type, gpu_memory_gib=gpu.memory_gib, layout=plan.layout.label(),
                              predicted_device_gib=plan.predicted_device_gib, job=job.name, line=d.root_cause_line))
