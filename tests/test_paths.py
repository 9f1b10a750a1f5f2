"""Paths relative to the data root stay inside it (red team 41c S19: `checkpoint.uri: ../escape/ckpt` from a form
left the shared data root without a word)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.jobspec import parse_job
from tasks.paths import PathError, absolute
from tasks.pipeline.request import SubmitRequest


def _job(uri: str | None, data: str = "corpus.txt") -> dict:
    ck = {"every_steps": 10, **({"uri": uri} if uri else {})}
    return {"name": "Form.v1-x_Y", "model": {"preset": "gpt-tiny"},
            "training": {"steps": 20, "seq_len": 64, "global_batch": 4, "checkpoint": ck,
                         "data": {"source": "text", "path": data}}}


def test_a_form_path_that_leaves_the_data_root_is_refused_naming_the_field(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("FRENZY_DATA", str(root))
    req = SubmitRequest(job=parse_job(_job("../escape/ckpt")), cluster="local")
    with pytest.raises(PathError) as err:
        req.resolved(root)  # what a deployment run does: relative to the data root
    msg = str(err.value)
    assert "training.checkpoint.uri '../escape/ckpt' leaves the data root" in msg and str(root) in msg
    assert "absolute path" in msg and str(tmp_path / "escape" / "ckpt") in msg
    with pytest.raises(PathError, match="training.data.path"):
        SubmitRequest(job=parse_job(_job(None, data="../../etc/corpus.txt")), cluster="local").resolved(root)
    with pytest.raises(PathError, match="history_dir"):
        SubmitRequest(job=parse_job(_job(None)), cluster="local", history_dir="../evals").resolved(root)


def test_inside_the_root_absolute_elsewhere_and_a_users_own_directory_are_allowed(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("FRENZY_DATA", str(root))
    ok = SubmitRequest(job=parse_job(_job("team/../mine/ckpt")), cluster="local").resolved(root)
    assert ok.job.training.checkpoint.uri == str(root / "mine" / "ckpt")
    assert ok.job.training.data.path == str(root / "corpus.txt") and ok.run_dir == str(root / "runs" / "Form.v1-x_Y")
    elsewhere = str(tmp_path / "scratch" / "ckpt")
    assert SubmitRequest(job=parse_job(_job(elsewhere)), cluster="local").resolved(root).job.training.checkpoint.uri \
        == elsewhere
    user = tmp_path / "users" / "alice"  # the CLI: relative to the job file, which may say `..`
    mine = SubmitRequest(job=parse_job(_job("../shared/ckpt")), cluster="local").resolved(user)
    assert mine.job.training.checkpoint.uri == str(tmp_path / "users" / "shared" / "ckpt")
    with pytest.raises(PathError, match="uri 'file://../x'"):  # a file:// URI is a path too
        absolute("file://../x", Path(root), "uri")
    assert absolute("s3://bucket/../x", Path(root), "uri") == "s3://bucket/../x"  # remote: not a path under the root
