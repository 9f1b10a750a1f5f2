"""MARP's plans: for each GPU type of a cluster, the parallel layouts that fit, ranked by estimated efficiency.

Ranking (`rank_by`): `gpu_seconds` (default) orders by GPU-seconds per optimizer step, i.e. per-GPU
efficiency, so the cluster gets the most work per GPU; `time` orders by the step time alone; `compute` orders by
compute cost per step: GPU-seconds weighted by each GPU's dense peak for the job's precision (peak PFLOP per
step), the share of a heterogeneous cluster's capacity the plan uses. A GPU-second of an RTX 2080Ti is then
worth a sixth of an A100's, so a job that scales well on slow GPUs is not pushed onto the fast ones.
`balanced` puts first, fastest first, the plans whose compute cost is at most `BALANCED_SLACK` (25%) above the
job's cheapest plan, then the others by compute cost. `balanced` suits HAS, which takes the first plan the free
GPUs can hold: an idle cluster gives a job its fastest efficient plan, a busy one a cheaper plan, on whichever
type is free. On a cluster whose types have one speed, `compute` orders like `gpu_seconds`. Ties go to fewer
GPUs, a smaller tensor-parallel degree, then the smallest GPU that fits.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from cluster.catalog import Catalog, GPUType, default_catalog
from cluster.inventory import Cluster
from tasks.errors import FrenzyError
from tasks.jobspec import JobSpec
from tasks.planning.calibration import Calibration, OomObservation, calibrate, observations_path
from tasks.planning.layout import Layout, check_layout, count_params, grad_accum_steps
from tasks.planning.memory import GiB, predict_peak_memory
from tasks.planning.steptime import StepModel, fitted_step_s

RankBy = Literal["gpu_seconds", "time", "balanced", "compute"]
BALANCED_SLACK = 0.25


class ResourcePlan(BaseModel):
    """One way to run the job: how many GPUs of which type, and the layout on them."""

    rank: int = 0
    """1 = best."""
    gpu_type: str
    """The GPU type the plan was sized and timed for."""
    gpus: int
    """GPU count (dp x tp x pp)."""
    min_gpu_memory_gib: float
    """Smallest GPU memory on which this layout fits with the safety margin."""
    acceptable_gpu_types: list[str]
    """Cluster GPU types with at least `min_gpu_memory_gib`."""
    layout: Layout
    predicted_device_gib: float
    """Predicted peak per GPU as nvidia-smi shows it."""
    predicted_allocated_gib: float
    """Predicted peak tensor memory per GPU (max_memory_allocated)."""
    est_step_time_s: float
    """Estimated optimizer-step time."""
    gpu_seconds_per_step: float
    compute_pflop_per_step: float = 0.0
    """Compute cost: GPUs x step time x the GPU's dense peak TFLOPS for the job's precision / 1000."""
    tokens_per_s: float
    memory_calibration: float = 1.0
    """The factor learned from recorded out-of-memory failures of this model that `predicted_device_gib` includes
    (tasks/planning/calibration.py); 1 when none was recorded."""


class InfeasibleJobError(FrenzyError, ValueError):
    """No layout fits any GPU of the cluster; the message names the memory, the largest GPU and a fix."""


def _comm_time(nbytes: float, group: int, gbs: float) -> float:
    """Ring all-reduce of `nbytes` over `group` ranks at `gbs` GB/s per rank."""
    return 0.0 if group <= 1 else 2 * (group - 1) / group * nbytes / (gbs * 1e9)


def estimate_step_time(job: JobSpec, layout: Layout, gpu: GPUType, intra_gbs: float, inter_gbs: float,
                       gpus_per_node: int, step_model: StepModel = fitted_step_s) -> float:
    """One GPU's compute (`step_model`; by default matmul, memory-bound and host time, tasks/planning/steptime.py),
    the PP bubble, TP all-reduces and the DP gradient reduce."""
    m, t = job.model, job.training
    pc = count_params(m, t.seq_len)
    compute = step_model(job, layout, gpu)
    micro = grad_accum_steps(job, layout)
    if layout.pp > 1:
        compute *= 1 + (layout.pp - 1) / (micro * layout.vpp)
    act_bytes = layout.micro_batch * t.seq_len * m.hidden * 2
    tp_gbs = intra_gbs if layout.tp <= gpus_per_node else inter_gbs
    tp_comm = 4 * (m.layers / layout.pp) * micro * _comm_time(act_bytes, layout.tp, tp_gbs)
    grad_bytes = (pc.total / (layout.tp * layout.pp)) * (4 if t.precision != "bf16" else 2)
    dp_gbs = intra_gbs if layout.gpus <= gpus_per_node else inter_gbs
    dp_comm = _comm_time(grad_bytes, layout.dp, dp_gbs)
    return compute + tp_comm + dp_comm


MAX_MICRO_BATCH = 4096
"""Micro-batches above this many sequences per GPU are not considered (no GPU holds them for a real model)."""


def _divisors(n: int) -> list[int]:
    """Divisors of n up to MAX_MICRO_BATCH, ascending, in O(sqrt n)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(d for d in {*small, *(n // d for d in small)} if d <= MAX_MICRO_BATCH)


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def enumerate_layouts(job: JobSpec, max_gpus: int, gpus_per_node: int) -> list[Layout]:
    """All dp x tp x pp x micro-batch layouts valid for the job on up to `max_gpus` GPUs."""
    t = job.training
    out: list[Layout] = []
    for tp in _pow2_upto(min(8, gpus_per_node)):
        for pp in _pow2_upto(max(1, max_gpus // tp)):
            for dp in range(1, max_gpus // (tp * pp) + 1):
                if t.global_batch % dp:
                    continue
                mbs = [t.micro_batch] if t.micro_batch else _divisors(t.global_batch // dp)
                for mb in mbs:
                    lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb)
                    if check_layout(job, lay) is None:
                        out.append(lay)
    return out


def plan_resources(job: JobSpec, cluster: Cluster, *, rank_by: RankBy = "gpu_seconds",
                   margin: float = 0.05, catalog: Catalog | None = None, top: int | None = None,
                   observations: list[OomObservation] | None = None,
                   step_model: StepModel = fitted_step_s) -> list[ResourcePlan]:
    """Ranked plans for `job` on the GPU types of `cluster`; raises InfeasibleJobError when none fits.
    `observations`: recorded out-of-memory failures (calibration.py) that correct the predicted peaks; `step_model`:
    one GPU's compute seconds (the placement simulator passes its own, cluster/jobperf.py)."""
    cat = catalog or default_catalog()
    cal = calibrate(job, observations or [])
    types = cluster.gpu_types(cat)
    plans: list[ResourcePlan] = []
    for g in types:
        nodes = cluster.nodes_of(g.name, cat)
        total = sum(n.count for n in nodes)
        per_node = max(n.count for n in nodes)
        intra = min(cluster.link_gbs(n, cat) for n in nodes if n.count == per_node)
        inter = min(n.inter_node_gbs for n in nodes)
        best: dict[tuple[int, int, int], ResourcePlan] = {}
        for lay in enumerate_layouts(job, total, per_node):
            est = predict_peak_memory(job, lay, g)
            device_bytes = est.device_bytes * cal.factor
            if device_bytes > g.memory_gib * GiB * (1 - margin) or (g.name, lay.label()) in cal.excluded:
                continue
            step = estimate_step_time(job, lay, g, intra, inter, per_node, step_model)
            need = device_bytes / (1 - margin) / GiB
            plan = ResourcePlan(
                gpu_type=g.name, gpus=lay.gpus, min_gpu_memory_gib=round(need, 2),
                acceptable_gpu_types=[x.name for x in types if x.memory_gib >= need],
                layout=lay, predicted_device_gib=round(device_bytes / GiB, 2), memory_calibration=round(cal.factor, 4),
                predicted_allocated_gib=round(est.allocated_bytes / GiB, 2), est_step_time_s=step,
                gpu_seconds_per_step=step * lay.gpus,
                compute_pflop_per_step=step * lay.gpus * g.tflops(job.training.precision) / 1000,
                tokens_per_s=job.training.global_batch * job.training.seq_len / step,
            )
            key = (lay.dp, lay.tp, lay.pp)  # keep the fastest micro-batch of each degree triple
            if key not in best or step <= best[key].est_step_time_s:  # ties: larger micro-batch
                best[key] = plan
        plans.extend(best.values())
    if not plans:
        raise InfeasibleJobError(infeasible_message(job, cluster, cat, margin) + calibration_note(cal))
    mem = {g.name: g.memory_gib for g in types}
    # ties: fewer GPUs, smaller tp, then the smallest GPU that fits (best fit leaves big GPUs for big jobs)
    floor = min(p.compute_pflop_per_step for p in plans) * (1 + BALANCED_SLACK)

    def key(p: ResourcePlan) -> tuple[float, ...]:
        if rank_by == "balanced":
            efficient = p.compute_pflop_per_step <= floor
            primary = (0.0, p.est_step_time_s) if efficient else (1.0, p.compute_pflop_per_step)
        else:
            primary = (0.0, {"gpu_seconds": p.gpu_seconds_per_step, "time": p.est_step_time_s,
                             "compute": p.compute_pflop_per_step}[rank_by])
        return (primary[0], round(primary[1], 9), p.gpus, p.layout.tp, mem[p.gpu_type])

    plans.sort(key=lambda p: (*key(p), p.gpu_type))
    for i, p in enumerate(plans):
        p.rank = i + 1
    return plans[:top] if top else plans


def calibration_note(cal: Calibration) -> str:
    """Why recorded OOMs may be what forbids every layout, and how to drop them if they were wrong."""
    if not cal.observations:
        return ""
    return (f" Also, {cal.observations} recorded out-of-memory failure(s) of this model ({observations_path()}) "
            f"scale its predicted peak by {cal.factor:.2f} and exclude {len(cal.excluded)} layout(s); if they were "
            "wrong, delete their lines from that file.")


def infeasible_message(job: JobSpec, cluster: Cluster, cat: Catalog, margin: float) -> str:
    """Name the smallest predicted peak, the largest GPU, and the nearest change that would fit."""
    largest = max(cluster.gpu_types(cat), key=lambda g: g.memory_gib)
    total = sum(n.count for n in cluster.nodes_of(largest.name, cat))
    per_node = max(n.count for n in cluster.nodes_of(largest.name, cat))
    cap = largest.memory_gib * (1 - margin)
    layouts = enumerate_layouts(job, total, per_node) or [Layout()]
    smallest = min(layouts, key=lambda lay: predict_peak_memory(job, lay, largest).device_bytes)
    need = predict_peak_memory(job, smallest, largest).device_bytes / GiB
    fixes = []
    t = job.training
    for label, upd in (("recompute: full", {"recompute": "full"}), ("zero_stage: 3", {"zero_stage": 3}),
                       ("micro_batch: 1", {"micro_batch": 1}),
                       ("recompute: full + zero_stage: 3", {"recompute": "full", "zero_stage": 3})):
        if all(getattr(t, k) == v for k, v in upd.items()):
            continue
        alt = job.model_copy(update={"training": t.model_copy(update=upd)})
        alts = enumerate_layouts(alt, total, per_node)
        if alts and min(predict_peak_memory(alt, lay, largest).device_bytes for lay in alts) / GiB <= cap:
            fixes.append(f"set training.{label}")
            break
    fixes.append(f"add GPUs with at least {need / (1 - margin):.0f} GiB (e.g. A100-80GB, H100-80GB, H200-141GB)"
                 if need / (1 - margin) < 140 else "add more GPUs of the largest type so tp/pp can grow")
    return (f"{job.model.display_name} needs {need:.1f} GiB per GPU at its smallest layout "
            f"({smallest.label()}); the largest GPU here is {largest.name} with {largest.memory_gib:g} GiB "
            f"({cap:.1f} GiB usable at a {margin:.0%} margin). Try: " + "; or ".join(fixes) + ".")
