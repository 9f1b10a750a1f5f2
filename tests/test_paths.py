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


def _every_path_field(value: str) -> SubmitRequest:
    """A submit request whose every path field (the job's and the request's) is `value` with a suffix."""
    job = _job(f"{value}/ckpt", data=f"{value}/corpus.txt")
    job["training"]["data"]["tokenizer"] = f"{value}/tok.json"
    job["evaluation"] = {"suite": f"{value}/suite.yaml"}
    return SubmitRequest(job=parse_job(job), cluster=f"{value}/cluster.yaml", run_dir=f"{value}/run",
                         history_dir=f"{value}/evals", ledger=f"{value}/ledger.db", suite=f"{value}/s.yaml")


def _paths_of(req: SubmitRequest) -> list[str]:
    j = req.job
    return [j.training.data.path, j.training.data.tokenizer, j.training.checkpoint.uri, j.evaluation.suite,
            req.cluster, req.run_dir, req.history_dir, req.ledger, req.suite]


@pytest.mark.parametrize("spelling", ["$FRENZY_T_DIR", "${FRENZY_T_DIR}", "~/in-home"])
def test_environment_variables_and_tilde_are_expanded_in_every_path_field(tmp_path, monkeypatch, spelling):
    """Red team 41e S04: `uri: $HOME/ck-env` made a directory literally named `$HOME` beside the job file."""
    monkeypatch.setenv("FRENZY_T_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    want = str(tmp_path / "from-env") if spelling.startswith("$") else str(tmp_path / "home" / "in-home")
    got = _paths_of(_every_path_field(spelling).resolved(tmp_path / "cwd", job_base=tmp_path / "jobdir"))
    assert len(got) == 9 and all(p.removeprefix("file://").startswith(want + "/") for p in got), got
    assert not any("$" in p for p in got)
    # the forms' requests go through the same place
    from tasks.evaluation.pending import targets
    from tasks.evaluation.request import EvaluateRequest, PendingRequest
    from tasks.training.request import TrainRequest

    ev = EvaluateRequest(uri=f"{spelling}/ckpt/step_00000010", history_dir=f"{spelling}/evals",
                         out_dir=f"{spelling}/out", suite=f"{spelling}/s.yaml").resolved(tmp_path)
    assert all(p.removeprefix("file://").startswith(want) for p in (ev.uri, ev.history_dir, ev.out_dir, ev.suite))
    tr = TrainRequest(job=_every_path_field(spelling).job, run_dir=f"{spelling}/run",
                      history_dir=f"{spelling}/evals").resolved(tmp_path)
    assert tr.run_dir.startswith(want) and tr.history_dir.startswith(want) and tr.job.training.checkpoint.uri.startswith(want)
    from cluster.request import SimulateRequest
    from tasks.stragglers.request import StragglerRequest

    sr = StragglerRequest(trace=f"{spelling}/t.parquet", meta=f"{spelling}/m.yaml", out_dir=f"{spelling}/o").resolved(tmp_path)
    assert all(p.startswith(want) for p in (sr.trace, sr.meta, sr.out_dir))
    sim = SimulateRequest(cluster=f"{spelling}/c.yaml", trace=f"{spelling}/jobs.csv").resolved(tmp_path)
    assert sim.cluster.startswith(want) and sim.trace.startswith(want)
    assert SimulateRequest().resolved(tmp_path).trace == "newworkload:30"  # a name, not a path
    (tmp_path / "from-env").mkdir(exist_ok=True)
    (tmp_path / "home").mkdir(exist_ok=True)
    t = targets(PendingRequest(roots=[f"{spelling}/ckpt"], history_dir=f"{spelling}/evals",
                               ledger=f"{spelling}/ledger.db"), tmp_path)
    assert t[0].root.startswith(want) and t[0].history_dir.startswith(want)
    assert Path(want, "ledger.db").exists()  # the ledger named through the variable, not `./$FRENZY_T_DIR/...`
    assert not list(tmp_path.rglob("$*"))  # no directory named after a variable anywhere


@pytest.mark.parametrize("spelling,words", [("$FRENZY_T_UNSET/ck", "$FRENZY_T_UNSET is not set"),
                                            ("${FRENZY_T_UNSET}/ck", "$FRENZY_T_UNSET is not set"),
                                            ("${FRENZY_T_DIR:-/tmp}/ck", "shell expression"),
                                            ("${FRENZY_T_DIR/ck", "shell expression")])
def test_a_variable_that_cannot_be_expanded_is_refused_naming_the_field(tmp_path, monkeypatch, spelling, words):
    monkeypatch.setenv("FRENZY_T_DIR", str(tmp_path))
    monkeypatch.delenv("FRENZY_T_UNSET", raising=False)
    with pytest.raises(PathError) as err:
        SubmitRequest(job=parse_job(_job(spelling)), cluster="local").resolved(tmp_path)
    assert "training.checkpoint.uri" in str(err.value) and words in str(err.value), err.value
    # a `$` that begins no name is a character like any other (as in a shell)
    assert absolute("a$/b$1", tmp_path, "x") == f"{tmp_path}/a$/b$1"


LONG_NAME = "n" * 300                      # past NAME_MAX (255 on every Linux file system)
LONG_PATH = "/".join(["p" * 200] * 22)     # 4.4 KB: past PATH_MAX (4096)


@pytest.mark.parametrize("bad,words", [(LONG_NAME, "bytes per name"), (LONG_PATH, "for a whole path")])
def test_a_path_the_file_system_cannot_hold_is_refused_at_submit_once(tmp_path, capsys, monkeypatch, bad, words):
    """Red team 41e S05: caught only after plan, place and the trainer's start, the 4.4 KB path printed twice."""
    from cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("hello world\n" * 50)
    job = tmp_path / "long.yaml"
    job.write_text(f"name: long\nmodel: {{preset: gpt-tiny}}\ntraining:\n  steps: 4\n  seq_len: 64\n  global_batch: 4\n"
                   f"  data: {{source: text, path: corpus.txt}}\n  checkpoint: {{every_steps: 2, uri: {bad}}}\n")
    ledger = tmp_path / "ledger.db"
    assert main(["cluster", "init", "--ledger", str(ledger)]) == 0
    capsys.readouterr()
    assert main(["submit", str(job), "--ledger", str(ledger), "--evaluation", "off", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 600, err  # one line, the path shortened, not 9 KB
    assert "training.checkpoint.uri" in err and words in err and ("255" in err or "4096" in err), err
    assert not (tmp_path / "runs").exists() and not any(p.name.startswith("p" * 200) for p in tmp_path.iterdir())


def test_a_relative_frenzy_home_or_data_is_taken_from_where_the_process_started(tmp_path, monkeypatch):
    """Red team 41g S11: a worker started with FRENZY_HOME=fh failed every evaluate-pending run with "Can't mix
    absolute and relative paths" (the data root was relative, a path under it absolute)."""
    from tasks.paths import absolute, data_root
    from tasks.pathvars import frenzy_home

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FRENZY_DATA", raising=False)
    monkeypatch.setenv("FRENZY_HOME", "fh")
    assert frenzy_home() == tmp_path / "fh" and data_root() == tmp_path / "fh" / "data"
    assert absolute("evals", data_root(), "history_dir") == str(tmp_path / "fh" / "data" / "evals")
    monkeypatch.setenv("FRENZY_DATA", "shared")
    assert data_root() == tmp_path / "shared"


def test_a_file_url_without_an_authority_is_read_as_rfc_8089_reads_it_or_refused(tmp_path):
    """Red team 41i N16: `checkpoint.uri: file:ck` trained into a directory literally named `file:ck`. RFC 8089's
    `file:/abs` is `file:///abs`; `file:ck` is no file URL: refused naming the field and both fixes."""
    from tasks.paths import resolve_job

    job = parse_job(_job(f"file:{tmp_path}/ck"))
    assert resolve_job(job, tmp_path, tmp_path / "run").training.checkpoint.uri == f"file://{tmp_path}/ck"
    with pytest.raises(PathError, match=r"training.checkpoint.uri 'file:ck' is not a file URL \(RFC 8089") as info:
        resolve_job(parse_job(_job("file:ck")), tmp_path, tmp_path / "run")
    assert "write the path itself ('ck', relative to the job file)" in str(info.value)
    assert absolute("file://ck", tmp_path, "x") == f"file://{tmp_path}/ck"  # the documented relative reading stays
    assert absolute("./file:ck", tmp_path, "x") == f"{tmp_path}/file:ck"  # a plain path with a colon is a path
