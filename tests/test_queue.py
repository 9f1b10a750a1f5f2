"""The queue discipline (cluster/queue.py) that the live ledger and the simulator share."""

from __future__ import annotations

import pytest

from cluster.has import FreePool, GpuRequest, NodeInfo, decide
from cluster.inventory import Cluster, Node
from cluster.ledger import Ledger
from cluster.queue import Running, Waiting, ordered, reserve, walk
from cluster.sizing import RESERVE_AFTER


def _w(job: str, seq: int, submitted: float, predicted: float | None) -> Waiting:
    return Waiting(job=job, seq=seq, submitted_s=submitted, predicted_s=predicted)


def test_shortest_first_with_aging_bounds_the_wait_of_a_long_job():
    long_ = _w("long", 0, 0.0, 10_000.0)
    early = _w("early", 1, 9_000.0, 1_000.0)
    # priority waited / predicted ** 0.75: the short job's grows (10,000 / 1,000) ** 0.75 = 5.6 times as fast, so
    # it passes the long one once it has waited 1 / 5.6 of the long one's wait, not before; a fresh job (0) never
    # passes one that has waited, so a stream of short jobs cannot hold a long one back for ever
    assert [w.job for w in ordered([early, long_], "shortest", 10_000.0)] == ["long", "early"]  # 10.0 > 5.6
    assert [w.job for w in ordered([long_, early], "shortest", 12_000.0)] == ["early", "long"]  # 16.9 > 12.0
    fresh = _w("fresh", 2, 12_000.0, 10.0)
    assert [w.job for w in ordered([fresh, long_, early], "shortest", 12_000.0)][-1] == "fresh"
    # a fresh queue is shortest first
    assert [w.job for w in ordered([long_, _w("s", 3, 0.0, 5.0)], "shortest", 0.0)] == ["s", "long"]
    # the key is scale-free: every time x 100 leaves the order unchanged
    for now, want in ((10_000.0, ["long", "early"]), (12_000.0, ["early", "long"])):
        scaled = [_w(w.job, w.seq, w.submitted_s * 100, w.predicted_s * 100) for w in (early, long_)]
        assert [w.job for w in ordered(scaled, "shortest", now * 100)] == want
    # beta 0 is arrival order, beta 1 highest response ratio next
    assert [w.job for w in ordered([early, long_], "shortest", 11_000.0, aging=0.0)] == ["long", "early"]
    assert [w.job for w in ordered([long_, early], "shortest", 11_000.0, aging=1.0)] == ["early", "long"]
    # jobs without a prediction go last; arrival order ignores predictions
    none = _w("none", 3, 0.0, None)
    assert [w.job for w in ordered([none, long_, early], "shortest", 0.0)][-1] == "none"
    assert [w.job for w in ordered([early, none, long_], "backfill", 0.0)] == ["long", "early", "none"]


def test_strict_blocks_behind_the_first_misfit_and_backfill_does_not():
    ws = [_w("a", 0, 0.0, None), _w("b", 1, 0.0, None), _w("c", 2, 0.0, None)]
    fits = {"a": True, "b": False, "c": True}
    placed, left, res = walk(ws, "backfill", 0.0, lambda w, admit: fits[w.job])
    assert [w.job for w in placed] == ["a", "c"] and [w.job for w in left] == ["b"] and res is None
    placed, left, _ = walk(ws, "strict", 0.0, lambda w, admit: fits[w.job])
    assert [w.job for w in placed] == ["a"] and [w.job for w in left] == ["b", "c"]


def test_the_ledger_places_its_queue_in_the_shared_order(tmp_path, monkeypatch):
    monkeypatch.delenv("FRENZY_QUEUE_ORDER", raising=False)
    now = [0.0]  # the priority is waited / predicted ** 0.75: a clock the test moves, not the machine's
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}", clock=lambda: now[0])
    assert led.order == "shortest"  # the default, the same policy as `frenzy simulate --policy has`
    led.sync(Cluster(name="one", nodes=[Node(name="n", gpu="A100-80GB-PCIE", count=1)]))
    blocker = led.allocate("blocker", [GpuRequest(1, 10)])
    led.submit("long", [GpuRequest(1, 10)], predicted_s=5_000.0)
    now[0] = 1.0
    led.submit("short", [GpuRequest(1, 10)], predicted_s=50.0)
    now[0] = 10.0  # short: 9 / 50 ** 0.75 = 0.48, long: 10 / 5,000 ** 0.75 = 0.017
    assert led.queue_status("short").position == 1 and led.queue_status("long").position == 2
    placed = led.release(blocker.id)
    assert [a.job for a in placed] == ["short"]


def _pool() -> FreePool:
    return FreePool([NodeInfo("a", "A100", 80.0, 600.0, 4), NodeInfo("b", "A100", 80.0, 600.0, 2)])


def test_the_head_reserves_the_earliest_time_it_fits_and_backfill_cannot_delay_it():
    pool = _pool()
    pool.take([("a", 3)])  # one GPU of a and both of b free now: 3, the head needs 4
    running = [Running(300.0, (("b", 0),)), Running(100.0, (("a", 3),)), Running(float("inf"), ())]
    head = [GpuRequest(4, 40.0)]
    res = reserve("head", pool, running, 0.0, lambda at: decide(at, head) is not None)
    assert res is not None and res.start_s == 100.0  # node a frees at 100 s: the head fits there then
    assert res.admits([("a", 1)], 50.0, 0.0)  # done before the head starts
    assert res.admits([("b", 2)], 10_000.0, 0.0)  # the head fits on a alone at 100 s: admitted, however long
    assert not res.admits([("a", 1)], 500.0, 0.0)  # now it would leave the head 3 GPUs at 100 s: refused
    assert not res.admits([("a", 1)], None, 0.0)  # an unknown run time is assumed to run past the reservation
    assert res.admits([("a", 1)], 100.0, 0.0)  # ends as the head starts


def test_no_reservation_when_the_head_never_fits_on_what_is_predicted_to_free():
    pool = _pool()
    pool.take([("a", 4)])
    res = reserve("head", pool, [Running(float("inf"), (("a", 4),))], 0.0,
                  lambda at: decide(at, [GpuRequest(4, 40.0)]) is not None)
    assert res is None


def test_walk_gives_the_reservation_to_the_first_job_that_does_not_fit_only():
    ws = [_w("head", 0, 0.0, None), _w("long", 1, 0.0, None), _w("quick", 2, 0.0, None)]
    asked: list[str] = []
    pool = _pool()
    pool.take([("a", 3), ("b", 2)])
    running = [Running(100.0, (("a", 3),))]

    def reserve_for(w: Waiting):
        asked.append(w.job)
        return reserve(w.job, pool, running, 0.0, lambda at: decide(at, [GpuRequest(4, 40.0)]) is not None)

    run_s = {"long": 500.0, "quick": 50.0}

    def try_place(w: Waiting, admit) -> bool:
        return w.job != "head" and admit([("a", 1)], run_s[w.job])

    placed, left, res = walk(ws, "backfill", 0.0, try_place, reserve_for=reserve_for)
    assert asked == ["head"] and res is not None and res.job == "head" and res.start_s == 100.0
    assert [w.job for w in placed] == ["quick"] and [w.job for w in left] == ["head", "long"]
    placed, _, _ = walk(ws, "backfill", 0.0, try_place)  # without a reservation, plain backfilling
    assert [w.job for w in placed] == ["long", "quick"]


@pytest.mark.parametrize("with_prediction", [True, False])
def test_the_ledger_does_not_backfill_past_the_heads_reservation(tmp_path, monkeypatch, with_prediction):
    monkeypatch.delenv("FRENZY_QUEUE_ORDER", raising=False)
    DAY = 86_400.0  # leases that outlive the test's clock (no heartbeats here)
    now = [0.0]  # a clock the test moves (the queue's priority and the reservation read it)
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}", clock=lambda: now[0])
    led.sync(Cluster(name="four", nodes=[Node(name="n", gpu="A100-80GB-PCIE", count=4)]))
    blocker = led.allocate("blocker", [GpuRequest(2, 10)], predicted_s=10_000.0 if with_prediction else None,
                           lease_s=DAY)
    led.submit("big", [GpuRequest(4, 10)], predicted_s=10.0, lease_s=DAY)  # the head: shortest, but does not fit now
    now[0] = 2.0
    led.submit("early", [GpuRequest(1, 10)], predicted_s=20_000.0, lease_s=DAY)
    # the head has waited less than RESERVE_AFTER x its run: no reservation holds the queue back yet
    assert [a.job for a in led.schedule()] == ["early"]
    now[0] = 1.0 + RESERVE_AFTER * 10.0
    led.submit("long", [GpuRequest(1, 10)], predicted_s=20_000.0, lease_s=DAY)  # would still run when big could start
    placed = led.schedule()
    if with_prediction:
        assert placed == []  # long waits: it would push big past the predicted ends of blocker and early
        led.submit("short", [GpuRequest(1, 10)], predicted_s=5.0, lease_s=DAY)
        assert [a.job for a in led.schedule()] == ["short"]  # done long before: backfilled
    else:
        assert [a.job for a in placed] == ["long"]  # the blocker's end is unknown: no reservation to protect
    led.release(blocker.id)
