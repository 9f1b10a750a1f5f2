"""One writer per checkpoint root (tasks/training/writer.py): a second trainer on a held root is refused, a dead or
expired holder is taken over, a writer that lost its lease commits nothing more."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tasks.training.writer import LEASE_KEY, WriterLease, WriterLeaseError
from tests.trainer_util import final_state, run, start, tiny_job, wait_for


def test_a_live_holder_is_refused_by_name_and_the_fix(tmp_path):
    st = Storage(f"file://{tmp_path}/root")
    with WriterLease(st, "first") as first:
        with pytest.raises(WriterLeaseError, match=r"being written by pid \d+ on .*run first.*another checkpoint.uri"):
            WriterLease(st, "second").acquire()
        assert first.holds()
    assert not st.exists(LEASE_KEY)  # released on exit


def test_an_expired_lease_is_taken_over_and_its_old_holder_is_fenced(tmp_path):
    st = Storage(f"file://{tmp_path}/root")
    old = WriterLease(st, "old", ttl_s=60)
    old.acquire()
    later = WriterLease(st, "new", ttl_s=60, clock=lambda: time.time() + 61)  # past the old lease's expiry
    later.acquire()
    assert later.holds()
    assert not old.holds() and old.lost.is_set()  # the fence: the stalled writer sees it lost


def test_a_dead_holder_on_this_host_is_stale_at_once(tmp_path):
    root = tmp_path / "root"
    code = ("import os, sys; sys.path.insert(0, '.')\n"
            "from tasks.training.storage import Storage\nfrom tasks.training.writer import WriterLease\n"
            f"WriterLease(Storage('file://{root}'), 'crashed', ttl_s=3600).acquire()\n"
            "os.kill(os.getpid(), 9)\n")
    p = subprocess.Popen([sys.executable, "-c", code])
    assert p.wait(timeout=60) == -signal.SIGKILL
    st = Storage(f"file://{root}")
    held = json.loads(st.read(LEASE_KEY))
    assert held["run"] == "crashed" and held["expires"] > time.time() + 3000  # still "valid" for an hour
    lease = WriterLease(st, "restart")
    lease.acquire()  # the holder's process is gone: no need to wait out its hour
    assert lease.holds()


def test_a_writer_that_lost_its_lease_does_not_commit(tmp_path):
    st = Storage(f"file://{tmp_path}/root")
    cp = ck.AsyncCheckpointer(st, 0, 1, run="t", fence=lambda: False, buffers=1)
    cp.save(1, [("model.w", torch.ones(4))], {"layout": {}, "cursor": {}, "loss": {}, "healthy": True,
                                              "fingerprint": {}, "trainer": {}})
    with pytest.raises(ck.CheckpointError, match="writer lease"):
        cp.close()  # the last save failing is the one that raises
    assert ck.committed(st) == [] and cp.failed and "writer lease" in cp.failed[0][1]


def test_a_second_trainer_on_a_running_trainers_root_is_refused_then_resumes_after_it(tmp_path):
    """The issue's repro: `frenzy train J --resume` beside a live trainer of J corrupted every kept checkpoint."""
    uri = f"file://{tmp_path}/ckpt"
    job = tiny_job(uri, steps=100000, every=20)
    # a commits step 20, then stops making progress at step 21 (the hang drill): alive and holding its lease (the
    # lease's heartbeat is a thread of its own), but off the CPU while b starts, instead of training on beside it
    a = start(job, tmp_path / "a", env={"FRENZY_FAULT_HANG": "21"})
    try:
        wait_for(lambda: bool(ck.committed(Storage(uri))) or a.poll() is not None, 180, "a's first commit")
        b = start(job, tmp_path / "b", resume=True)
        assert b.wait(timeout=120) == 2
        log = (tmp_path / "b" / "train.log").read_text()
        assert f"being written by pid {a.pid}" in log, log[-2000:]
        assert a.poll() is None  # the first trainer is still there, untouched
    finally:
        a.send_signal(signal.SIGKILL)  # a crash: no release, its lease stays in the root
        a.wait()
    newest = max(m.step for m in ck.committed(Storage(uri)))
    for m in ck.committed(Storage(uri)):
        ck.verify(Storage(uri), m)  # nothing the refused trainer did touched them
    res = run(tiny_job(uri, steps=newest + 5, every=20), tmp_path / "b", resume=True)  # the dead holder is stale
    assert res["resumed_from_step"] == newest and res["final_step"] == newest + 5
    assert final_state(uri, newest + 5)


_HOLDER = """import os, sys
sys.path.insert(0, '.')
from tasks.training.storage import Storage
from tasks.training.writer import WriterLease
WriterLease(Storage('file://{root}'), 'orphan', ttl_s=3600).acquire()
print('ready', flush=True)
sys.stdin.read()  # 'committing' until the test closes stdin
os._exit(0)
"""


def _holder(root, launcher: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLDER.format(root=root)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env={**__import__("os").environ, "FRENZY_LAUNCHER_PID": str(launcher)})
    assert p.stdout.readline() == b"ready\n"
    return p


def test_a_resume_waits_for_an_orphan_of_a_dead_launcher_then_takes_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = _holder(tmp_path / "root", dead.pid)
    lines: list[str] = []

    def on_wait(line: str) -> None:  # the orphan finishes its commit while we wait
        lines.append(line)
        holder.stdin.close()

    lease = WriterLease(Storage(f"file://{tmp_path}/root"), "resume", orphan_wait_s=60, on_wait=on_wait)
    lease.acquire()
    assert lease.holds() and holder.wait(timeout=30) == 0
    assert "an orphan of launcher" in lines[0] and f"launcher {dead.pid} (dead)" in lines[0]
    assert "taking over" in lines[-1]


def test_a_holder_whose_launcher_lives_is_refused_at_once_even_when_resuming(tmp_path):
    import os

    holder = _holder(tmp_path / "root", os.getpid())  # this test process plays the live launcher
    try:
        lines: list[str] = []
        lease = WriterLease(Storage(f"file://{tmp_path}/root"), "resume", orphan_wait_s=60, on_wait=lines.append)
        with pytest.raises(WriterLeaseError, match="being written by pid"):
            lease.acquire()
        assert lines == []  # no wait: refused on the spot
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_an_orphan_that_outlasts_the_wait_is_refused_by_name(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = _holder(tmp_path / "root", dead.pid)
    try:
        lines: list[str] = []
        lease = WriterLease(Storage(f"file://{tmp_path}/root"), "resume", orphan_wait_s=0.01, on_wait=lines.append)
        with pytest.raises(WriterLeaseError, match=f"pid {holder.pid}"):
            lease.acquire()
        assert "orphan" in lines[0]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
