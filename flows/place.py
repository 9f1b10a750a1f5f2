"""The `place` stage as Prefect objects: allocate a job's plans through the ledger, waiting in the queue.

    from flows.place import placed
    with placed("my-job", plans) as alloc:      # waits, then holds the GPUs under a renewed lease
        run_training(alloc)                      # released on every exit path, exceptions included

`place` is the Prefect task: it submits the job, logs its queue position while it waits, and returns the
`Allocation`; `release` is its counterpart. The context manager `placed` pairs them with a heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from prefect import get_run_logger, task
from prefect.exceptions import MissingContextError

from cluster.catalog import default_catalog
from cluster.has import GpuRequest, requests_from_plans
from cluster.ledger import DEFAULT_LEASE_S, Allocation, LeaseKeeper, LeaseLost, Ledger, LedgerError, QueueOrder, QueueTimeout
from cluster.sizing import exact_type_requests
from tasks.planning.plans import ResourcePlan


def _log(msg: str) -> None:
    try:
        get_run_logger().info(msg)
    except MissingContextError:
        print(msg, flush=True)


def requests_for(plans: Sequence[ResourcePlan], precision: str = "bf16-mixed", steps: int | None = None
                 ) -> list[GpuRequest]:
    """HAS requests for `plans`. With `steps`, one request per plan for exactly its GPU type, carrying its predicted
    run time: the queue then sizes the job by load and keeps GPUs busy (cluster/sizing.py). Without, the paper's
    ranked requests (first fit)."""
    if steps:
        return exact_type_requests(plans, steps)[0]
    return requests_from_plans(plans, default_catalog(), precision, steps)[0]


def predicted_run_s(plans: Sequence[ResourcePlan], steps: int | None) -> float | None:
    """The job's predicted run time on its first plan (MARP's step time x steps), for `order="shortest"`."""
    return steps * plans[0].est_step_time_s if steps and plans else None


def wait_for_allocation(ledger: Ledger, job: str, requests: Sequence[GpuRequest], *, timeout_s: float = 3600.0,
                        poll_s: float = 1.0, lease_s: float = DEFAULT_LEASE_S, order: QueueOrder | None = None,
                        predicted_s: float | None = None) -> Allocation:
    """Submit `job` and block until HAS places it; progress (queue position, waited time) is logged.
    `order` None is the ledger's (`FRENZY_QUEUE_ORDER`, default backfill)."""
    if not ledger.could_ever_fit(requests):
        biggest = max(requests, key=lambda r: r.min_mem_gib * r.gpus)
        nodes = ", ".join(f"{n.name} ({n.gpus} x {n.gpu_type}, {n.mem_gib:.0f} GiB)" for n in ledger.nodes())
        raise LedgerError(f"{job}: none of its {len(requests)} plans fits this ledger's nodes even when every GPU is "
                          f"free (e.g. {biggest.gpus} GPUs with >= {biggest.min_mem_gib:.1f} GiB each); nodes: "
                          f"{nodes or '(none)'}. Add nodes (`frenzy cluster init --cluster FILE`), plan for this "
                          "cluster, or shrink the job")
    ledger.submit(job, requests, lease_s=lease_s, predicted_s=predicted_s)
    deadline, last = time.monotonic() + timeout_s, -1.0
    try:
        while True:
            ledger.schedule(order)
            st = ledger.queue_status(job, renew_s=lease_s)
            if st.state == "placed" and st.allocation_id is not None:
                alloc = ledger.allocation(st.allocation_id)
                _log(f"{job}: placed after {st.waited_s:.1f} s on " +
                     ", ".join(f"{n.node}[{','.join(map(str, n.gpu_indices))}]" for n in alloc.nodes))
                return alloc
            if st.state != "waiting":
                raise LedgerError(f"{job}: left the queue ({st.state}); submit it again")
            if time.monotonic() > deadline:
                raise QueueTimeout(f"{job}: no plan fitted within {timeout_s:.0f} s (queue position "
                                   f"{st.position}); free GPUs, uncordon nodes or raise the timeout")
            if time.monotonic() - last >= 10 * poll_s:
                ahead = [q.predicted_s for q in ledger.queue()][: max(0, st.position - 1)]
                work = f", {sum(a for a in ahead if a) / 60:.1f} min of predicted work ahead" if any(ahead) else ""
                _log(f"{job}: waiting, queue position {st.position}{work}, {st.waited_s:.0f} s so far "
                     f"(gives up after {timeout_s:.0f} s)")
                last = time.monotonic()
            time.sleep(poll_s)
    except BaseException:
        ledger.cancel(job)
        raise


@task(name="place", retries=0)
def place(job: str, plans: list[ResourcePlan], ledger_url: str | None = None, timeout_s: float = 3600.0,
          lease_s: float = DEFAULT_LEASE_S, precision: str = "bf16-mixed", steps: int | None = None,
          order: QueueOrder | None = None) -> Allocation:
    """HAS over the live ledger: the job's allocation once one of its plans fits (waits in the queue).
    `steps` gives the queue the job's predicted run time (used by `order="shortest"`)."""
    return wait_for_allocation(Ledger(ledger_url), job, requests_for(plans, precision, steps), timeout_s=timeout_s,
                               lease_s=lease_s, order=order, predicted_s=predicted_run_s(plans, steps))


@task(name="release")
def release(allocation_id: str, ledger_url: str | None = None) -> int:
    """Free an allocation; returns how many queued jobs the freed GPUs let start."""
    return len(Ledger(ledger_url).release(allocation_id))


@contextmanager
def placed(job: str, plans: Sequence[ResourcePlan], *, ledger_url: str | None = None, timeout_s: float = 3600.0,
           lease_s: float = DEFAULT_LEASE_S, precision: str = "bf16-mixed", steps: int | None = None,
           order: QueueOrder | None = None) -> Iterator[Allocation]:
    """Allocate (waiting), keep the lease alive while the body runs, release on every exit path."""
    ledger = Ledger(ledger_url)
    alloc = wait_for_allocation(ledger, job, requests_for(plans, precision, steps), timeout_s=timeout_s, lease_s=lease_s,
                                order=order, predicted_s=predicted_run_s(plans, steps))
    keeper = LeaseKeeper(ledger, alloc.id, lease_s)
    try:
        with keeper:
            yield alloc
        if keeper.lost.is_set():
            raise LeaseLost(f"{job}: its lease expired while it ran (the heartbeat could not reach the ledger); "
                            "the GPUs may have been given to another job, so its results are not trusted")
    finally:
        ledger.release(alloc.id, by_holder=True)  # the body (its trainer) has ended
