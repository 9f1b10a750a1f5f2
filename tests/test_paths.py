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


def test_a_job_file_in_a_linked_directory_means_one_place_from_wherever_it_is_named(tmp_path, monkeypatch):
    """Red team 41e: `users/dave/proj -> real/proj` with `data.path: ../corpus.txt` trained on users/dave/corpus.txt
    when the job file was named through the link from users/dave, and on real/corpus.txt when run inside it (the OS
    gives the working directory physically): one job file, two datasets and two runs."""
    from tasks.paths import job_dir, resolve_job

    (tmp_path / "real" / "proj").mkdir(parents=True)
    (tmp_path / "dave").mkdir()
    (tmp_path / "dave" / "proj").symlink_to(tmp_path / "real" / "proj", target_is_directory=True)
    job = parse_job(_job("../ckpts/symdir", data="../corpus.txt"))
    monkeypatch.chdir(tmp_path / "dave")
    through_link = resolve_job(job, job_dir("proj/job.yaml"), tmp_path / "run")
    monkeypatch.chdir(tmp_path / "dave" / "proj")
    inside = resolve_job(job, job_dir("job.yaml"), tmp_path / "run")
    assert through_link.training.data.path == inside.training.data.path == str(tmp_path / "real" / "corpus.txt")
    assert through_link.training.checkpoint.uri == inside.training.checkpoint.uri == str(tmp_path / "real" / "ckpts" / "symdir")


def test_a_root_named_through_a_symbolic_link_is_the_run_at_its_target(tmp_path):
    """Red team 41e: bob resubmitted alice's finished `tilde` through a link to her root; it was taken for a new run
    (a summary of nan loss and 0 checkpoints, both steps evaluated again)."""
    from cluster.ledger import RunRecord
    from tasks.paths import place_key
    from tasks.pipeline.summary import same_place, this_run

    (tmp_path / "alice" / "ck").mkdir(parents=True)
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "alice-ck").symlink_to(tmp_path / "alice" / "ck", target_is_directory=True)
    linked, real = str(tmp_path / "bob" / "alice-ck"), f"file://{tmp_path}/alice/ck/"
    assert place_key(linked) == place_key(real) == f"file://{tmp_path}/alice/ck"
    assert same_place(linked, real) and not same_place(linked, str(tmp_path / "bob")) and not same_place(None, real)
    runs = [RunRecord(job="tilde", stage="reported", checkpoint_root=str(tmp_path / "other"), run_dir="r", history_dir="h"),
            RunRecord(job="tilde", stage="reported", checkpoint_root=real, run_dir="r", history_dir="h")]
    assert this_run(runs, linked) is runs[1]
    assert this_run(runs, str(tmp_path / "elsewhere")) is None and this_run(runs, None) is runs[0]
