"""The `place` task and the `simulate` flow on a real Prefect test server."""

import threading
import time

import pytest

from cluster.has import GpuRequest
from cluster.inventory import Cluster, Node
from cluster.ledger import Ledger
from tasks.jobspec import parse_job
from tasks.planning.plans import plan_resources

TWO = Cluster(name="two", nodes=[Node(name="a", gpu="A100-80GB-PCIE", count=2)])


def plans():
    job = parse_job({"name": "p", "model": {"preset": "gpt2-124m"}, "training": {"global_batch": 16}})
    return [p for p in plan_resources(job, TWO) if p.gpus == 2]


def test_placed_waits_in_the_queue_and_releases_on_error(tmp_path):
    from flows.place import placed

    url = f"sqlite:///{tmp_path / 'l.db'}"
    led = Ledger(url)
    led.sync(TWO)
    blocker = led.allocate("blocker", [GpuRequest(1, 10)])
    threading.Timer(1.0, lambda: led.release(blocker.id)).start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="boom"):
        with placed("job", plans(), ledger_url=url, timeout_s=30, lease_s=5, steps=1000, order="shortest") as alloc:
            assert time.monotonic() - t0 >= 0.9  # it waited for the blocker
            assert led.queue() == []  # placed, no longer waiting
            with led.engine.connect() as conn:  # the queue entry carries MARP's predicted run time
                got = conn.exec_driver_sql("SELECT predicted_s FROM queue WHERE job = 'job'").scalar()
            assert got == pytest.approx(1000 * plans()[0].est_step_time_s)
            assert alloc.gpus == 2 and [a.job for a in led.allocations()] == ["job"]
            raise RuntimeError("boom")
    assert led.allocations() == []  # released on the exception path
    assert [e.kind for e in led.events()][-2:] == ["allocated", "released"]


def test_place_task_and_simulate_flow_on_prefect(prefect_server, tmp_path):
    from prefect import flow

    from flows.place import place, release
    from flows.simulate import SimulateRequest, simulate_flow

    url = f"sqlite:///{tmp_path / 'l.db'}"
    Ledger(url).sync(TWO)

    @flow
    def run_once() -> int:
        alloc = place("p1", plans(), ledger_url=url, timeout_s=10)
        try:
            return alloc.gpus
        finally:
            release(alloc.id, ledger_url=url)

    assert run_once() == 2 and Ledger(url).allocations() == []
    doc = simulate_flow(SimulateRequest(cluster="frenzy-testbed", trace="newworkload:6:2", policies=["has", "fifo"]))
    assert set(doc["policies"]) == {"has", "fifo"} and doc["policies"]["has"]["completed"] == 6
    doc = simulate_flow(SimulateRequest(trace="production:30:1", policies=["fcfs"], load=0.7))
    assert doc["offered_load"] == pytest.approx(0.7) and doc["policies"]["fcfs"]["jobs"] == 30
