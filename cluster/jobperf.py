"""Speed and memory of a trace job on a given GPU type and count, from MARP's memory and step-time models.

The simulator uses these as ground truth: a job runs `steps` optimizer steps, each taking the step-time model's
time for its layout on the slowest GPU of its allocation, and it fails with OOM when the memory model says its
layout does not fit that GPU's memory (no safety margin: a real OOM happens at 100%).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Protocol

from cluster.catalog import default_catalog
from tasks.jobspec import JobSpec, parse_job
from tasks.planning.layout import Layout, check_layout
from tasks.planning.memory import GiB, predict_peak_memory
from tasks.planning.plans import _pow2_upto as _pow2
from tasks.planning.plans import estimate_step_time
from tasks.planning.steptime import StepModel, constant_mfu_step_s

INTER_NODE_GBS = 12.5
SIM_STEP_MODEL: StepModel = constant_mfu_step_s
"""One GPU's compute per step in the simulator, its replay and `has`'s plans alike: the constant-MFU model. The planner's
fitted model (tasks/planning/steptime.py) moved `has` against `fcfs` by more than the 2% the keep rule allows on the
round-17 windows (benchmarks/results/marp_step_time.md), so the simulator keeps the model its policies were tuned on."""


class _SizedJob(Protocol):
    """What JobKey reads from a job: a trace job (cluster/traces.py) or anything shaped like one. A protocol, not an
    import, so that traces (which prices its generated workloads with `reference_step_time`) stays above this module."""

    model: str
    global_batch: int
    seq_len: int
    precision: str


@dataclass(frozen=True)
class JobKey:
    """What determines a job's speed and memory (the trace job minus its name and timing)."""

    model: str
    global_batch: int
    seq_len: int = 1024
    precision: str = "fp16-mixed"

    @classmethod
    def of(cls, job: _SizedJob) -> JobKey:
        return cls(job.model, job.global_batch, job.seq_len, job.precision)

    def spec(self) -> JobSpec:
        return _spec(self)


@cache
def _spec(key: JobKey) -> JobSpec:
    return parse_job({"name": f"{key.model}-b{key.global_batch}", "model": {"preset": key.model},
                      "training": {"global_batch": key.global_batch, "seq_len": key.seq_len,
                                   "precision": key.precision}})


@cache
def layouts_exact(key: JobKey, gpus: int, max_tp: int) -> tuple[Layout, ...]:
    """Valid layouts using exactly `gpus` GPUs with tp <= max_tp (each dp's largest micro-batch that divides)."""
    job = key.spec()
    out = []
    for tp in _pow2(min(8, max_tp, gpus)):
        for pp in _pow2(gpus // tp):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if job.training.global_batch % dp:
                continue
            per_dp = job.training.global_batch // dp
            for mb in sorted({d for d in (1, 2, 4, 8, 16, 32) if per_dp % d == 0}, reverse=True):
                lay = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb)
                if check_layout(job, lay) is None:
                    out.append(lay)
    return tuple(out)


@cache
def fits(key: JobKey, gpu_type: str, layout: Layout) -> bool:
    """Whether the layout's predicted device peak fits the GPU's whole memory."""
    g = default_catalog().get(gpu_type)
    return predict_peak_memory(key.spec(), layout, g).device_bytes <= g.memory_gib * GiB


@cache
def step_time(key: JobKey, gpu_type: str, layout: Layout, intra_gbs: float, inter_gbs: float, per_node: int) -> float:
    return estimate_step_time(key.spec(), layout, default_catalog().get(gpu_type), intra_gbs, inter_gbs, per_node,
                              SIM_STEP_MODEL)


@cache
def best_layout(key: JobKey, gpu_type: str, gpus: int, max_tp: int, intra_gbs: float, inter_gbs: float,
                per_node: int, need_fit: bool = True) -> tuple[Layout, float] | None:
    """The fastest layout on exactly `gpus` GPUs of `gpu_type` (that fits its memory when `need_fit`)."""
    best: tuple[Layout, float] | None = None
    for lay in layouts_exact(key, gpus, max_tp):
        if need_fit and not fits(key, gpu_type, lay):
            continue
        t = step_time(key, gpu_type, lay, intra_gbs, inter_gbs, per_node)
        if best is None or t < best[1]:
            best = (lay, t)
    return best


def user_layout(key: JobKey, gpus: int, micro_batch: int | None = None) -> Layout:
    """What a user who sizes by GPU count runs: DDP on all `gpus` (no TP/PP), micro-batch = global batch / gpus
    (no gradient accumulation) unless the user has lowered it to `micro_batch` after an OOM (then gradient
    accumulation makes up the global batch)."""
    per = max(1, key.global_batch // gpus)
    return Layout(dp=gpus, tp=1, pp=1, micro_batch=min(per, micro_batch) if micro_batch else per)


def reference_step_time(key: JobKey, gpu_type: str, gpus: int) -> float:
    """Step time of the job's fastest layout with `gpus` GPUs of the reference type, memory ignored (the trace
    job ran for real, so its recorded duration is taken as what that count achieved)."""
    g = default_catalog().get(gpu_type)
    per_node = min(gpus, 8)
    res = best_layout(key, g.name, gpus, per_node, g.link_gbs, INTER_NODE_GBS, per_node, need_fit=False)
    if res is None:  # no valid layout with exactly that count (batch not divisible): pure compute scaling
        one = best_layout(key, g.name, 1, 1, g.link_gbs, INTER_NODE_GBS, 1, need_fit=False)
        assert one is not None
        return one[1] / gpus
    return res[1]


MICRO_BATCHES = (32, 16, 8, 4, 2, 1)


def recorded_layout(key: JobKey, gpu_type: str, gpus: int) -> Layout | None:
    """The layout a traced job ran with on `gpus` GPUs of `gpu_type`: data parallel on every GPU (no TP/PP), the
    largest micro-batch up to global batch / gpus that fits the GPU's memory, gradient accumulation making up the
    global batch (the usual fix a user applies until the job runs). None: not even micro-batch 1 fits."""
    for lay in _dp_layouts(key, gpus):
        if fits(key, gpu_type, lay):
            return lay
    return None


@cache
def _dp_layouts(key: JobKey, gpus: int) -> tuple[Layout, ...]:
    per = max(1, key.global_batch // gpus)
    return tuple(Layout(dp=gpus, tp=1, pp=1, micro_batch=mb) for mb in MICRO_BATCHES if mb <= per and per % mb == 0)


def layout_step_time(key: JobKey, gpu_type: str, layout: Layout) -> float:
    """Step time of `layout` on GPUs of `gpu_type` packed 8 to a node with the type's own links (the trace's
    cluster, as far as a trace says anything about it)."""
    g = default_catalog().get(gpu_type)
    per_node = min(layout.gpus, 8)
    return step_time(key, g.name, layout, g.link_gbs, INTER_NODE_GBS, per_node)


def min_memory_that_holds(key: JobKey, layout: Layout, gpu_types: Iterable[str]) -> float | None:
    """The smallest memory M among `gpu_types` such that `layout` fits every one of them with at least M GiB (what a
    user who knows their job asks for: GPUs with at least M GiB); None when it fits none."""
    cat = default_catalog()
    by_mem = sorted({cat.get(t).name for t in gpu_types}, key=lambda t: (-cat.get(t).memory_gib, t))
    low = None
    for t in by_mem:  # largest memory first: stop at the first type it does not fit
        if not fits(key, t, layout):
            break
        low = cat.get(t).memory_gib
    return low
