"""The overdue rule (cluster/queue.py `horizon_s`): a job that has waited past the queue's horizon goes first, in
arrival order, and gets the head's reservation at once (cluster/sizing.py `Sizer.reserve_for`); jobs pass it only
as EASY backfilling allows. Each decision has a negative control with the rule off (`overdue=0`)."""

from __future__ import annotations

import pytest

from cluster.has import FreePool, GpuRequest, NodeInfo
from cluster.queue import Running, Waiting, horizon_s, ordered, walk
from cluster.sizing import Sizer

FAST = frozenset({"A100-40GB-SXM"})


def _w(job: str, seq: int, submitted: float, predicted: float | None) -> Waiting:
    return Waiting(job=job, seq=seq, submitted_s=submitted, predicted_s=predicted)


def test_a_long_job_past_the_horizon_goes_first_and_the_rule_off_keeps_the_aging_order():
    now = 10_000.0
    long_ = _w("long", 0, 0.0, 43_000.0)  # waited 10,000 s
    shorts = [_w(f"s{k}", k, now - wait, 60.0) for k, wait in ((1, 1_000.0), (2, 1_200.0), (3, 800.0))]
    # median wait of the four: (1,000 + 1,200) / 2 = 1,100 s; the horizon is 3 x that (above the median run, 60 s)
    assert horizon_s([long_, *shorts], now) == pytest.approx(3_300.0)
    assert [w.job for w in ordered([*shorts, long_], "shortest", now)][0] == "long"
    # negative control: with the rule off the aging keeps it last (10,000 / 43,000 ** 0.75 = 3.4 against 37 to 56)
    assert [w.job for w in ordered([*shorts, long_], "shortest", now, overdue=0)][-1] == "long"
    assert horizon_s([long_, *shorts], now, 0) == float("inf")
    # a long job that has waited less than the horizon keeps its place behind the short ones
    younger = _w("long", 0, now - 3_000.0, 43_000.0)
    assert horizon_s([younger, *shorts], now) == pytest.approx(3_300.0)
    assert [w.job for w in ordered([*shorts, younger], "shortest", now)][-1] == "long"
    # among overdue jobs, arrival order, whatever their length
    old2 = _w("old2", 9, 500.0, 100.0)
    order = [w.job for w in ordered([*shorts, old2, long_], "shortest", now)]
    assert order[:2] == ["long", "old2"]
    # scale-free: every time x 100 gives the same order
    scaled = [_w(w.job, w.seq, w.submitted_s * 100, (w.predicted_s or 0) * 100) for w in (*shorts, old2, long_)]
    assert [w.job for w in ordered(scaled, "shortest", now * 100)] == order
    # arrival-order queues are unchanged; jobs without a prediction still go last
    none = _w("none", 10, 0.0, None)
    assert [w.job for w in ordered([none, *shorts, long_], "shortest", now)][-1] == "none"
    assert [w.job for w in ordered([shorts[0], long_], "backfill", now)] == ["long", "s1"]


def _pass(jobs: dict[str, tuple[float, list[GpuRequest]]], overdue: float) -> tuple[dict[str, int], dict[str, str]]:
    """One scheduling pass at t = 10,000 s on one 8-GPU A100 node with 4 GPUs free and 4 busy until t = 12,000 s:
    each job is (submitted at, its requests). Returns the GPUs each placed job took, and every job's record."""
    now = 10_000.0
    pool = FreePool([NodeInfo("a0", "A100-40GB-SXM", 40, 300, 8)], {"a0": 4})
    running = [Running(end_s=12_000.0, nodes=(("a0", 4),))]
    waiting = [_w(j, k, sub, reqs[0].run_s) for k, (j, (sub, reqs)) in enumerate(jobs.items())]
    reqs_of = {j: reqs for j, (_, reqs) in jobs.items()}
    sizer = Sizer(pool, running, now, ordered(waiting, "shortest", now, overdue=overdue), reqs_of, overdue=overdue)
    placed: dict[str, int] = {}

    def try_place(w: Waiting, admit) -> bool:
        picked = sizer.pick(w, admit)
        if picked is None:
            return False
        pool.take(picked[0].nodes)
        placed[str(w.job)] = picked[0].gpus
        return True

    walk(waiting, "shortest", now, try_place, reserve_for=sizer.reserve_for, overdue=overdue)
    return placed, sizer.records


def _one(gpus: int, run_s: float) -> GpuRequest:
    return GpuRequest(gpus, 8, 1, FAST, run_s=run_s)


@pytest.mark.parametrize("overdue", [3.0, 0.0])
def test_the_overdue_head_holds_its_gpus_and_only_jobs_done_in_time_pass_it(overdue):
    # `head` (8 GPUs for 4,000 s) has waited 10,000 s: past the horizon (the median run, 4,000 s) but far from the
    # old reservation bound (30 x 4,000 s); it fits at 12,000 s when the busy GPUs free up
    jobs = {"head": (0.0, [_one(8, 4_000.0)]), "quick": (9_900.0, [_one(1, 500.0)]),
            "slow": (9_900.0, [_one(1, 5_000.0)])}
    placed, records = _pass(jobs, overdue)
    assert "head" not in placed
    assert placed.get("quick") == 1  # done at 10,500 s, before the reservation: EASY backfilling lets it pass
    if overdue:
        assert "holds the reservation from 2000 s from now" in records["head"]
        assert "overdue: waited 10000 s, past the queue's horizon 4000 s" in records["head"]
        assert "slow" not in placed  # it would still hold a GPU at 12,000 s, where the head needs all 8
        assert "after the queue head's reservation" in records["slow"]
    else:  # negative control: no reservation, the slow job takes a GPU the head needs
        assert placed.get("slow") == 1
        assert "reservation" not in records["head"]


@pytest.mark.parametrize("wide_run_s, backfilled", [(1_800.0, True), (2_500.0, False)])
def test_a_plan_done_before_the_reservation_runs_when_the_chosen_one_is_refused(wide_run_s, backfilled):
    # `mid`'s narrow plan (1 GPU, 3,000 s) would hold a GPU past 12,000 s and is refused; its 2-GPU plan runs now only
    # if it is done by then (1,800 s: yes; negative control 2,500 s: no, and it waits)
    jobs = {"head": (0.0, [_one(8, 4_000.0)]), "mid": (9_900.0, [_one(1, 3_000.0), _one(2, wide_run_s)]),
            "big": (10_000.0, [_one(4, 100_000.0)])}
    placed, records = _pass(jobs, 3.0)
    assert "holds the reservation" in records["head"]
    assert placed.get("mid") == (2 if backfilled else None)
    assert ("backfilled beside the queue head's reservation" in records["mid"]) == backfilled
    assert "big" not in placed
