"""`checkpoint.every_steps: auto` (tasks/training/interval.py): Young/Daly from the measured blocked time and drag,
the MTBF prior and a pool's history, and the fixed cadence it replaces."""

from __future__ import annotations

import math

from tasks.training import interval as I


def _run(c: I.Cadence, steps: int, step_s: float, busy_s: float, persist_steps: int, blocked_s: float) -> list[int]:
    """Drive the cadence with a clock: steps of `step_s`, `busy_s` while a persist runs (`persist_steps` after a
    save); returns the steps it saved at."""
    now, saves, persisting_until = 0.0, [], -1
    for step in range(1, steps + 1):
        busy = step <= persisting_until
        now += busy_s if busy else step_s
        c.step_done(now, busy)
        if c.due(step):
            now += blocked_s
            c.saved(step, blocked_s, persist_steps * busy_s)
            saves.append(step)
            persisting_until = step + persist_steps
    return saves


def test_fixed_cadence_saves_every_n_steps():
    c = I.Cadence(5, 100, gpus=1)
    assert _run(c, 20, 0.1, 0.1, 1, 0.01) == [5, 10, 15, 20]


def test_auto_measures_blocked_and_drag_and_picks_young_daly():
    reports = []
    c = I.Cadence("auto", 100000, gpus=8, mtbf_s=3600.0, report=reports.append)
    saves = _run(c, 3000, step_s=0.5, busy_s=0.6, persist_steps=4, blocked_s=0.2)
    assert saves[0] == I.FIRST_SAVE_STEPS
    inp = c.inputs
    # drag: 4 steps of persist, each 0.1 s slower (busy 0.6 vs idle 0.5): 0.4 s; plus 0.2 s blocked
    assert math.isclose(inp.blocked_s, 0.2) and math.isclose(inp.drag_s, 0.4, rel_tol=1e-6)
    assert math.isclose(inp.interval_s, math.sqrt(2 * 0.6 * 3600), rel_tol=1e-6)  # 65.7 s
    assert inp.every_steps == round(inp.interval_s / 0.5) == 131
    # the first save knows no drag yet (no step overlapped a persist): sqrt(2 x 0.2 x 3600) = 37.9 s, 76 steps
    assert saves[1] - saves[0] == 76 and saves[2] - saves[1] == 131
    assert [r.every_steps for r in reports] == [76, 131] and reports[0].mtbf_source == "checkpoint.mtbf_s"


def test_auto_is_never_shorter_than_a_persist_and_never_past_the_cap():
    c = I.Cadence("auto", 100000, gpus=1, mtbf_s=10.0)  # failures every 10 s: Young/Daly ~3 s
    _run(c, 200, step_s=0.1, busy_s=0.1, persist_steps=50, blocked_s=0.5)
    assert c.every >= 51  # a persist spans 50 steps: a shorter interval would defer every save
    slow = I.Cadence("auto", 10**9, gpus=1)  # the prior: 5.8 years for one GPU
    _run(slow, 30, step_s=1.0, busy_s=1.0, persist_steps=1, blocked_s=1.0)
    assert slow.inputs.interval_s == I.MAX_INTERVAL_S and "prior" in slow.inputs.mtbf_source


def test_pool_history_moves_the_mtbf_from_the_prior():
    assert math.isclose(I.prior_mtbf_s(16384), 54 * 86400 / 419)  # Llama 3: one interruption per 3.1 h
    # a pool that failed 9 times in 1000 GPU-hours: the observations dominate the one pseudo-failure of the prior
    got = I.pooled_mtbf_s(8, failures=9, gpu_seconds=1000 * 3600)
    assert math.isclose(got, (I.PRIOR_GPU_MTBF_S + 3.6e6) / 10 / 8)
    assert got < I.prior_mtbf_s(8) / 5
