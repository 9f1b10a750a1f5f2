"""The trainer under faults, for real: SIGKILL at random points, a kill mid-persist, a corrupted shard, a spike."""

from __future__ import annotations

import json
import random
import re
import signal
from pathlib import Path

import pytest

from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tests.trainer_util import assert_bitwise_equal, copy_trained, final_state, last_step, progress, run, start, tiny_job, wait_for

STEPS = 60


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """An uninterrupted run of `tiny_job(uri, STEPS)`: its checkpoints under `ckpt/` (steps 40, 50 and 60 kept), its
    run directory `run/`. Read-only: a test that changes it works on `copy_trained(...)`."""
    d = tmp_path_factory.mktemp("ref")
    result = run(tiny_job(f"file://{d}/ckpt", STEPS), d / "run")
    assert result["final_step"] == STEPS and result["resumed_from_step"] is None
    return d


@pytest.fixture(scope="module")
def reference(reference_run):
    """The uninterrupted run's final state: the ground truth every recovered run must equal bit for bit."""
    return final_state(f"file://{reference_run}/ckpt", STEPS)


def test_sigkill_at_random_points_then_resume_is_bitwise_equal(tmp_path, reference):
    rng = random.Random(20261122)
    uri = f"file://{tmp_path}/ckpt"
    job = tiny_job(uri, STEPS)
    kills = sorted(rng.sample(range(3, STEPS - 3), 3))
    resumed_from = []
    for i, kill_at in enumerate(kills):
        run_dir = tmp_path / f"run{i}"
        p = start(job, run_dir, resume=i > 0)
        wait_for(lambda d=run_dir, k=kill_at, p=p: last_step(d) >= k or p.poll() is not None, what=f"step {kill_at}")
        p.send_signal(signal.SIGKILL)
        p.wait()
        resumed_from += [r["step"] for r in progress(run_dir) if r["event"] == "resume"]
    result = run(job, tmp_path / "final", resume=True)
    assert result["final_step"] == STEPS
    # every resume started from a committed step at or before the point it was killed
    assert all(s % 10 == 0 for s in resumed_from + [result["resumed_from_step"]])
    assert_bitwise_equal(final_state(uri, STEPS), reference)


def test_kill_during_persist_leaves_no_manifest_and_resume_uses_previous(tmp_path, reference):
    uri = f"file://{tmp_path}/ckpt"
    job = tiny_job(uri, STEPS)
    run_dir = tmp_path / "run"
    # the persist of step 20 stalls after its shard is written: kill the trainer inside that window
    p = start(job, run_dir, env={"FRENZY_FAULT_PERSIST_DELAY": "20:120"})
    shard = tmp_path / "ckpt" / "step_00000020" / "rank00000.bin"
    wait_for(lambda: shard.exists() and shard.stat().st_size > 0, what="the step-20 shard")
    p.send_signal(signal.SIGKILL)
    p.wait()
    storage = Storage(uri)
    assert ck.read_manifest(storage, 20) is None
    assert [m.step for m in ck.committed(storage)] == [10]
    result = run(job, tmp_path / "resume", resume=True)
    assert result["resumed_from_step"] == 10
    assert_bitwise_equal(final_state(uri, STEPS), reference)


def test_an_error_right_after_a_checkpoint_commits_the_snapshot_in_memory_first(tmp_path, reference):
    uri = f"file://{tmp_path}/ckpt"
    job = tiny_job(uri, STEPS)
    run_dir = tmp_path / "run"
    # the persist of step 10 stalls for 2 s, so the error at step 11 comes while its snapshot is only in memory
    p = start(job, run_dir, env={"FRENZY_FAULT_PERSIST_DELAY": "10:2",
                                 "FRENZY_FAULT_RAISE": "11:torch.OutOfMemoryError: CUDA out of memory."})
    assert p.wait(timeout=120) == 1
    log = (run_dir / "train.log").read_text()
    assert "committing the checkpoint already in memory first" in log
    assert [m.step for m in ck.committed(Storage(uri))] == [10]  # the process ended after the commit, not before
    result = run(job, tmp_path / "resume", resume=True)
    assert result["resumed_from_step"] == 10
    assert_bitwise_equal(final_state(uri, STEPS), reference)


def test_sigterm_checkpoints_the_current_step_and_exits_cleanly(tmp_path, reference):
    uri = f"file://{tmp_path}/ckpt"
    job = tiny_job(uri, STEPS)
    run_dir = tmp_path / "run"
    p = start(job, run_dir)
    wait_for(lambda: last_step(run_dir) >= 13 or p.poll() is not None, what="step 13")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == 0
    done = json.loads((run_dir / "result.json").read_text())
    stopped_at = done["final_step"]
    assert done["stopped_early"] and stopped_at < STEPS
    assert ck.committed(Storage(uri))[0].step == stopped_at  # nothing trained was lost
    result = run(job, tmp_path / "resume", resume=True)
    assert result["resumed_from_step"] == stopped_at
    assert_bitwise_equal(final_state(uri, STEPS), reference)


def test_corrupted_shard_is_detected_and_previous_checkpoint_used(tmp_path, reference_run, reference):
    uri = copy_trained(reference_run, tmp_path, "a")  # tiny_job(uri, STEPS), trained in tmp_path / "a"
    shard = tmp_path / "ckpt" / f"step_{STEPS:08d}" / "rank00000.bin"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = bytes(4096)  # a 4 KiB hole, as a bad disk block would leave
    shard.write_bytes(bytes(data))
    storage = Storage(uri)
    with pytest.raises(ck.CheckpointError, match="sha256"):
        ck.verify(storage, ck.read_manifest(storage, STEPS))
    run_dir = tmp_path / "b"
    result = run(tiny_job(uri, STEPS), run_dir, resume=True)
    rejected = [r for r in progress(run_dir) if r["event"] == "checkpoint_rejected"]
    assert [r["step"] for r in rejected] == [STEPS] and "sha256" in rejected[0]["reason"]
    assert result["resumed_from_step"] == STEPS - 10
    # the previous checkpoint re-trained the last 10 steps to exactly the uninterrupted result
    assert_bitwise_equal(final_state(uri, STEPS), reference)


def test_injected_spike_is_detected_rolled_back_and_skipped(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    spike = {"window": 16, "min_steps": 16, "skip_batches": 4}
    result = run(tiny_job(uri, 50, data={"inject_spike_steps": [35]}, spike=spike), tmp_path / "run")
    assert result["final_step"] == 50
    [s] = result["spikes"]
    assert s["step"] == 35 and s["rolled_back_to"] == 30 and "loss" in s["reason"]
    assert s["skipped_samples"] == [34 * 8, 34 * 8 + 4 * 8]
    m = ck.read_manifest(Storage(uri), 50)
    assert m.cursor["skips"] == [[272, 304]]
    # the spike batches were never trained on: the final loss is back to the healthy level
    assert result["last_loss"] < s["loss"] - 0.3
    # a run without the injection and without the skip trains on other batches from step 35 on
    clean = run(tiny_job(f"file://{tmp_path}/clean", 50, spike=spike), tmp_path / "clean")
    assert clean["spikes"] == []


def test_resume_refuses_checkpoints_of_another_job(tmp_path, tiny_trained):
    uri = copy_trained(tiny_trained, tmp_path, "a")  # tiny_job(uri, 20), trained in tmp_path / "a"
    other = tiny_job(uri, 30, seq_len=32)
    p = start(other, tmp_path / "b", resume=True)
    assert p.wait(timeout=120) == 2
    log = (tmp_path / "b" / "train.log").read_text()
    assert "different job" in log and "seq_len" in log
    # and a fresh start on a directory with checkpoints is refused rather than overwriting them
    p = start(tiny_job(uri, 30), tmp_path / "c")
    assert p.wait(timeout=120) == 2
    assert "pass --resume" in (tmp_path / "c" / "train.log").read_text()
    assert json.loads((tmp_path / "a" / "result.json").read_text())["final_step"] == 20


def test_a_checkpoint_due_during_a_slow_persist_is_deferred_not_waited_for(tmp_path):
    """One snapshot buffer and persists stalled for 0.6 s against a 2-step interval: the loop keeps training, the
    checkpoints come a few steps late (deferred_steps), a warning names an interval that fits, and the final step
    is still committed."""
    job = tiny_job(f"file://{tmp_path}/ckpt", steps=16, every=2)
    res = run(job, tmp_path / "run", env={"FRENZY_SNAPSHOT_BUFFERS": "1", "FRENZY_FAULT_PERSIST_DELAY": "1:0.6"})
    recs = res["checkpoints"]
    assert recs[-1]["step"] == 16 and any(r["deferred_steps"] > 0 for r in recs)
    assert len(recs) < 8  # not every due step became a checkpoint: the deferred ones moved later
    assert all(r["blocked_s"] < 0.6 for r in recs[:-1])  # no save waited for the stalled persist
    events = progress(tmp_path / "run")
    assert "checkpoint_deferred" in [r["event"] for r in events]
    # the advice is the measured persist over the step time: at least 0.6 s of stalled persist, not "0.0 s"
    warning = next(r["message"] for r in events if r["event"] == "warning" and "every_steps" in r["message"])
    m = re.search(r"a persist \((\d+\.\d+) s, 2 steps take (\d+\.\d+) s\); >= (\d+) would fit", warning)
    assert m is not None, warning
    assert float(m[1]) >= 0.6 and float(m[1]) > float(m[2]) and int(m[3]) > 2, warning


def test_a_second_spike_rolls_back_to_the_newest_healthy_commit_not_the_first_target(tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    spike = {"window": 16, "min_steps": 16, "skip_batches": 4}
    result = run(tiny_job(uri, 60, data={"inject_spike_steps": [35, 49]}, spike=spike), tmp_path / "run")
    first, second = result["spikes"][:2]
    assert first["rolled_back_to"] == 30
    # the commit at step 40 of the replayed timeline is healthy: the second spike returns there, not to 30
    assert second["rolled_back_to"] == 40 and second["step"] > 40
    assert result["final_step"] == 60


def test_a_job_resuming_another_jobs_checkpoints_is_told_whose_they_are(tmp_path, tiny_trained):
    uri = copy_trained(tiny_trained, tmp_path, "a")  # tiny_job(uri, 20), trained in tmp_path / "a"
    other = tiny_job(uri, 30).model_copy(update={"name": "t2"})  # the same model and data, its own name
    result = run(other, tmp_path / "b", resume=True)
    assert result["resumed_from_step"] == 20
    log = (tmp_path / "b" / "train.log").read_text()
    assert "step 20 under" in log and "committed by job 't', not 't2'" in log and "own checkpoint.uri" in log
