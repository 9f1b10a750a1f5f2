"""The spike guard: bounded, counted handling of loss spikes (issue 30.1), alone and in the default `submit` job."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tasks.jobspec import SpikeSpec, parse_job
from tasks.training.guard import MAX_OVERFLOWS, SpikeError, SpikeGuard
from tests.trainer_util import progress, run, start

ROOT = Path(__file__).resolve().parents[1]


def _warm(g: SpikeGuard, n: int = 8, step0: int = 1) -> int:
    """Healthy, flat history; returns the next step."""
    for i in range(n):
        assert g.judge(step0 + i, 3.0 + 0.01 * (i % 3), 1.0 + 0.01 * (i % 2)).action == "apply"
        g.passed(step0 + i)
    return step0 + n


def test_a_level_change_with_nothing_to_roll_back_to_is_skipped_at_most_max_consecutive_times():
    """The default run's case: the same weights meet batch after batch and every one is flagged (skipping an
    update changes nothing). The guard skips 2, trains through the 3rd, counts all, and judges again later."""
    g = SpikeGuard(SpikeSpec(window=16, min_steps=8, max_consecutive=2), global_batch=16)
    step = _warm(g)
    actions = []
    for k in range(2):
        d = g.judge(step, 3.0, 5.0)  # gradient norm up 5x: a spike against the flat history
        actions.append(d.action)
        g.skipped(step, 3.0, 5.0, d.verdict, g.window(100 + 16 * k, rolled_back=False), None)
    d = g.judge(step, 3.0, 5.0)
    actions.append(d.action)
    assert actions == ["skip", "skip", "apply"]
    assert d.record is not None and d.record.action == "trained_through"
    assert g.counts.model_dump() == {"spikes": 3, "rollbacks": 0, "skipped_updates": 2, "skipped_samples": 32,
                                     "trained_through": 1, "overflow_skips": 0, "diverging_at": None}
    # the history restarted at the new level: that level is healthy now, and the guard needs history again
    g.passed(step)
    for i in range(1, 9):
        assert g.judge(step + i, 3.0, 5.0 + 0.01 * (i % 2)).action == "apply"
        g.passed(step + i)
    assert g.judge(step + 9, 3.0, 30.0).action == "skip"  # a new streak is judged and skipped again


def test_without_rollback_only_the_spike_batch_is_left_out_and_after_a_rollback_the_window():
    g = SpikeGuard(SpikeSpec(skip_batches=4), global_batch=16)
    assert g.window(320, rolled_back=False) == (320, 336)
    assert g.window(320, rolled_back=True) == (320, 384)


def test_only_a_loss_spike_rolls_back_a_gradient_norm_spike_with_the_loss_in_range_drops_its_batch():
    """Red team 41i: the default detector flagged 8-20 ordinary steps of a 1,500-step gpt-tiny run by their gradient
    norm alone (z 6-14, the loss in range) and rolled each back. Such a step harmed nothing: it drops only its update
    and batch; a loss spike (and a non-finite one) still rolls back."""
    g = SpikeGuard(SpikeSpec(window=16, min_steps=8, max_consecutive=8), global_batch=8)  # judged, not trained through
    step = _warm(g)
    grad = g.judge(step, 3.01, 9.0)  # gradient norm 9x, loss as before
    assert grad.action == "skip" and grad.verdict.kind == "gradient" and not g.may_roll_back(grad.verdict)
    loss = g.judge(step, 9.0, 1.0)  # the negative control: the loss spiked
    assert loss.action == "skip" and loss.verdict.kind == "loss" and g.may_roll_back(loss.verdict)
    both = g.judge(step, 9.0, 9.0)
    assert both.verdict.kind == "loss" and g.may_roll_back(both.verdict)
    nonfinite = g.judge(step, math.nan, 1.0)
    assert nonfinite.verdict.kind == "nonfinite" and g.may_roll_back(nonfinite.verdict)
    assert not SpikeGuard(SpikeSpec(rollback=False), global_batch=8).may_roll_back(loss.verdict)
    # its skipped update changed no weight: the checkpoints after it stay rollback targets; after a loss spike's
    # skipped update (nothing to roll back to) they do not, for a window
    g.skipped(step, 3.01, 9.0, grad.verdict, g.window(80, rolled_back=False), None)
    assert g.detector.last_spike_step is None
    g.skipped(step, 9.0, 1.0, loss.verdict, g.window(88, rolled_back=False), None)
    assert g.detector.last_spike_step == step


def test_a_rollback_is_counted_and_a_healthy_update_past_the_spike_ends_the_streak():
    g = SpikeGuard(SpikeSpec(window=16, min_steps=8, max_consecutive=1), global_batch=8)
    step = _warm(g)
    d = g.judge(step, 9.0, 1.0)
    assert d.action == "skip"
    rec = g.skipped(step, 9.0, 1.0, d.verdict, g.window(80, rolled_back=True), rolled_back_to=step - 5)
    assert rec.action == "rolled_back" and rec.skipped_samples == [80, 112]
    assert g.counts.rollbacks == 1 and g.counts.skipped_samples == 32
    # the replay below the spike step does not end the streak; passing it does
    g.passed(step - 1)
    assert g.judge(step + 1, 9.0, 1.0).action == "apply"  # 2nd in the streak: max_consecutive=1, trained through
    g2 = SpikeGuard(SpikeSpec(window=16, min_steps=8, max_consecutive=1), global_batch=8)
    step = _warm(g2)
    d = g2.judge(step, 9.0, 1.0)
    g2.skipped(step, 9.0, 1.0, d.verdict, g2.window(80, rolled_back=True), rolled_back_to=step - 5)
    g2.passed(step)
    assert g2.judge(step + 1, 9.0, 1.0).action == "skip"  # a new streak


def test_a_non_finite_loss_is_never_applied_past_the_bound_the_run_stops_with_the_fix():
    g = SpikeGuard(SpikeSpec(max_consecutive=2), global_batch=8)
    for _ in range(2):
        assert g.judge(5, math.nan, 1.0).action == "skip"
    with pytest.raises(SpikeError, match="training.lr"):
        g.judge(5, math.nan, 1.0)


def _roll(g: SpikeGuard, step: int, loss: float, to: int) -> None:
    d = g.judge(step, loss, 1.0)
    assert d.action == "skip"
    g.bound_rollbacks(g.skipped(step, loss, 1.0, d.verdict, g.window(0, rolled_back=True), rolled_back_to=to))


def test_rollbacks_that_never_get_past_their_spike_are_bounded_and_passing_it_recovers():
    """Red team 41o S10: each round trained through the replayed spike (the streak ended), met the same non-finite
    loss further on and rolled back again, for ever. Rollbacks now count until a healthy update reaches the
    furthest spike they answered; one more than the bound stops the run, naming the steps and the fixes."""
    g = SpikeGuard(SpikeSpec(window=4, min_steps=2, max_consecutive=1, max_rollbacks=2), global_batch=8)
    _warm(g)  # steps 1-8; the loss is non-finite at step 12, which rolls back to step 5
    _roll(g, 12, math.nan, 5)
    for big in (1e6, 1e12):  # each replay trains through a spike at step 9 (the streak ends), then meets step 12
        assert g.judge(9, big, 1.0).record is not None
        for s in range(9, 12):
            if s > 9:
                assert g.judge(s, 3.0, 1.0).action == "apply"
            g.passed(s)  # the replay below step 12 is not recovery
        if big == 1e6:
            _roll(g, 12, math.nan, 5)
    with pytest.raises(SpikeError) as e:
        _roll(g, 12, math.nan, 5)
    msg = str(e.value)
    assert msg.startswith("3 rollbacks to step 5 in a row never got the run past step 12")
    assert "non-finite at step 12 each time" in msg and "its newest checkpoint step 5" in msg
    assert "lower training.lr" in msg and "training.spike.max_rollbacks (now 2)" in msg
    # a transient spike: the run passes it after its rollback, and the count starts again
    t = SpikeGuard(SpikeSpec(window=16, min_steps=8, max_consecutive=1, max_rollbacks=1), global_batch=8)
    step = _warm(t)
    for _ in range(3):
        _roll(t, step, 90.0, step - 4)
        t.passed(step)
        step += 1
    assert t.counts.rollbacks == 3
    # the bound is never below max_consecutive, the rollbacks one spike may take
    c = SpikeGuard(SpikeSpec(window=16, min_steps=8, max_consecutive=3, max_rollbacks=1), global_batch=8)
    step = _warm(c)
    for _ in range(3):
        _roll(c, step, 90.0, step - 4)
    assert c.counts.rollbacks == 3


def test_a_run_whose_rollbacks_never_get_past_a_non_finite_loss_stops_by_itself(tmp_path):
    """The red team's run (gpt-tiny, lr 30, a checkpoint every 20 steps) rolled back to step 20 from a non-finite
    loss at step 50 158 times in 100 s and never ended; it now stops with exit 2, the message, and the step it
    rolled back to as its newest commit."""
    job = parse_job({"name": "div", "model": {"preset": "gpt-tiny"},
                     "training": {"steps": 400, "seq_len": 64, "global_batch": 4, "lr": 30.0, "trace_every_steps": 0,
                                  "checkpoint": {"every_steps": 20, "keep": 3, "uri": f"file://{tmp_path}/ck"}}})
    p = start(job, tmp_path / "run")
    try:
        rc = p.wait(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    log = (tmp_path / "run" / "train.log").read_text()
    assert rc == 2, log[-3000:]
    [line] = [ln for ln in log.splitlines() if "never got the run past step" in ln]
    assert "non-finite" in line and "training.spike.max_rollbacks" in line and "lower training.lr" in line
    target = int(line.split("its newest checkpoint step ")[1].split(":")[0])
    assert sorted(d.name for d in (tmp_path / "ck").iterdir() if d.name.startswith("step_"))[-1] == \
        f"step_{target:08d}"
    rollbacks = [r for r in progress(tmp_path / "run") if r["event"] == "spike" and r["rolled_back_to"] is not None]
    assert len(rollbacks) <= 2 * (SpikeSpec().max_rollbacks + 1)


def test_fp16_overflows_are_the_scalers_skips_not_spikes_and_are_bounded():
    g = SpikeGuard(SpikeSpec(), global_batch=8, scaler_enabled=True)
    for _ in range(MAX_OVERFLOWS):
        assert g.judge(1, 5.0, math.inf).action == "overflow"
    assert g.counts.spikes == 0 and g.counts.overflow_skips == MAX_OVERFLOWS
    with pytest.raises(SpikeError, match="bf16"):
        g.judge(1, 5.0, math.inf)
    # without a scaler a non-finite gradient norm is a spike
    assert SpikeGuard(SpikeSpec(), global_batch=8).judge(1, 5.0, math.inf).action == "skip"


def test_the_default_submit_job_trains_through_its_early_spike_at_full_speed(tmp_path):
    """Issue 30.1: the `submit` deployment's default form (deployments/prefect.yaml) flags step 22 on every batch
    (the weights, not a batch, cause it); before the fix it skipped 1,244 updates and 79,600 samples silently."""
    deploy = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    [submit] = [d for d in deploy["deployments"] if d["name"] == "submit"]
    doc = submit["parameters"]["request"]["job"]
    doc["training"]["checkpoint"]["uri"] = f"file://{tmp_path}/ckpt"
    job = parse_job(doc)
    result = run(job, tmp_path / "run", timeout=240)
    assert result["final_step"] == job.training.steps
    c = result["spike_counts"]
    bound = job.training.spike.max_consecutive
    assert c["spikes"] >= 1  # the early spike is still seen and reported
    assert c["skipped_updates"] <= bound * c["trained_through"] + bound
    assert c["skipped_samples"] == c["skipped_updates"] * job.training.global_batch  # no rollback: its batch only
    assert c["rollbacks"] == 0
    warnings = [ln for ln in (tmp_path / "run" / "train.log").read_text().splitlines() if "WARNING" in ln]
    assert len(warnings) <= 2 * (c["trained_through"] + 1)
    spikes = [r for r in progress(tmp_path / "run") if r["event"] == "spike"]
    assert len(spikes) == c["spikes"]
    assert json.loads((tmp_path / "run" / "result.json").read_text())["spike_counts"] == c


def test_the_report_and_the_summary_say_what_the_guard_skipped(tmp_path):
    from cluster.inventory import load_cluster
    from cluster.ledger import Allocation, NodeAllocation
    from tasks.planning.plans import plan_resources
    from tasks.report import RunReport, markdown, render_html
    from tasks.training.guard import SpikeCounts

    job = parse_job({"name": "r", "model": {"preset": "gpt-tiny"}, "training": {"seq_len": 128, "global_batch": 16}})
    plans = plan_resources(job, load_cluster("phoebe"))[:2]
    alloc = Allocation(id="a" * 16, job="r", plan_index=0, gpus=plans[0].gpus, min_mem_gib=1.0, lease_expiry=0.0,
                       nodes=[NodeAllocation(node="n0", gpu_type=plans[0].gpu_type, gpu_indices=[0])])
    counts = SpikeCounts(spikes=4, skipped_updates=3, skipped_samples=48, trained_through=1)
    rep = RunReport(job="r", model="gpt-tiny", cluster="phoebe", plans=plans, chosen=0, allocation=alloc,
                    final_step=100, resumed_from_step=None, tokens_per_s=1.0, checkpoints=[],
                    progress=str(tmp_path / "none.jsonl"), evaluations=[], stragglers=None, timings_s={},
                    spikes=counts)
    line = "4 spikes (loss or gradient norm): 3 updates skipped (48 samples not trained on), 0 rollbacks, 1 trained through"
    assert counts.summary() == line
    assert line in markdown(rep) and line in render_html(rep, tmp_path / "r.html").read_text()
    assert "spikes" not in markdown(rep.model_copy(update={"spikes": SpikeCounts()})).lower()


def test_a_loss_that_stays_above_chance_is_said_once_as_divergence():
    """Red team 41j S15: lr 5.0 from the first step kept gpt-tiny's loss at 27-126 (a uniform guess over 256 byte
    tokens scores 5.55) for 180 steps: no step stood out of a history that was out of range from its start, so
    nothing was said. The guard now says it once, after 20 steps in a row above 1.5x chance, naming the fix; an
    ordinary run (the control: the loss starts near chance and falls) says nothing."""
    import math

    from tasks.jobspec import SpikeSpec
    from tasks.training.guard import SpikeGuard

    guard = SpikeGuard(SpikeSpec(), global_batch=8, vocab=256)
    said = [(s, d.diverging) for s in range(1, 60)
            if (d := guard.judge(s, 40.0 + 30 * math.sin(s), 50.0)).diverging is not None]
    assert len(said) == 1 and said[0][0] == 20, said
    assert "above 8.32 (1.5x the 5.55 of a uniform guess over the 256 tokens) for 20 steps" in said[0][1]
    assert "lower training.lr" in said[0][1] and guard.counts.diverging_at == 20
    assert "diverging" in guard.counts.summary()
    calm = SpikeGuard(SpikeSpec(), global_batch=8, vocab=256)
    assert all(calm.judge(s, 5.6 * 0.99 ** s, 1.0).diverging is None for s in range(1, 300))
    assert calm.counts.diverging_at is None and calm.counts.summary() == ""
    # a brief excursion (shorter than 20 steps) is the z-score's business, not this
    brief = SpikeGuard(SpikeSpec(), global_batch=8, vocab=256)
    losses = [5.0] * 30 + [20.0] * 19 + [5.0] * 30
    assert all(brief.judge(s, x, 1.0).diverging is None for s, x in enumerate(losses, 1))


def test_skipped_gradient_norm_updates_are_counted_in_the_final_line_not_warned_about_one_by_one():
    """Red team 41p S13: an ordinary default run skipped 10 updates on gradient-norm spikes (z 6.2-11.1, the loss in
    range), each a WARNING of `submit`. Such a skip is progress (INFO); `frenzy train`'s final line counts them;
    a loss spike (rolled back or skipped), one trained through, or any other warning event stays a warning."""
    from types import SimpleNamespace

    from cli.train import _spikes
    from tasks.training.guard import SpikeCounts
    from tasks.training.progress import is_warning, progress_record

    def spike(reason: str, action: str, to: int | None) -> bool:
        return is_warning(progress_record({"event": "spike", "time": 0.0, "step": 366, "reason": reason,
                                           "action": action, "rolled_back_to": to, "skipped_samples": [0, 8]}))

    assert not spike("gradient norm z-score 6.7 > 6", "update_skipped", None)
    assert spike("loss z-score 9.0 > 6", "rolled_back", 300)
    assert spike("loss z-score 9.0 > 6", "update_skipped", None)
    assert spike("gradient norm z-score 7.0 > 6", "trained_through", None)
    assert is_warning(progress_record({"event": "resume", "time": 0.0}))
    assert not is_warning(progress_record({"event": "checkpoint_committed", "time": 0.0}))
    counts = SpikeCounts(spikes=10, skipped_updates=10, skipped_samples=80)
    line = _spikes(SimpleNamespace(spike_counts=counts))
    assert line == "; 10 spikes (loss or gradient norm): 10 updates skipped (80 samples not trained on), 0 rollbacks, " \
                   "0 trained through", line
    assert _spikes(SimpleNamespace(spike_counts=SpikeCounts())) == ""  # an ordinary quiet run: nothing added
