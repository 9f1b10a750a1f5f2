"""Regression tests for the defects the fault-injection audit found (issue 17): every kind of corrupt shard or
manifest walks back naming the file, a resume never silently starts over, names are names, errors that cannot
succeed are not retried."""

from __future__ import annotations

import json
import time

import pytest
import torch

from tasks.jobspec import JobSpecError, parse_job
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage, StorageError
from tests.trainer_util import copy_trained, start, tiny_job

_FIELDS = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}


def _two_commits(tmp_path) -> Storage:
    st = Storage(f"file://{tmp_path}")
    for step in (10, 20):
        c = ck.AsyncCheckpointer(st, 0, 1, run="t", keep=10)
        c.save(step, [("model.w", torch.full((100,), float(step)))], _FIELDS)
        c.close()
    return st


@pytest.mark.parametrize("damage", ["truncated", "empty", "extended"])
def test_a_shard_of_the_wrong_size_is_corrupt_not_a_storage_outage(tmp_path, damage):
    st = _two_commits(tmp_path)
    shard = tmp_path / "step_00000020" / "rank00000.bin"
    data = shard.read_bytes()
    shard.write_bytes({"truncated": data[:100], "empty": b"", "extended": data + b"x"}[damage])
    m = ck.read_manifest(st, 20)
    t0 = time.monotonic()
    with pytest.raises(ck.CheckpointError, match="step_00000020/rank00000.bin"):
        ck.read_shard(st, m.shards[0])
    assert time.monotonic() - t0 < 2  # not retried as if the disk were away
    assert torch.equal(ck.read_shard(st, ck.read_manifest(st, 10).shards[0])["model.w"], torch.full((100,), 10.0))


@pytest.mark.parametrize("content", [b"{}", b"not json", b'{"step": 5}'])
def test_an_unreadable_manifest_is_skipped_by_name_and_the_rest_still_list(tmp_path, content, caplog):
    st = _two_commits(tmp_path)
    stray = tmp_path / "step_99999999"
    stray.mkdir()
    (stray / "manifest.json").write_bytes(content)
    with pytest.raises(ck.CheckpointError, match="step_99999999/manifest.json"):
        ck.read_manifest(st, 99999999)
    assert [m.step for m in ck.committed(st)] == [20, 10]
    assert "step_99999999/manifest.json" in caplog.text


def test_a_tampered_tensor_shape_is_a_corrupt_checkpoint(tmp_path):
    st = _two_commits(tmp_path)
    m = ck.read_manifest(st, 20)
    m.shards[0].tensors[0].shape = [7, 7]
    with pytest.raises(ck.CheckpointError, match="tensor model.w does not match its record"):
        ck.read_shard(st, m.shards[0])


def test_frenzy_checkpoints_lists_a_bad_manifest_and_refuses_a_missing_root(tmp_path, capsys):
    from cli.main import main

    _two_commits(tmp_path)
    (tmp_path / "step_00000030").mkdir()
    (tmp_path / "step_00000030" / "manifest.json").write_text("{}")
    assert main(["checkpoints", str(tmp_path), "--json"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)["steps"]}
    assert rows[20]["committed"] and "not a valid manifest" in rows[30]["problem"]
    assert main(["checkpoints", str(tmp_path / "nope")]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err


def test_a_resume_where_nothing_verifies_refuses_instead_of_starting_over(tmp_path, tiny_trained):
    job = tiny_job(f"file://{tmp_path}/ckpt", steps=20, every=10)
    copy_trained(tiny_trained, tmp_path, "a")  # `job`, trained in tmp_path / "a"
    for shard in (tmp_path / "ckpt").glob("step_*/rank*.bin"):
        shard.write_bytes(b"\xff" * 8 + shard.read_bytes()[8:])  # every kept checkpoint fails its checksum
    p = start(job, tmp_path / "b", resume=True)
    assert p.wait(timeout=120) == 2
    log = (tmp_path / "b" / "train.log").read_text()
    assert "refusing to start over from step 0" in log and "--from-scratch" in log
    assert sorted(d.name for d in (tmp_path / "ckpt").glob("step_*")) == ["step_00000010", "step_00000020"]


def test_a_job_name_is_a_name_not_a_path():
    for bad in ("../../..", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(JobSpecError, match="is not a name"):
            parse_job({"name": bad, "model": "gpt-tiny"})
    assert parse_job({"name": "llama3-8b_v2.1", "model": "gpt-tiny"}).name == "llama3-8b_v2.1"


def test_a_manifest_whose_run_is_a_path_is_refused(tmp_path):
    st = _two_commits(tmp_path)
    f = tmp_path / "step_00000020" / "manifest.json"
    doc = json.loads(f.read_text())
    doc["run"] = "../../etc"
    f.write_text(json.dumps(doc))
    with pytest.raises(ck.CheckpointError, match="not a valid manifest"):
        ck.read_manifest(st, 20)


def test_permission_errors_are_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_STORAGE_RETRIES", "8")
    st = Storage(f"file://{tmp_path}")

    calls = []

    def denied(*_a, **_k):
        calls.append(1)
        raise PermissionError("denied")

    # root ignores file modes, so the denial is injected where the write lands (the rename into place)
    monkeypatch.setattr("tasks.training.storage.os.replace", denied)
    with pytest.raises(StorageError, match="retrying cannot fix this"):
        st.put("x/y.json", b"{}")
    assert len(calls) == 1


_STUCK_RANK = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from tasks.training.launch import _watch_parent
signal.signal(signal.SIGTERM, lambda *_: os.write({w}, b"term\\n"))  # a rank that cannot finish its step
_watch_parent({grace})
os.write({w}, b"ready\\n")
while True:
    time.sleep(3600)
"""


def test_an_orphaned_rank_is_asked_to_commit_then_exits_hard_after_the_grace(tmp_path):
    """The launcher dies with SIGKILL: the rank gets SIGTERM at once (its step is committed by the loop), and a
    rank stuck where it cannot finish is gone after the grace period, not running on as an orphan writer."""
    import os
    import select
    import signal
    import subprocess
    import sys
    from pathlib import Path

    r, w = os.pipe()
    rank = _STUCK_RANK.format(root=str(Path(__file__).resolve().parents[1]), w=w, grace=1.0)
    launcher = subprocess.Popen([sys.executable, "-c", "import signal, subprocess, sys\n"
                                 f"subprocess.Popen([sys.executable, '-c', {rank!r}], pass_fds=({w},))\n"
                                 "signal.pause()"], pass_fds=(w,))
    os.close(w)
    got = b""

    def read_until_eof(timeout: float) -> bytes:
        out = b""
        while select.select([r], [], [], timeout)[0]:
            chunk = os.read(r, 100)
            if not chunk:
                return out
            out += chunk
        raise AssertionError(f"the rank still runs; it wrote {got + out!r}")

    while not got.endswith(b"ready\n"):
        assert select.select([r], [], [], 60)[0], "the rank never started"
        got += os.read(r, 100)
    t0 = time.monotonic()
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    rest = read_until_eof(60)  # EOF: the rank's process (the last holder of the pipe) has exited
    assert rest == b"term\n"
    assert time.monotonic() - t0 >= 1.0  # it was given its grace to commit before the hard exit
