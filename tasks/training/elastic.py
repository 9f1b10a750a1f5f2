"""What a recovery moved, and the failure rate `checkpoint.every_steps: auto` is tuned for, from the ledger.

After a failure the submit flow re-places the job on the plans MARP ranked for the whole cluster (other GPU types,
smaller counts): HAS takes the best that fits what is free now (a node the node check cordoned is not free). Since
checkpoints reshard on load (reshard.py) and the trainer keeps the global batch with gradient accumulation on fewer
ranks, any of those plans resumes the same run. `relayout()` records the move (old layout, new layout, why) in the
recovery record; `pool_mtbf()` gives the MTBF of the pool the job now runs on, so `auto` is re-tuned after a move.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from cluster.ledger import LedgerEvent, LedgerNode
from tasks.training.interval import PRIOR_GPU_MTBF_S, pooled_mtbf_s


class Placed(BaseModel):
    """One attempt's resources and layout."""

    gpus: int
    gpu_type: str
    nodes: list[str]
    dp: int
    tp: int
    micro_batch: int
    grad_accumulation: int
    """Micro-batches per rank per step: global_batch / (dp x micro_batch)."""


class Relayout(BaseModel):
    """The recovery's decision, recorded in its `recoveries` entry."""

    old: Placed
    new: Placed
    changed: bool
    why: str


def placed(plan: Any, alloc: Any, global_batch: int, micro_batch: int | None = None) -> Placed:
    """`plan`: a planning ResourcePlan; `alloc`: the ledger's Allocation. `micro_batch`: the job's, else the plan's."""
    dp, tp = plan.layout.dp, plan.layout.tp
    mb = min(micro_batch or plan.layout.micro_batch, max(global_batch // dp, 1))
    return Placed(gpus=alloc.gpus, gpu_type=plan.gpu_type, nodes=[n.node for n in alloc.nodes], dp=dp, tp=tp,
                  micro_batch=mb, grad_accumulation=max(global_batch // (dp * mb), 1))


def relayout(old: Placed, new: Placed, failure: str, action: str) -> Relayout:
    """Why the job runs where it now runs, in words a user reads in the flow log and the result."""
    changed = (old.gpus, old.gpu_type, old.dp, old.tp, old.micro_batch) != \
        (new.gpus, new.gpu_type, new.dp, new.tp, new.micro_batch)
    cause = {"replan": "out of memory: re-planned with MARP calibrated by the OOM, without the layout that ran out",
             "resume": "resumed on what is free now"}.get(action, action)
    if not changed:
        why = f"{failure}; {cause}: the same layout ({new.gpus} x {new.gpu_type}, dp {new.dp} x tp {new.tp}) fit again"
    elif (old.gpus, old.gpu_type, old.dp, old.tp) == (new.gpus, new.gpu_type, new.dp, new.tp):
        why = (f"{failure}; {cause}: {new.gpus} x {new.gpu_type} (dp {new.dp} x tp {new.tp}) with micro-batches of "
               f"{new.micro_batch} instead of {old.micro_batch} ({new.grad_accumulation} per rank per step, the same "
               "global batch)")
    else:
        lost = sorted(set(old.nodes) - set(new.nodes))
        why = (f"{failure}; {cause}: {old.gpus} x {old.gpu_type} (dp {old.dp} x tp {old.tp}) -> {new.gpus} x "
               f"{new.gpu_type} (dp {new.dp} x tp {new.tp}), the best MARP plan HAS could place now"
               + (f" without {', '.join(lost)}" if lost else "")
               + f"; the global batch is kept with {new.grad_accumulation} micro-batch(es) of {new.micro_batch} per "
               "rank, and the checkpoint is resharded onto the new layout")
    return Relayout(old=old, new=new, changed=changed, why=why)


def pool_mtbf(events: Sequence[LedgerEvent], nodes: Sequence[LedgerNode], gpu_type: str, gpus: int,
              extra_failures: int = 0, now: float | None = None) -> tuple[float, str]:
    """(job MTBF in seconds, where it came from) for `gpus` GPUs of `gpu_type`, from the ledger's `events()` and
    `nodes()`: failures are nodes of that type cordoned (the node check) and allocations on it whose lease expired
    (a holder that died), plus `extra_failures` (this flow's recoveries not in the ledger); exposure is the
    GPU-seconds of every allocation on that type. Pooled with the prior (interval.py)."""
    now = time.time() if now is None else now
    kind = {n.name: n.gpu_type for n in nodes}
    starts: dict[str, tuple[float, int]] = {}
    ends: dict[str, float] = {}
    failures = extra_failures
    for e in events:
        aid = e.detail.get("allocation")
        if e.kind == "allocated":
            n = sum(len(ix) for node, ix in e.detail.get("nodes", {}).items() if kind.get(node) == gpu_type)
            if n:
                starts[aid] = (e.ts, n)
        elif e.kind in ("released", "lease-expired") and aid:
            ends[aid] = e.ts
            failures += e.kind == "lease-expired" and aid in starts
        elif e.kind == "cordoned" and kind.get(e.subject) == gpu_type:
            failures += 1
    exposure = sum((ends.get(a, now) - t0) * n for a, (t0, n) in starts.items())
    mtbf = pooled_mtbf_s(gpus, failures, exposure)
    return mtbf, (f"ledger: {failures} failure(s) in {exposure / 3600:.1f} GPU-hours on {gpu_type}, pooled with the "
                  f"prior of one per {PRIOR_GPU_MTBF_S / 3600 / 8766:.1f} GPU-years")


def tune_auto(job: Any, ledger: Any, plan: Any, alloc: Any, failures: int, logger: Any) -> None:
    """For `checkpoint.every_steps: auto` without a user `mtbf_s`: the MTBF of the pool this attempt runs on (set
    on the attempt's copy of the job, so a recovery that moves the job re-tunes it)."""
    ck = job.training.checkpoint
    if ck.every_steps != "auto" or ck.mtbf_s is not None:
        return
    ck.mtbf_s, source = pool_mtbf(ledger.events(limit=100_000), ledger.nodes(), plan.gpu_type, alloc.gpus, failures)
    logger.info("checkpoint.every_steps auto: MTBF %.0f s for %d x %s (%s)", ck.mtbf_s, alloc.gpus, plan.gpu_type,
                source)


def replan_after_oom(job: Any, cluster: Any, rank_by: str, observations: list) -> list:
    """After an out-of-memory failure (already recorded in `observations`): MARP again on the whole cluster, with
    the peaks scaled by the calibration that explains every recorded OOM and the layout that ran out excluded on its
    GPU type (tasks/planning/calibration.py). The runnable plans (pp 1), best first; empty when none fits any more
    (the caller names the fixes). Any of them resumes the run: checkpoints reshard on load.

    (It used to keep the old plans whose *predicted* need was above the failed one's, which are the layouts that
    shard memory least, and left MARP's uncalibrated predictions in place.)"""
    from tasks.planning.plans import InfeasibleJobError, plan_resources

    try:
        plans = plan_resources(job, cluster, rank_by=rank_by, observations=observations)
    except InfeasibleJobError:
        return []
    return [p for p in plans if p.layout.pp == 1]
