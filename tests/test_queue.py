"""The queue discipline (cluster/queue.py) that the live ledger and the simulator share."""

from __future__ import annotations

from cluster.has import GpuRequest
from cluster.inventory import Cluster, Node
from cluster.ledger import Ledger
from cluster.queue import Waiting, ordered, walk


def _w(job: str, seq: int, submitted: float, predicted: float | None) -> Waiting:
    return Waiting(job=job, seq=seq, submitted_s=submitted, predicted_s=predicted)


def test_shortest_first_with_aging_bounds_the_wait_of_a_long_job():
    long_ = _w("long", 0, 0.0, 10_000.0)
    early = _w("early", 1, 9_000.0, 1_000.0)
    late = _w("late", 2, 18_500.0, 1_000.0)
    # each second waited forgives half a second of predicted run time: a shorter job that came soon after the long
    # one still goes first, but one that arrives after the long job has waited 2 x (10,000 - 1,000) s does not,
    # so a stream of short jobs cannot hold a long one back for ever
    assert [w.job for w in ordered([long_, early, late], "shortest", 18_500.0, aging=0.5)] == ["early", "long", "late"]
    # without aging the stream always wins
    assert [w.job for w in ordered([long_, early, late], "shortest", 1e9, aging=0.0)] == ["early", "late", "long"]
    # jobs without a prediction go last; arrival order ignores predictions
    none = _w("none", 3, 0.0, None)
    assert [w.job for w in ordered([none, long_, early], "shortest", 0.0)][-1] == "none"
    assert [w.job for w in ordered([early, none, long_], "backfill", 0.0)] == ["long", "early", "none"]


def test_strict_blocks_behind_the_first_misfit_and_backfill_does_not():
    ws = [_w("a", 0, 0.0, None), _w("b", 1, 0.0, None), _w("c", 2, 0.0, None)]
    fits = {"a": True, "b": False, "c": True}
    placed, left = walk(ws, "backfill", 0.0, lambda w: fits[w.job])
    assert [w.job for w in placed] == ["a", "c"] and [w.job for w in left] == ["b"]
    placed, left = walk(ws, "strict", 0.0, lambda w: fits[w.job])
    assert [w.job for w in placed] == ["a"] and [w.job for w in left] == ["b", "c"]


def test_the_ledger_places_its_queue_in_the_shared_order(tmp_path, monkeypatch):
    monkeypatch.delenv("FRENZY_QUEUE_ORDER", raising=False)
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    assert led.order == "shortest"  # the default, the same policy as `frenzy simulate --policy has`
    led.sync(Cluster(name="one", nodes=[Node(name="n", gpu="A100-80GB-PCIE", count=1)]))
    blocker = led.allocate("blocker", [GpuRequest(1, 10)])
    led.submit("long", [GpuRequest(1, 10)], predicted_s=5_000.0)
    led.submit("short", [GpuRequest(1, 10)], predicted_s=50.0)
    assert led.queue_status("short")["position"] == 1 and led.queue_status("long")["position"] == 2
    placed = led.release(blocker.id)
    assert [a.job for a in placed] == ["short"]
