"""tasks/latest.py: the progress relay never waits on a slow API (red team 41h N15, N23)."""

from __future__ import annotations

import threading

from tasks.latest import LatestOnly


def test_put_never_waits_for_a_stuck_post_and_the_newest_value_is_posted_when_it_frees():
    gate, entered = threading.Event(), threading.Event()
    posted: list[int] = []

    def post(v: int) -> None:  # the API stuck on the first value until the gate opens
        entered.set()
        gate.wait()
        posted.append(v)

    bar = LatestOnly(post)
    bar.put(0)
    assert entered.wait(60)
    for v in range(1, 101):  # the relay goes on while the first post hangs: none of these waits
        bar.put(v)
    gate.set()
    assert bar.close(timeout_s=60)
    assert posted[0] == 0 and posted[-1] == 100 and len(posted) <= 3, posted  # the newest, not all 100 in turn
    assert bar.dropped >= 98


def test_a_post_that_raises_is_reported_and_later_values_are_still_posted():
    errors: list[BaseException] = []
    posted: list[int] = []
    fail = {1}

    def post(v: int) -> None:
        if v in fail:
            raise ConnectionError(f"503 on {v}")
        posted.append(v)

    bar = LatestOnly(post, on_error=errors.append)
    bar.put(1)
    assert bar.close(timeout_s=60)  # drained: the failed one reported
    bar2 = LatestOnly(post, on_error=errors.append)
    bar2.put(2)
    assert bar2.close(timeout_s=60)
    assert [str(e) for e in errors] == ["503 on 1"] and posted == [2]


def test_close_does_not_hold_the_caller_on_a_post_that_never_returns():
    gate = threading.Event()
    bar = LatestOnly(lambda _: gate.wait())
    bar.put(1)
    assert bar.close(timeout_s=0.2) is False  # the stuck API is left behind (a daemon thread), the run goes on
    gate.set()
