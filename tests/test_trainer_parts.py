"""The Trainer's parts, each alone (no training run): set-up, the step, metrics, shutdown, schedule and restore."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest
import torch

from tasks.jobspec import parse_job
from tasks.training import checkpoint as ck
from tasks.training import data as D
from tasks.training.guard import SpikeCounts, SpikeGuard
from tasks.training.metrics import Meter, Progress
from tasks.training.optrace import OpTracer
from tasks.training.progress import CommitProgress, ProgressRecord, SpikeProgress, StepProgress, describe, progress_record
from tasks.training.request import TrainerResult
from tasks.training.restore import Restorer
from tasks.training.schedule import CheckpointSchedule
from tasks.training.setup import Dist, TrainOptions, _batch_shares, build_model, fingerprint, load_data
from tasks.training.shutdown import Shutdown
from tasks.training.state import training_tensors
from tasks.training.step import StepRunner, lr_at
from tasks.training.storage import Storage
from tasks.training.writer import WriterLeaseError


def _job(tmp_path: Path, **training: object):
    t = {"seq_len": 32, "global_batch": 4, "micro_batch": 2, "precision": "fp32", "steps": 10, "lr": 3e-3,
         "warmup_steps": 2, "log_every_steps": 5, "trace_every_steps": 0,
         "checkpoint": {"every_steps": 4, "uri": f"file://{tmp_path}/ckpt", "keep": 3}, **training}
    return parse_job({"name": "parts", "model": {"preset": "gpt-tiny"}, "training": t})


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_set_up_checks_the_batch_against_the_world_and_names_the_fix(tmp_path):
    job = _job(tmp_path, global_batch=12, micro_batch=4)
    with pytest.raises(ValueError, match="not divisible by 8 data-parallel"):
        _batch_shares(job, Dist(rank=0, world=8))
    with pytest.raises(ValueError, match="per-rank batch 6 is not divisible by micro_batch=4"):
        _batch_shares(job, Dist(world=2))
    assert _batch_shares(_job(tmp_path, global_batch=8, micro_batch=2), Dist(world=2)) == (4, 2)
    assert Dist(rank=5, world=8, tp=2).dp == 4 and Dist(rank=5, world=8, tp=2).dp_rank == 2


def test_lr_warms_up_linearly_then_decays_to_a_tenth(tmp_path):
    job = _job(tmp_path, steps=102, warmup_steps=2)
    assert lr_at(1, job) == pytest.approx(1.5e-3) and lr_at(2, job) == pytest.approx(3e-3)
    assert lr_at(102, job) == pytest.approx(3e-4)
    assert lr_at(52, job) == pytest.approx(3e-3 * (0.1 + 0.45))


def test_the_step_computes_loss_and_norm_and_only_apply_changes_the_weights(tmp_path):
    job = _job(tmp_path)
    storage = Storage(job.training.checkpoint.uri)
    data, m = load_data(job, Dist(), storage), build_model(job, Dist(), torch.device("cpu"))
    runner = StepRunner(m, data, job, Dist(), torch.device("cpu"), OpTracer(0, 0, 0))
    cursor = D.Cursor()
    before = [p.detach().clone() for p in m.params]
    loss, gnorm = runner.compute(1, data.loader.next_indices(cursor), traced=False)
    assert 4.0 < loss < 7.0 and math.isfinite(gnorm) and gnorm > 0  # ln(256) = 5.5 at init
    runner.discard(1)
    assert all(p.grad is None for p in m.params)
    assert all(torch.equal(a, p) for a, p in zip(before, m.params, strict=True))
    runner.compute(2, data.loader.next_indices(cursor), traced=False)
    runner.apply(traced=False)
    assert m.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(2, job))
    assert not all(torch.equal(a, p) for a, p in zip(before, m.params, strict=True))
    assert cursor.samples == 8 and runner.data_s > 0


def test_the_meter_emits_step_records_on_its_interval_with_tokens_per_second(tmp_path):
    job = _job(tmp_path)
    prog, clock = Progress(tmp_path / "progress.jsonl", 0), _Clock()
    meter = Meter(job, prog, clock)
    for step in range(1, 11):
        clock.now += 0.5
        meter.updated()
        meter.log_step(step, 3.0, 1.0)
    steps = [r for r in prog.records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [5, 10]
    assert steps[0]["tokens_per_s"] == pytest.approx(4 * 32 / 0.5) and steps[1]["eta_s"] == 0
    clock.now += 3.0  # after the last update (the final checkpoint): not in tokens/s, in elapsed
    f = meter.figures(data_s=1.0, blocked_s=0.2)
    assert f.tokens_per_s == pytest.approx(10 * 4 * 32 / 5.0) and f.elapsed_s == pytest.approx(8.0)
    assert f.data_fraction == pytest.approx(0.2) and f.steps_run == 10
    Progress(tmp_path / "other.jsonl", 1).emit("step")
    assert not (tmp_path / "other.jsonl").exists()  # only rank 0 writes


def test_front_ends_read_progress_lines_as_records_of_their_kind(tmp_path):
    prog = Progress(tmp_path / "progress.jsonl", 0)
    clock = _Clock()
    meter = Meter(_job(tmp_path), prog, clock)
    clock.now += 1.0
    meter.updated()
    meter.log_step(5, 3.0, 1.0)
    prog.emit("checkpoint", step=5, uri="file:///c/step_00000005", blocked_s=0.002, persist_s=0.5, bytes=2_000_000)
    prog.emit("spike", step=6, loss=9.0, grad_norm=1.0, reason="z 7.1", skipped_samples=[20, 24], rolled_back_to=None,
              action="update_skipped")
    prog.emit("resume", step=5)
    recs = [progress_record(json.loads(line)) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [type(r) for r in recs] == [StepProgress, CommitProgress, SpikeProgress, ProgressRecord]
    assert recs[0].step == 5 and recs[0].steps == 10 and recs[1].uri.endswith("step_00000005")
    assert describe(recs[1]) == ("checkpoint step 5 committed: file:///c/step_00000005 (2.0 MB, blocked 2.0 ms, "
                                 "persisted in 0.50s)")
    assert describe(recs[2]) == ("loss spike at step 6 (z 7.1): update skipped (no healthy checkpoint to roll back "
                                 "to), skipping samples [20, 24]")
    # red team 41j S12: a gradient-norm-only skip was worded as a loss spike with "nothing to roll back to"
    grad = SpikeProgress(event="spike", time=0.0, step=7, reason="gradient norm z-score 8.0 > 6", action="update_skipped",
                         rolled_back_to=None, skipped_samples=[24, 28])
    assert describe(grad) == ("gradient-norm spike at step 7 (gradient norm z-score 8.0 > 6): update skipped (the loss "
                              "is in range: nothing to roll back), skipping samples [24, 28]")
    assert describe(recs[3]) == "resume: step=5" and recs[3].model_dump() == prog.records[3]
    # a line its kind's record does not fit (another trainer version's) is still shown, never an error
    odd = progress_record({"event": "step", "time": 1.0, "step": 3})
    assert type(odd) is ProgressRecord and describe(odd) == "step: step=3"
    # the commit record repeats the checkpoint record's fields (progress.py stays free of torch): kept the same
    assert {k: f.annotation for k, f in CommitProgress.model_fields.items() if k not in ("event", "time")} == \
        {k: f.annotation for k, f in ck.CheckpointRecord.model_fields.items()}


def test_the_trainer_result_keeps_result_json_keys_in_order_and_a_nan_loss():
    doc = {"job": "t", "final_step": 12, "resumed_from_step": 12, "stopped_early": False, "checkpoints": [],
           "snapshot_pin_s": None, "checkpoint_interval": {"every_steps": 5},
           "failed_checkpoints": [{"step": 10, "error": "disk full"}],
           "spikes": [{"step": 7, "loss": 9.0, "grad_norm": 1.0, "reason": "loss z-score 7.0 > 6", "skipped_samples": [8, 16],
                       "rolled_back_to": None, "action": "update_skipped"},
                      {"step": 9, "loss": math.inf, "grad_norm": 1.0, "reason": "non-finite loss or gradient norm",
                       "action": "trained_through", "rolled_back_to": None, "skipped_samples": None}],
           "spike_counts": SpikeCounts().model_dump(), "last_loss": math.nan, "steps_run": 0,
           "elapsed_s": 0.1, "tokens_per_s": 0.0, "blocked_s_total": 0.0, "data_s_total": 0.0, "data_fraction": 0.0,
           "world_size": 1, "tp": 1, "device": "cpu", "checkpoint_uri": "file:///c", "trace": None, "run_dir": "/r"}
    res = TrainerResult.model_validate(json.loads(json.dumps(doc)))
    assert json.dumps(res.model_dump(), indent=1) == json.dumps(doc, indent=1)  # NaN stays NaN, keys as written
    assert res.failed_checkpoints[0].error == "disk full" and math.isnan(res.last_loss)
    assert [type(s).__name__ for s in res.spikes] == ["SkippedSpike", "TrainedThroughSpike"]
    flow = res.train_result()
    assert (flow.final_step, flow.resumed_from_step, flow.checkpoint_uri, flow.stragglers) == (12, 12, "file:///c", None)


class _Lease:
    def __init__(self) -> None:
        self.lost = threading.Event()
        self.renew_error = None

    def loss_cause(self) -> str:
        return "another trainer took it over"


def test_shutdown_stops_on_the_stop_file_the_budget_and_refuses_a_lost_lease(tmp_path):
    opts = TrainOptions(job=_job(tmp_path), run_dir=tmp_path, stop_after_steps=3)
    lease = _Lease()
    s = Shutdown(opts, Dist(), lease, "file:///x")  # type: ignore[arg-type]
    assert not s.should_stop(0, 2) and not s.stopped
    assert s.should_stop(3, 3) and s.stopped
    s2 = Shutdown(TrainOptions(job=opts.job, run_dir=tmp_path), Dist(), None, "file:///x")
    assert not s2.should_stop(0, 0)
    (tmp_path / "stop").write_text("1")
    assert s2.should_stop(1, 1)
    s2.preempt.set()
    (tmp_path / "stop").unlink()
    assert s2.should_stop(1, 1)
    lease.lost.set()
    with pytest.raises(WriterLeaseError, match="lost the writer lease"):
        s.should_stop(0, 0)


def _parts(tmp_path: Path, job):
    storage = Storage(job.training.checkpoint.uri)
    data, m = load_data(job, Dist(), storage), build_model(job, Dist(), torch.device("cpu"))
    guard, cursor = SpikeGuard(job.training.spike, job.training.global_batch), D.Cursor()
    fp = fingerprint(job, data.corpus_sha, 1, 1, data.tok.sha256)
    prog = Progress(tmp_path / "progress.jsonl", 0)
    return storage, data, m, guard, cursor, fp, prog


def _fields(cursor: D.Cursor, guard: SpikeGuard, fp: dict):
    return lambda step: {"layout": {}, "cursor": cursor.to_dict(), "loss": {}, "healthy": True, "fingerprint": fp,
                         "trainer": {"spike": guard.detector.state(), "scaler": None}}


def test_the_schedule_checkpoints_on_its_interval_and_the_restorer_loads_it_back(tmp_path):
    job = _job(tmp_path)
    storage, data, m, guard, cursor, fp, prog = _parts(tmp_path, job)
    runner = StepRunner(m, data, job, Dist(), torch.device("cpu"), OpTracer(0, 0, 0))
    sched = CheckpointSchedule(storage, Dist(), job, prog, None,
                               lambda: training_tensors(m.core, m.optimizer, with_model=True),
                               _fields(cursor, guard, fp), start=0)
    meter = Meter(job, prog)
    for step in range(1, 7):
        runner.compute(step, data.loader.next_indices(cursor), traced=False)
        sched.barrier()
        runner.apply(traced=False)
        sched.step_done(meter.updated())
        sched.after_update(step, meter, prepare=step == 1)
    sched.finish(6, stopped=True)  # stopped at 6: the step is committed before the engine closes
    sched.close()
    assert [c.step for c in sched.describe().checkpoints] == [4, 6]
    assert [r["step"] for r in prog.records if r["event"] == "checkpoint"] == [4, 6]
    # a fresh rank restores step 6: weights, cursor, detector history
    saved = {n: p.detach().clone() for n, p in m.core.named_parameters()}
    _, _, m2, guard2, cursor2, _, _ = _parts(tmp_path, job)
    r = Restorer(storage, Dist(), m2, cursor2, guard2.detector, fp, job.training.seq_len, prog)
    assert r.resume(TrainOptions(job=job, run_dir=tmp_path, resume=True)) == 6
    assert cursor2.samples == 24 and all(torch.equal(saved[n], p) for n, p in m2.core.named_parameters())
    with pytest.raises(ck.CheckpointError, match="pass --resume"):
        r.resume(TrainOptions(job=job, run_dir=tmp_path))
    other = Restorer(storage, Dist(), m2, cursor2, guard2.detector, {**fp, "seed": 1}, 32, prog)
    with pytest.raises(ck.CheckpointMismatch, match="seed"):
        other.newest_valid()
    assert r.newest_valid(before=6).step == 4


def test_a_save_is_charged_with_the_extra_time_of_the_steps_after_it(tmp_path):
    job = _job(tmp_path, steps=8)
    prog = Progress(tmp_path / "progress.jsonl", 0)
    w = torch.zeros(1000)
    sched = CheckpointSchedule(Storage(f"file://{tmp_path}/ckpt"), Dist(), job, prog, None, lambda: ([("model.w", w)], {}),
                               lambda s: {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {},
                                          "fingerprint": {}}, start=0)
    clock, meter = _Clock(), Meter(job, prog)
    step_s = {5: 1.5, 6: 1.25}  # the two steps after the save of step 4 (every_steps 4); the clean pace is 1 s
    for step in range(1, 9):
        clock.now += step_s.get(step, 1.0)
        sched.barrier()
        w += 1
        sched.step_done(clock())
        sched.after_update(step, meter, prepare=step == 1)
    sched.close()
    four, eight = sched.engine.records
    assert four.step == 4 and four.blocked_s == pytest.approx(0.75) and four.wait_s < 0.75
    assert four.drag_s == pytest.approx(0.75 - four.wait_s)
    assert eight.drag_s == 0.0 and eight.blocked_s == eight.wait_s  # no step after the final save
    emitted = {r["step"]: r["blocked_s"] for r in prog.records if r["event"] == "checkpoint"}
    assert emitted == {4: four.blocked_s, 8: eight.blocked_s}  # the progress record waited for the drag
    assert sched.blocked_s == pytest.approx(four.blocked_s + eight.blocked_s)


def test_the_result_types_its_checkpoint_interval_fixed_or_measured():
    from tasks.training.interval import FixedInterval, IntervalInputs

    auto = {"every_steps": 37, "interval_s": 120.0, "cost_s": 0.4, "blocked_s": 0.1, "drag_s": 0.3, "mtbf_s": 3600.0,
            "mtbf_source": "default", "step_s": 0.2, "persist_s": 1.5, "cost_source": "measured"}
    doc = {"job": "t", "final_step": 1, "resumed_from_step": None, "stopped_early": False, "checkpoints": [],
           "checkpoint_interval": auto, "failed_checkpoints": [], "spikes": [], "spike_counts": SpikeCounts().model_dump(),
           "last_loss": 1.0, "steps_run": 1, "elapsed_s": 0.1, "tokens_per_s": 0.0, "blocked_s_total": 0.0,
           "data_s_total": 0.0, "data_fraction": 0.0, "world_size": 1, "tp": 1, "device": "cpu",
           "checkpoint_uri": "file:///c", "trace": None, "run_dir": "/r"}
    got = TrainerResult.model_validate(json.loads(json.dumps(doc))).checkpoint_interval
    assert isinstance(got, IntervalInputs) and got.persist_s == 1.5  # every input kept, not cut to every_steps
    assert TrainerResult.model_validate({**doc, "checkpoint_interval": {"every_steps": 5}}).checkpoint_interval \
        == FixedInterval(5)
    assert TrainerResult.model_validate(doc).model_dump()["checkpoint_interval"] == auto


def test_the_allocation_keeper_does_not_make_a_ledger_where_the_file_is_not(tmp_path, caplog):
    """A Ray node that does not see the submitter's SQLite ledger: opening the path would make an empty ledger there,
    which knows no allocation, and the trainer would stop as if its GPUs were given away. The keeper leaves the
    renewals to the submitter and says so; with the file there (the control) a released allocation is found lost."""
    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster
    from cluster.ledger import Ledger
    from tasks.training.allocation import AllocationKeeper
    from tasks.training.request import AllocationHold

    gone = tmp_path / "elsewhere" / "l.db"
    with caplog.at_level("WARNING"), AllocationKeeper(AllocationHold(ledger=str(gone), allocation_id="a" * 16,
                                                                     lease_s=0.3)) as keeper:
        keeper._thread.join(timeout=30)
    assert not gone.exists() and not gone.parent.exists() and not keeper.lost.is_set()
    assert f"the ledger file {gone} is not on this node" in caplog.text
    led = Ledger(str(tmp_path / "l.db"))
    led.sync(load_cluster("phoebe"))
    alloc = led.allocate("j", [GpuRequest(1, 1)], lease_s=60)
    led.release(alloc.id)
    with AllocationKeeper(AllocationHold(ledger=led.url, allocation_id=alloc.id, lease_s=0.3)) as keeper:
        assert keeper.lost.wait(timeout=30) and "was released" in keeper.cause


def test_the_release_at_the_trainers_end_gives_the_gpus_back_and_is_told_from_a_lost_lease(tmp_path):
    """Red team 41n B3: the train task releases its allocation as the trainer ends (`release_at_end`), noting it so
    that the submitter's heartbeat, which then finds the allocation gone, does not read a lost lease; the GPUs can be
    placed again at once. A ledger file that is not there is not made by it."""
    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster
    from cluster.ledger import Ledger
    from tasks.training.allocation import release_at_end, released_at_end
    from tasks.training.request import AllocationHold

    gone = tmp_path / "elsewhere" / "l.db"
    assert release_at_end(AllocationHold(ledger=str(gone), allocation_id="b" * 16, lease_s=60)) == []
    assert not gone.parent.exists() and not released_at_end("b" * 16)
    led = Ledger(str(tmp_path / "l.db"))
    led.sync(load_cluster("local"))
    alloc = led.allocate("first", [GpuRequest(1, 0)], lease_s=60)
    assert alloc is not None and led.allocate("second", [GpuRequest(1, 0)], lease_s=60) is None
    assert not released_at_end(alloc.id)
    assert release_at_end(AllocationHold(ledger=led.url, allocation_id=alloc.id, lease_s=60)) == []  # none queued
    assert led.allocation(alloc.id).state == "released" and released_at_end(alloc.id)
    assert led.allocate("second", [GpuRequest(1, 0)], lease_s=60) is not None


def test_a_trainer_stopped_past_its_lease_takes_no_step_and_says_what_the_ledger_recorded(tmp_path):
    """A trainer whose whole process tree was SIGSTOPped past its lease (released by hand meanwhile; the ledger then
    freed it as the lease lapsed and placed the next job on its GPUs), once SIGCONTed, ran 4 more steps and committed
    before its renewal found the allocation gone, and said "released while its trainer ran (by hand or by another
    process)". Its own clock now fences it: past the lease since its newest renewal, no step and no commit; the line
    names the lapse, the id, and the ledger's record."""
    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster
    from cluster.ledger import Ledger
    from tasks.training.allocation import AllocationKeeper, AllocationLost, lost_cause
    from tasks.training.request import AllocationHold

    now = [1000.0]
    led = Ledger(str(tmp_path / "l.db"), clock=lambda: now[0])
    led.sync(load_cluster("local"))
    vic = led.allocate("vic", [GpuRequest(1, 0)], lease_s=10)
    keeper = AllocationKeeper(AllocationHold(ledger=led.url, allocation_id=vic.id, lease_s=10))
    mono = [50.0]
    keeper.clock, keeper.renewed_at = (lambda: mono[0]), 50.0
    assert led.renew(vic.id, 10, holder=keeper.holder)
    mono[0] += 9.9  # the control: within the lease, the step is taken
    keeper.fence(11510, 11500)
    led.release(vic.id)  # by hand while its tree is stopped: held as `releasing` for the trainer
    assert led.how_ended(vic.id).startswith("released by hand")
    now[0] += 11  # the lease lapses; the next transaction frees its GPU: wendy gets it
    led.sync(load_cluster("local"))
    assert led.allocate("wendy", [GpuRequest(1, 0)], lease_s=600) is not None  # on vic's GPU
    mono[0] += 2  # SIGCONT: 11.9 s since the newest renewal, on this process's own clock
    with pytest.raises(AllocationLost) as err:
        keeper.fence(11510, 11500)
    said = str(err.value)
    assert said.startswith(f"allocation {vic.id} in the ledger {led.url} lapsed: this trainer's newest renewal was "
                           "11.9 s ago, longer than its 10 s lease"), said
    assert "the ledger records it released by hand, then freed as its lease lapsed" in said
    assert "Training stopped at step 11510 without another step or commit" in said and said.endswith(
        "resume from step 11500")
    cause = lost_cause(led, led.url, vic.id, 10, "this trainer")  # what its renewal or its submitter says
    assert "was released by hand while its trainer ran, then freed as its lease lapsed" in cause, cause
    assert "(by hand or by another process)" not in cause
    # red team 41r: nobody may renew an allocation released by hand, so the submitter is not to blame: the trainer
    # that never gave it back is
    assert "the trainer, which gives a released allocation back as it stops, never did" in cause, cause
    assert "the submitting process" not in cause, cause


def test_the_ledger_says_how_an_allocation_ended(tmp_path):
    """`Ledger.how_ended`: what the final lines of a trainer and its submitter say, never a release they did not make."""
    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster
    from cluster.ledger import Ledger

    now = [1000.0]
    led = Ledger(str(tmp_path / "l.db"), clock=lambda: now[0])
    led.sync(load_cluster("phoebe"))
    held, hand, holder, lapsed = (led.allocate(j, [GpuRequest(1, 1)], lease_s=30) for j in "abcd")
    led.release(hand.id)
    led.release(holder.id, by_holder=True)
    assert led.renew(held.id, 100)  # the control: renewed in time, it holds its GPUs
    now[0] += 31
    led.sync(load_cluster("phoebe"))
    assert [led.how_ended(a.id) for a in (hand, holder, lapsed)] == [
        "released by hand", "released by its holder", "freed as its lease lapsed"]
    assert led.how_ended(held.id) == ""


def test_a_real_trainer_sigstopped_past_its_lease_takes_no_step_after_sigcont(tmp_path):
    """The trainer process itself: SIGSTOPped while it trains, its lease lapses and the ledger gives its GPU to
    another job; after SIGCONT it exits naming the lapse and the id, with no step logged and nothing committed after
    the stop (it made 4 more steps and a commit before)."""
    import os
    import signal

    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster
    from cluster.ledger import LeaseKeeper, Ledger
    from tasks.training.request import AllocationHold
    from tests.trainer_util import last_step, progress, start, tiny_job, wait_for

    led = Ledger(str(tmp_path / "l.db"))
    led.sync(load_cluster("local"))
    vic = led.allocate("vic", [GpuRequest(1, 0)], lease_s=4)
    hold = AllocationHold(ledger=led.url, allocation_id=vic.id, lease_s=4)
    p = start(tiny_job(f"file://{tmp_path}/ckpt", steps=100000, every=5), tmp_path / "run",
              env={"FRENZY_ALLOCATION": hold.model_dump_json()})
    try:
        with LeaseKeeper(led, vic.id, 4):  # the submitter's heartbeat while the trainer starts; then it is stopped too
            wait_for(lambda: p.poll() is not None or last_step(tmp_path / "run") >= 3, timeout=180, what="training")
        assert p.poll() is None, (tmp_path / "run" / "train.log").read_text()[-2000:]
        os.kill(p.pid, signal.SIGSTOP)
        at_stop, stopped_at = len(progress(tmp_path / "run")), last_step(tmp_path / "run")
        wait_for(lambda: led.allocate("wendy", [GpuRequest(1, 0)], lease_s=600) is not None, timeout=60,
                 what="the lease to lapse and the GPU to go to wendy")
        os.kill(p.pid, signal.SIGCONT)
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "run" / "train.log").read_text()
    assert rc != 0, log[-2000:]
    assert f"allocation {vic.id} in the ledger {led.url} lapsed: this trainer's newest renewal was" in log, log[-2000:]
    assert "freed as its lease lapsed" in log and "without another step or commit" in log
    after = progress(tmp_path / "run")[at_stop:]  # at most the step it was in the middle of is logged
    assert [r["step"] for r in after if r["event"] == "step"] in ([], [stopped_at + 1]), after
    assert not [r for r in after if r["event"] == "checkpoint"] and last_step(tmp_path / "run") <= stopped_at + 1, after
    assert max((c.step for c in ck.committed(Storage(f"file://{tmp_path}/ckpt"))), default=0) <= stopped_at


def test_the_late_checkpoint_advice_compares_the_persist_with_every_steps_steps():
    """`frenzy train` warned "checkpoint.every_steps=10 is shorter than a persist (0.0 s); >= 11 would fit" where
    persists took 0.0-0.29 s: the advice added a step whatever the figures. It is given only when the measured
    persist outlasts every_steps steps, with the smallest every_steps that fits."""
    from tasks.training.interval import interval_fit

    assert interval_fit(10, 0.0, 0.05) is None  # a 0.0 s persist is longer than nothing
    assert interval_fit(10, 0.29, 0.05) is None  # 0.29 s < 10 steps of 0.05 s
    assert interval_fit(10, 0.5, 0.05) is None  # exactly 10 steps: fits
    assert interval_fit(10, 2.0, 0.05) == 40 and interval_fit(10, 0.51, 0.05) == 11
    assert interval_fit(10, 1.0, 0.0) is None  # no step time measured: no advice
