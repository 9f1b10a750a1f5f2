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


def _measured(where: dict) -> tuple[I.Cadence, dict]:
    c = I.Cadence("auto", 100000, gpus=1, mtbf_s=3600.0)
    _run(c, 300, step_s=0.5, busy_s=0.6, persist_steps=4, blocked_s=0.2)
    memo = c.memo(where)
    assert memo is not None
    return c, memo


def test_a_restart_on_the_same_layout_starts_from_the_measured_cost():
    where = {"world": 1, "tp": 1, "device": "cpu", "threads": 1}
    before, memo = _measured(where)
    assert math.isclose(memo["cost_s"], 0.6, rel_tol=1e-6) and math.isclose(memo["step_s"], 0.5)
    reports = []
    after = I.Cadence("auto", 100000, gpus=1, mtbf_s=3600.0, report=reports.append)
    assert after.seed(memo, dict(where))
    after.start(40)
    # the Young interval of the measured cost at once, not FIRST_SAVE_STEPS then the blocked time alone
    assert after.every == before.every == 131 and not after.due(40 + I.FIRST_SAVE_STEPS)
    assert after.due(40 + 131) and reports[0].cost_source == "measured before the restart"


def test_a_restart_elsewhere_measures_again():
    _, memo = _measured({"world": 1, "tp": 1, "device": "cpu", "threads": 1})
    for where in ({"world": 2, "tp": 1, "device": "cpu", "threads": 1},
                  {"world": 1, "tp": 1, "device": "NVIDIA H100 80GB HBM3", "threads": 1}):
        c = I.Cadence("auto", 100000, gpus=1, mtbf_s=3600.0)
        assert not c.seed(memo, where)
        c.start(0)
        assert c.every == I.FIRST_SAVE_STEPS and c.due(I.FIRST_SAVE_STEPS)
    broken = I.Cadence("auto", 100000, gpus=1)
    assert not broken.seed({**memo, "step_s": "nan"}, memo["where"]) and not broken.seed(None, memo["where"])
    assert not I.Cadence(5, 100, gpus=1).seed(memo, memo["where"])  # a fixed interval stays fixed


def test_before_an_interval_is_measured_auto_never_checkpoints_back_to_back():
    """The first save knows only its blocked time (a millisecond): Young/Daly of that alone would checkpoint every
    step; until the cost of one whole interval is measured the interval stays at least FIRST_SAVE_STEPS."""
    c = I.Cadence("auto", 100000, gpus=1, mtbf_s=4.0)
    saves = _run(c, 60, step_s=0.07, busy_s=0.12, persist_steps=3, blocked_s=0.001)
    assert saves[:2] == [I.FIRST_SAVE_STEPS, 2 * I.FIRST_SAVE_STEPS]
    assert c.inputs.cost_source == "measured" and c.inputs.cost_s > 0.1  # three steps 0.05 s slower, measured
    assert c.memo({"device": "cpu"})["cost_s"] > 0.1


def test_the_trainer_carries_the_measured_cost_across_a_restart(tmp_path):
    """A real run with `auto`: its checkpoints carry the measured figures, and the resumed process starts from them."""
    from tasks.training import checkpoint as ck
    from tasks.training.launch import launch
    from tasks.training.storage import Storage
    from tests.trainer_util import progress, tiny_job

    uri = f"file://{tmp_path}/ck"
    job = tiny_job(uri, 60, checkpoint={"every_steps": "auto", "uri": uri, "keep": 3, "mtbf_s": 2.0})
    launch(job, tmp_path / "a", device="cpu", threads=1, stop_after_steps=40)
    newest = ck.committed(Storage(uri))[0]
    memo = newest.trainer["cadence"]
    assert memo["where"] == {"world": 1, "tp": 1, "device": "cpu", "threads": 1} and memo["cost_s"] >= 0
    res = launch(job, tmp_path / "b", device="cpu", threads=1, resume=True)
    assert res.resumed_from_step == newest.step and res.final_step == 60
    first = next(r for r in progress(tmp_path / "b") if r["event"] == "checkpoint_interval")
    assert first["cost_source"] == "measured before the restart" and first["step_s"] == memo["step_s"]
