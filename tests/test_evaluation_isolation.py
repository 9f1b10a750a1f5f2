"""Issue 41, promise 3 (isolation): a trial process that dies fails its own datasets, not the whole evaluation. Real
trial processes; the bad dataset's own trial SIGKILLs itself while it infers (as the OOM killer ends a process that
loads huge examples), packed beside good datasets in the same trial."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tasks.artifactkey import run_key, step_root
from tasks.evaluation import history
from tasks.evaluation.record import recorded
from tasks.evaluation.runner import EvalOptions, EvalResult, evaluate
from tasks.evaluation.suite import Suite, load_suite
from tasks.procs import alive
from tests import trainer_util as tu

KILLED = "was killed (SIGKILL: most often the kernel's out-of-memory killer"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_trained):
    return tu.copy_trained(tiny_trained, tmp_path_factory.mktemp("isockpt"))


def three(kill: bool) -> Suite:
    """Two good datasets and `huge`, whose trial process is SIGKILLed when it infers (with `kill`)."""
    return Suite.model_validate({"name": "iso", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "heldout-cloze", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "huge", "dataset": "tests.evalplugin:Echo", "examples": 2, "mode": "gen",
         "infer_s_per_example": 0.01, "options": {"oom_killed": kill}}]})


def _opts(tmp_path: Path, name: str, **kw) -> EvalOptions:
    return EvalOptions(out_dir=str(tmp_path / name), shm_root=str(tmp_path / "shm"), learn_priors=False,
                       use_priors=False, **kw)


def plugins_only(kill: bool) -> Suite:
    """Two good plugin datasets and `huge` (as in `three`): a suite of plugins only loads them all before it plans,
    so they are packed into trials together (beside a dataset of Frenzy's own, a plugin loads while that part runs,
    and is planned in trials of its own)."""
    return Suite.model_validate({"name": "iso", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": n, "dataset": "tests.evalplugin:Echo", "examples": 4, "mode": "gen", "infer_s_per_example": 0.01}
        for n in ("echo-a", "echo-b")] + [three(kill).datasets[2].model_dump()]})


def test_a_killed_dataset_fails_alone_after_one_retry_of_its_own_and_its_trial_mates_are_scored(ckpt, tmp_path):
    res = evaluate(ckpt, plugins_only(kill=True), _opts(tmp_path, "bad"))
    assert set(res.scores) == {"echo-a", "echo-b"}
    assert list(res.failed) == ["huge"]
    cause = res.failed["huge"]
    assert KILLED in cause and "then again alone" in cause and "/trials/trial-" in cause, cause
    died = [t for t in res.trials if t.error and t.retry_of is None]
    assert died and all("huge" in t.datasets and KILLED in t.error for t in died)
    assert any(len(t.datasets) > 1 for t in died), [t.datasets for t in died]  # packed beside good datasets
    retries = [t for t in res.trials if t.retry_of is not None]
    assert all(len(t.datasets) == 1 for t in retries)  # one trial per dataset
    assert {t.retry_of for t in retries} <= {t.id for t in died}  # a retry is never retried
    huge = [t for t in retries if t.datasets == ["huge"]]
    assert sorted(t.retry_of for t in huge) == sorted(t.id for t in died)  # each death: once, alone
    assert all(KILLED in (t.error or "") for t in huge)
    assert all(t.error is None for t in retries if t.datasets != ["huge"])  # trial-mates' retries ran
    saved = EvalResult.model_validate_json((tmp_path / "bad" / "result.json").read_text())
    assert saved.failed == res.failed and saved.scores == res.scores
    assert list((tmp_path / "shm").iterdir()) == []
    # the negative control: the same suite with nothing killed scores all three, with no failure and no retry
    ok = evaluate(ckpt, plugins_only(kill=False), _opts(tmp_path, "ok"))
    assert ok.failed == {} and set(ok.scores) == {"echo-a", "echo-b", "huge"}
    assert all(t.error is None and t.retry_of is None for t in ok.trials)
    for name in res.scores:  # the survivors' scores are what they would have been
        assert res.scores[name] == pytest.approx(ok.scores[name])


def test_naive_schedule_retries_a_dead_single_dataset_trial_once(ckpt, tmp_path):
    res = evaluate(ckpt, three(kill=True), _opts(tmp_path, "nv", schedule="naive"))
    assert set(res.scores) == {"heldout-loss", "heldout-cloze"} and KILLED in res.failed["huge"]
    huge = [t for t in res.trials if "huge" in t.datasets]
    assert len(huge) == 2 and huge[1].retry_of == huge[0].id and all(t.error for t in huge)


def test_cli_evaluate_prints_the_scores_and_each_failed_dataset_and_exits_2(ckpt, tmp_path, capsys):
    from cli.main import main

    suite_file = tmp_path / "iso.yaml"
    suite_file.write_text(json.dumps(three(kill=True).model_dump()))
    hist = str(tmp_path / "h")
    args = [ckpt, "--suite", str(suite_file), "--history-dir", hist, "--no-learn"]
    on_term = signal.getsignal(signal.SIGTERM)
    assert main(["evaluate", *args, "--out-dir", str(tmp_path / "o")]) == 2
    assert signal.getsignal(signal.SIGTERM) is on_term  # its clean stop on SIGTERM held only while it ran
    out, err = capsys.readouterr()
    assert "heldout-cloze" in out and "heldout-loss" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("huge: FAILED (not scored): ")]
    assert KILLED in line and "its log: " in line
    assert "frenzy evaluate: 1 dataset(s) not scored: huge (causes above" in err
    # red team 41k B1: the logs the trial records and the live lines name are where the results were renamed to
    saved = json.loads((tmp_path / "o" / "result.json").read_text())
    logs = [re.search(r"its log: (\S+\.stderr)", t["error"])[1] for t in saved["trials"] if t["error"]]
    assert logs and all(log.startswith(f"{tmp_path / 'o' / 'trials'}/") and Path(log).is_file() for log in logs)
    assert f"its log: {tmp_path / 'o' / 'trials'}/" in err and ".tmp-" not in err, err
    # the history has the scores and names the failure; the step is not complete: still pending, not `recorded`
    (entry,) = history.read(hist, json.loads((tmp_path / "o" / "result.json").read_text())["run"], "iso")
    assert set(entry.scores) == {"heldout-loss", "heldout-cloze"} and list(entry.failed) == ["huge"]
    assert history.pending(ckpt, hist, "iso") == [f"{ckpt}/step_00000010", f"{ckpt}/step_00000020"]
    assert recorded(hist, entry.run, entry.step, "iso") is None
    assert recorded(hist, entry.run, entry.step, "iso", whole=False).failed == entry.failed
    assert main(["evaluate", *args, "--out-dir", str(tmp_path / "j"), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["scores"]) == {"heldout-loss", "heldout-cloze"} and KILLED in doc["failed"]["huge"]


def test_a_dataset_that_cannot_be_loaded_fails_alone_and_the_rest_is_scored(ckpt, tmp_path, capsys):
    """Red team 41l B1: a suite dataset whose plugin module is missing failed the whole evaluation, so the suite's
    good datasets got no score."""
    from cli.main import main

    suite = {"name": "load", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "gone", "dataset": "nosuchmod_rt41l:factory", "examples": 2, "mode": "gen", "infer_s_per_example": 0.1},
        {"name": "short", "dataset": "tests.evalplugin:Echo", "examples": 10**6, "mode": "gen",
         "infer_s_per_example": 0.01}]}
    (tmp_path / "load.yaml").write_text(json.dumps(suite))
    hist = str(tmp_path / "h")
    assert main(["evaluate", ckpt, "--suite", str(tmp_path / "load.yaml"), "--history-dir", hist, "--no-learn",
                 "--out-dir", str(tmp_path / "o"), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["scores"]) == {"heldout-loss"} and sorted(doc["failed"]) == ["gone", "short"]
    assert "No module named 'nosuchmod_rt41l'" in doc["failed"]["gone"]
    assert "lower `examples`" in doc["failed"]["short"]
    assert not any({"gone", "short"} & set(t["datasets"]) for t in doc["trials"])  # never planned
    (entry,) = history.read(hist, doc["run"], "load")
    assert sorted(entry.failed) == ["gone", "short"]
    assert history.pending(ckpt, hist, "load")[0] == f"{ckpt}/step_00000010"  # the step stays pending


def test_a_failed_writers_files_are_kept_at_one_place_and_a_users_directory_of_that_name_is_left_alone(tmp_path):
    """Red team 41l C1, the mechanism: a failure's files move to OUT.failed (the error names them there), the next
    failure replaces them, a success removes them; a directory of the user's that has the name is never touched."""
    from tasks.outdir import fill_dir

    out = tmp_path / "o"
    for n in range(2):
        with pytest.raises(RuntimeError) as failed, fill_dir(out, "t", True, keep_failed=True) as tmp:
            (tmp / "log").write_text(str(n))
            raise RuntimeError(f"see {tmp}/log")
        assert str(failed.value) == f"see {out}.failed/log" and (tmp_path / "o.failed" / "log").read_text() == str(n)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["o.failed"]  # no temp directory piles up
    with fill_dir(out, "t", True, keep_failed=True) as tmp:
        (tmp / "result").write_text("ok")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    mine = tmp_path / "u.failed"
    mine.mkdir()
    (mine / "keep").write_text("x")
    with pytest.raises(RuntimeError), fill_dir(tmp_path / "u", "t", True, keep_failed=True) as tmp:
        raise RuntimeError(str(tmp))
    with fill_dir(tmp_path / "u", "t", True, keep_failed=True):
        pass
    assert (mine / "keep").read_text() == "x" and sorted(p.name for p in mine.iterdir()) == ["keep"]


def test_the_report_gives_each_failed_dataset_a_visible_entry():
    from types import SimpleNamespace

    from tasks.evaluation.summary import EvalSummary
    from tasks.report import _score_rows

    def summary(step: int, failed: dict[str, str]) -> EvalSummary:
        return EvalSummary(uri=f"file:///c/step_{step:08d}", run="r", step=step, suite="iso",
                           scores={"heldout-loss": {"loss": 2.5}}, makespan_s=1.0, predicted_makespan_s=1.0,
                           result="x", history_plot=None, failed=failed)

    evals = [summary(10, {}), summary(20, {"huge": "trial-0003 was killed (SIGKILL ...)"})]
    rows = _score_rows(SimpleNamespace(evaluations=evals))
    assert rows[-1] == {"metric": "huge (not scored)", "step 10": "", "step 20": "FAILED"}
    assert evals[1].failed_lines() == ["step 20: huge FAILED (not scored): trial-0003 was killed (SIGKILL ...)"]


def test_evaluate_pending_scores_the_rest_names_the_failed_dataset_and_leaves_the_step_pending(ckpt, tmp_path,
                                                                                           prefect_server):
    from prefect.artifacts import Artifact

    from flows.evaluate import PendingRequest, evaluate_pending

    suite_file = tmp_path / "iso.yaml"
    suite_file.write_text(json.dumps(three(kill=True).model_dump()))
    hist = str(tmp_path / "evals")
    done = evaluate_pending(PendingRequest(roots=[ckpt], suite=str(suite_file), history_dir=hist,
                                           ledger=str(tmp_path / "ledger.db")))
    assert [d.step for d in done] == [10, 20]
    assert all(set(d.scores) == {"heldout-loss", "heldout-cloze"} and KILLED in d.failed["huge"] for d in done)
    report = str(Artifact.get("evaluate-pending").data)
    assert "2 evaluated (2 with failed datasets), 0 could not be evaluated, 0 skipped" in report, report
    assert "step 20: huge FAILED (not scored)" in report, report
    key = run_key("eval-iso", done[1].run, step_root(done[1].uri))
    assert "FAILED (not scored)" in str(Artifact.get(key).data) and "SIGKILL" in str(Artifact.get(key).data)
    by_step = str(Artifact.get(run_key("eval-history-iso", done[1].run, step_root(done[1].uri))).data)
    assert "| failed |" in by_step and [ln.endswith("| huge |") for ln in by_step.splitlines() if ln.startswith(
        ("| 10 ", "| 20 "))] == [True, True], by_step
    log = re.search(r"its log: (\S+\.stderr)", done[1].failed["huge"])
    assert log and Path(log[1]).is_file(), done[1].failed  # where the results were renamed to, not the temp dir
    assert history.pending(ckpt, hist, "iso") == [f"{ckpt}/step_00000010", f"{ckpt}/step_00000020"]


def test_submit_in_flow_scores_the_rest_and_names_the_failed_dataset_in_its_summary_and_report(prefect_server,
                                                                                             tmp_path):
    from cli.submit import _human
    from flows.submit import SubmitRequest, submit
    from tasks.jobspec import parse_job

    suite_file = tmp_path / "iso.yaml"
    suite_file.write_text(json.dumps(three(kill=True).model_dump()))
    job = {"name": "iso", "model": {"preset": "gpt-tiny"}, "evaluation": {"suite": str(suite_file)},
           "training": {"seq_len": 64, "global_batch": 8, "precision": "fp32", "steps": 20, "lr": 3e-3,
                        "warmup_steps": 5, "log_every_steps": 5, "trace_every_steps": 10,
                        "checkpoint": {"every_steps": 20, "uri": f"file://{tmp_path}/ckpt", "keep": 5}}}
    res = submit(SubmitRequest(job=parse_job(job), cluster="local", ledger=str(tmp_path / "ledger.db"),
                               evaluation="in-flow", device="cpu", run_dir=str(tmp_path / "run"),
                               history_dir=str(tmp_path / "evals")))
    (ev,) = res.evaluations
    assert ev.step == 20 and set(ev.scores) == {"heldout-loss", "heldout-cloze"} and KILLED in ev.failed["huge"]
    assert res.released and res.evaluation_failures == []
    said = _human(res, 1.0)
    assert "step 20: huge FAILED (not scored): its trial died, then again alone: " in said, said
    html = Path(res.report).read_text()
    assert "huge (not scored)" in html and "FAILED" in html and "SIGKILL" in html


def _suite_file(tmp_path: Path, bad: dict) -> str:
    """`heldout-loss` and `bad`, an Echo dataset with the options `bad` (tests/evalplugin.py)."""
    suite = {"name": "grp", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "bad", "dataset": "tests.evalplugin:Echo", "examples": 1, "mode": "gen",
         "infer_s_per_example": 0.01, "options": bad}]}
    (tmp_path / "grp.yaml").write_text(json.dumps(suite))
    return str(tmp_path / "grp.yaml")


def _evaluate(ckpt: str, suite: str, tmp_path: Path, *extra: str) -> subprocess.Popen:
    """`frenzy evaluate ... --json` as typed in a terminal: its own process group (the terminal's foreground group,
    which a Ctrl-C signals), SIGINT at its default; this checkout first on its path (the test plugin is here)."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen([sys.executable, "-m", "cli", "evaluate", ckpt, "--suite", suite, "--history-dir",
                             str(tmp_path / "h"), "--out-dir", str(tmp_path / "out"), "--no-learn", "--json", *extra],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / "cli.err", "w"),
                            text=True, start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_a_dataset_that_kills_its_process_group_fails_alone_and_the_rest_is_scored(ckpt, tmp_path):
    """Red team 41k B6: `os.killpg(os.getpgid(0), SIGKILL)` in a plugin's infer took `frenzy evaluate` down (rc 137,
    no scores, its shared-memory copy and temp directory left): trials shared its process group."""
    proc = _evaluate(ckpt, _suite_file(tmp_path, {"kill_group": True}), tmp_path)
    out, _ = proc.communicate(timeout=600)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 2, err[-3000:]
    doc = json.loads(out)
    assert set(doc["scores"]) == {"heldout-loss"} and list(doc["failed"]) == ["bad"]
    assert "then again alone" in doc["failed"]["bad"] and KILLED in doc["failed"]["bad"]
    assert [t["retry_of"] for t in doc["trials"] if t["datasets"] == ["bad"]][-1] is not None  # retried alone once
    assert list(Path("/dev/shm").glob(f"frenzy-eval-{proc.pid}-*")) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []  # no temp dir, no lock


def test_a_dataset_whose_score_kills_its_process_group_fails_alone_and_the_rest_is_scored(ckpt, tmp_path):
    """Red team 41l: the metric job (a dataset's `score`, on a CPU) ran in a thread of `frenzy evaluate`; a plugin's
    `score` that killed its own process group ended the whole evaluation. Now metric jobs have processes (and
    sessions) of their own: that dataset fails, named with how its job ended, and the rest is scored."""
    proc = _evaluate(ckpt, _suite_file(tmp_path, {"score_kills_group": True}), tmp_path)
    out, _ = proc.communicate(timeout=600)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 2, err[-3000:]
    doc = json.loads(out)
    assert set(doc["scores"]) == {"heldout-loss"} and list(doc["failed"]) == ["bad"], doc.get("failed")
    cause = doc["failed"]["bad"]
    assert cause.startswith("metrics of bad[0:1]: its metric process ended while it scored (killed by SIGKILL"), cause
    assert list(Path("/dev/shm").glob(f"frenzy-eval-{proc.pid}-*")) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


@pytest.fixture
def hung(tmp_path):
    """The evaluators a test starts (it appends them); at teardown they, and the trial and child the hanging dataset
    names in `tmp_path/hanging`, are killed if still there (a failed test leaves nothing running)."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.kill()
    announce = tmp_path / "hanging"
    pids = [int(x) for x in announce.read_text().split()] if announce.exists() else []
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _trial_and_child(announce: Path, proc: subprocess.Popen) -> tuple[int, int]:
    tu.wait_for(lambda: announce.exists() or proc.poll() is not None, timeout=600, what="the trial to start")
    assert announce.exists(), (announce.parent / "cli.err").read_text()[-3000:]
    trial, child = (int(x) for x in announce.read_text().split())
    assert alive(trial) and alive(child)
    return trial, child


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigterm-stopped"])
def test_ctrl_c_or_sigterm_of_frenzy_evaluate_stops_its_trials_and_what_they_started(ckpt, tmp_path, hung, how):
    """The trials are in process groups of their own now (B6), which the terminal's SIGINT does not reach: the
    evaluator stops each trial's whole group itself, and removes its shared-memory copy. Red team 41n C5: the trial
    it killed was then read as a trial that died: the last line (which the error tells the user to read) was a
    spurious `[Errno 2] ...trial-0000.stderr; retrying ...`; a stop is no trial failure and retries nothing."""
    announce = tmp_path / "hanging"
    proc = _evaluate(ckpt, _suite_file(tmp_path, {"hang_in": str(announce)}), tmp_path)
    hung.append(proc)
    trial, child = _trial_and_child(announce, proc)
    assert os.getpgid(trial) != os.getpgid(proc.pid)  # a signal to the evaluator's group does not reach the trial
    if how == "sigterm-stopped":
        os.kill(trial, signal.SIGSTOP)  # a trial that no longer answers (C5: SIGSTOPped)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's foreground process group
    else:
        proc.terminate()  # the evaluator alone (`kill PID`)
    out, _ = proc.communicate(timeout=120)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == {"ctrl-c": 130, "sigterm": 143, "sigterm-stopped": 143}[how], err[-3000:]
    assert json.loads(out)["error"]["kind"] == "interrupted"
    assert "retrying" not in err and "No such file" not in err and "FAILED" not in err, err[-3000:]
    tu.wait_for(lambda: not alive(trial) and not alive(child), timeout=60, what="the trial and its child to end")
    assert list(Path("/dev/shm").glob(f"frenzy-eval-{proc.pid}-*")) == []


def test_a_sigkilled_evaluator_leaves_no_trial_process_behind(ckpt, tmp_path, hung):
    announce = tmp_path / "hanging"
    proc = _evaluate(ckpt, _suite_file(tmp_path, {"hang_in": str(announce)}), tmp_path)
    hung.append(proc)
    trial, child = _trial_and_child(announce, proc)
    os.kill(proc.pid, signal.SIGKILL)  # the evaluator alone: nothing it could clean up after
    proc.communicate(timeout=60)
    tu.wait_for(lambda: not alive(trial) and not alive(child), timeout=60, what="the trial and its child to end")


def test_a_failed_evaluation_under_json_prints_one_error_document_and_exits_2(tiny_trained, tmp_path):
    """Red team 41k B3: `frenzy evaluate --json` of a checkpoint whose weights cannot load printed nothing on stdout."""
    uri = tu.copy_trained(tiny_trained, tmp_path / "c")
    shard = tmp_path / "c" / "ckpt" / "step_00000020" / "rank00000.bin"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 3)
    proc = _evaluate(uri, _suite_file(tmp_path, {}), tmp_path)
    out, _ = proc.communicate(timeout=600)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 2, err[-3000:]
    doc = json.loads(out)["error"]  # the whole of stdout: one document
    assert doc["command"] == "evaluate" and doc["kind"] == "error" and doc["exit_code"] == 2
    assert "CheckpointError" in doc["message"] and "truncated" in doc["message"] and doc["message"] in err
    # red team 41l C1: the log the error names exists (kept at OUT.failed, not in a temp directory the next writer
    # removes), and a second failure replaces the first's logs rather than leaving another temp directory
    for again in (False, True):
        if again:  # (a third run's document was read and never checked: the second shows the replacement)
            proc = _evaluate(uri, _suite_file(tmp_path, {}), tmp_path)
            out, _ = proc.communicate(timeout=600)
            doc = json.loads(out)["error"]
        logs = re.findall(r"(/\S+?\.stderr)", doc["message"])
        assert logs and all(Path(log).is_file() and log.startswith(f"{tmp_path / 'out.failed'}/") for log in logs), doc
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))) == ["out.failed"]


LOADKILL = '''import os, signal
from tasks.evaluation.datasets import resolve


def make(options, ctx):
    with open(os.environ["RT_LOADS"], "a") as f:  # which process loaded it
        f.write(f"{os.getpid()}\\n")
    if options.get("kill"):
        os.killpg(0, signal.SIGKILL)
    return resolve("heldout-loss", "ppl", {}, ctx)
'''


def test_a_plugin_that_kills_its_process_group_while_it_loads_fails_alone_and_never_loads_in_the_evaluator(
        ckpt, tmp_path, monkeypatch):
    """Red team 41m C1b/C1d: a dataset plugin's factory ran in the evaluator's own process, so `os.killpg(0,
    SIGKILL)` there killed `frenzy evaluate` (no JSON document, its temp directory and lock left). Now a plugin is
    loaded only in a process of its own session: that dataset fails, named, and the rest is scored; a plugin that
    loads is also aggregated outside the evaluator."""
    (tmp_path / "rt_loadkill.py").write_text(LOADKILL)  # importable: the evaluator's and its processes' directory
    monkeypatch.setenv("RT_LOADS", str(tmp_path / "loads"))
    suite = {"name": "lk", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "fine", "dataset": "rt_loadkill:make", "examples": 4, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "dies", "dataset": "rt_loadkill:make", "examples": 4, "mode": "ppl", "infer_s_per_example": 0.01,
         "options": {"kill": True}}]}
    (tmp_path / "lk.yaml").write_text(json.dumps(suite))
    proc = _evaluate(ckpt, str(tmp_path / "lk.yaml"), tmp_path)
    out, _ = proc.communicate(timeout=600)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 2, err[-3000:]
    doc = json.loads(out)
    assert set(doc["scores"]) == {"heldout-loss", "fine"} and list(doc["failed"]) == ["dies"], doc.get("failed")
    cause = doc["failed"]["dies"]
    assert "rt_loadkill:make: killed its process group while loading (killed by SIGKILL" in cause, cause
    assert "dies: FAILED (not scored): rt_loadkill:make: killed its process group while loading" in err
    loads = {int(x) for x in (tmp_path / "loads").read_text().split()}
    assert loads and proc.pid not in loads  # loaded (probed, inferred, scored, aggregated) only in its own processes
    assert list(Path("/dev/shm").glob(f"frenzy-eval-{proc.pid}-*")) == []
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob(".*"))
    assert left == [], left  # no `.out.tmp-PID/`, no lock


def test_overwrite_with_a_failing_dataset_keeps_the_complete_results_and_puts_the_attempt_at_failed(
        ckpt, tmp_path, capsys):
    """Red team 41m C2: `frenzy evaluate --overwrite` of a step scored whole, with a suite of the same name whose
    plugin dataset now fails, replaced the good result.json with the partial one (and the step was pending again)."""
    from cli.main import main

    def suite(plug: str) -> str:
        (tmp_path / "same.yaml").write_text(json.dumps({"name": "same", "model_load_s": {"remote": 2.0, "shm": 2.0},
            "datasets": [{"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
                         {"name": "plug", "dataset": plug, "examples": 2, "mode": "gen", "infer_s_per_example": 0.01}]}))
        return str(tmp_path / "same.yaml")

    hist, out = str(tmp_path / "h"), tmp_path / "o"
    args = ["--history-dir", hist, "--no-learn", "--out-dir", str(out), "--json"]
    assert main(["evaluate", ckpt, "--suite", suite("tests.evalplugin:Echo"), *args]) == 0
    good = json.loads(capsys.readouterr().out)
    assert good["failed"] == {} and set(good["scores"]) == {"heldout-loss", "plug"}
    before = (out / "result.json").read_bytes()
    assert main(["evaluate", ckpt, "--suite", suite("nosuchmod_rt41m:make"), *args, "--overwrite"]) == 2
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert f"frenzy evaluate: {out} keeps its earlier complete results" in cap.err, cap.err[-2000:]
    assert list(doc["failed"]) == ["plug"] and doc["out_dir"] == f"{out}.failed", doc["out_dir"]
    assert doc["kept_earlier"].startswith(f"{out} keeps its earlier complete results"), doc["kept_earlier"]
    assert (out / "result.json").read_bytes() == before  # the complete result stays
    attempt = json.loads((tmp_path / "o.failed" / "result.json").read_text())
    assert list(attempt["failed"]) == ["plug"] and "nosuchmod_rt41m" in attempt["failed"]["plug"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    (entry,) = history.read(hist, good["run"], "same")  # the partial attempt added no history line
    assert entry.failed == {} and set(entry.scores) == {"heldout-loss", "plug"}
    assert recorded(hist, entry.run, entry.step, "same") is not None  # the step is still scored, not pending
    # an attempt that scores every dataset replaces them, as --overwrite says, and removes the failed attempt
    assert main(["evaluate", ckpt, "--suite", suite("tests.evalplugin:Echo"), *args, "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["kept_earlier"] is None
    assert not (tmp_path / "o.failed").exists()


CLAIMED_PASS = '''import sys
from cli.main import main
from tasks.evaluation.claim import claimed

hist, uri, suite = sys.argv[1:4]
with claimed(hist, uri, "grp", "a test pass"):  # as evaluate-pending claims a step before it evaluates it
    sys.exit(main(["evaluate", uri, "--suite", suite, "--history-dir", hist, "--no-learn", "--json"]))
'''


def test_the_next_pass_cleans_what_an_evaluator_killed_from_outside_left_behind(ckpt, tmp_path, hung):
    """Issue 41 (red team 41m C1b): an evaluator SIGKILLed from outside mid-evaluation leaves its claim, its lock and
    `.SUITE.tmp-PID/`; the next pass over the step (its pid is dead) takes the claim over, removes the temp directory
    and the lock, scores the step and leaves nothing behind. Real processes, a real SIGKILL."""
    hist, uri = tmp_path / "h", f"{ckpt}/step_00000010"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}

    def a_pass(options: dict) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", CLAIMED_PASS, str(hist), uri, _suite_file(tmp_path, options)],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / "cli.err", "w"),
                                text=True, start_new_session=True)

    first = a_pass({"hang_in": str(tmp_path / "hanging")})
    hung.append(first)
    trial, child = _trial_and_child(tmp_path / "hanging", first)
    os.kill(first.pid, signal.SIGKILL)  # from outside: nothing of the evaluator's runs after this
    assert first.wait(timeout=60) == -signal.SIGKILL
    left = sorted(p.name for p in hist.rglob(".*"))
    assert ".claims" in left and ".grp.lock" in left and f".grp.tmp-{first.pid}" in left, left
    assert any(p.suffix == ".claim" for p in (hist / ".claims").iterdir())
    tu.wait_for(lambda: not alive(trial) and not alive(child), timeout=60, what="the trial to die with its evaluator")
    second = a_pass({})
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, (tmp_path / "cli.err").read_text()[-3000:]
    assert set(json.loads(out)["scores"]) == {"heldout-loss", "bad"}
    assert sorted(str(p.relative_to(hist)) for p in hist.rglob(".*")) == []  # no claim, lock nor temp directory


def test_evaluate_pending_with_a_plugin_that_kills_its_group_while_it_loads_evaluates_every_step(
        ckpt, tmp_path, prefect_server, monkeypatch):
    """Red team 41m C1b: the pass ran in the process the plugin's factory killed: the flow run Crashed at its first
    step, nothing else evaluated, no artifact, its claim, lock and temp directory left. Now each step is scored but
    for that dataset, which is named, and nothing is left behind. (Without the fix this kills the test's process.)"""
    from prefect.artifacts import Artifact

    from flows.evaluate import PendingRequest, evaluate_pending

    (tmp_path / "rt_loadkill.py").write_text(LOADKILL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("RT_LOADS", str(tmp_path / "loads"))
    suite_file = tmp_path / "lk.yaml"
    suite_file.write_text(json.dumps({"name": "lk", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "dies", "dataset": "rt_loadkill:make", "examples": 4, "mode": "ppl", "infer_s_per_example": 0.01,
         "options": {"kill": True}}]}))
    hist = tmp_path / "evals"
    done = evaluate_pending(PendingRequest(roots=[ckpt], suite=str(suite_file), history_dir=str(hist),
                                           ledger=str(tmp_path / "ledger.db"), schedule="naive"))  # 1 trial a step
    assert [d.step for d in done] == [10, 20]
    assert all(set(d.scores) == {"heldout-loss"} and "killed its process group while loading" in d.failed["dies"]
               for d in done), [d.failed for d in done]
    report = str(Artifact.get("evaluate-pending").data)
    assert "2 evaluated (2 with failed datasets), 0 could not be evaluated, 0 skipped" in report, report
    assert "killed its process group while loading" in report, report
    assert os.getpid() not in {int(x) for x in (tmp_path / "loads").read_text().split()}
    assert sorted(str(p.relative_to(hist)) for p in hist.rglob(".*")) == []  # no claim, lock nor temp directory


def test_a_built_in_name_taken_over_by_register_dataset_is_a_plugin_loaded_only_in_a_metric_process(monkeypatch):
    """A built-in name (`heldout-loss`) that `register_dataset` takes over names the user's factory, not Frenzy's:
    it is not `frenzys_own` (which held the name alone), so the evaluator loads it only through a metric process
    (`probe`), never in its own process; the built-ins not taken over are still loaded by the evaluator."""
    from tasks.evaluation import datasets
    from tasks.evaluation.runner import _check_datasets

    monkeypatch.setitem(datasets._REGISTRY, "heldout-loss", datasets._REGISTRY["heldout-loss"])  # put back after
    built: list[int] = []

    @datasets.register_dataset("heldout-loss")
    def mine(options: dict, ctx: datasets.EvalContext) -> datasets.EvalDataset:
        built.append(os.getpid())
        raise AssertionError("a plugin's factory ran in the evaluator")

    assert not datasets.frenzys_own("heldout-loss") and datasets.frenzys_own("heldout-cloze")
    probed: list[str] = []

    class Jobs:
        def probe(self, spec: dict, ctx: datasets.EvalContext) -> int:
            probed.append(spec["source"])
            return 50

    suite = Suite.model_validate({"name": "own", "datasets": [
        {"name": n, "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01} for n in ("heldout-loss", "heldout-cloze")]})
    assert _check_datasets(suite, datasets.EvalContext(), Jobs(), {"heldout-loss", "heldout-cloze"}) == {}
    assert probed == ["heldout-loss"] and built == []


HANG = '''import os
import threading
from tasks.evaluation.datasets import resolve


def load(options, ctx):
    if options.get("gate"):  # a FIFO: the first load blocks until the test opens its other end
        if not os.path.exists(options["gate"] + ".passed"):
            with open(options["gate"]) as f:
                f.read()
            open(options["gate"] + ".passed", "w").close()
    else:
        threading.Event().wait()  # never set: a load that hangs
    return resolve("heldout-loss", "ppl", {}, ctx)


def score(options, ctx):
    ds = resolve("heldout-loss", "ppl", {}, ctx)
    ds.score = lambda ex, prediction: threading.Event().wait()  # a `score` that hangs
    return ds


def infer(options, ctx):
    ds = resolve("heldout-loss", "ppl", {}, ctx)
    ds.infer_batch = lambda lm, examples: threading.Event().wait()  # an `infer` that hangs, in the trial
    return ds
'''


def _hang_suite(tmp_path: Path, factory: str, timeout_s: float, options: dict | None = None) -> Path:
    (tmp_path / "rt_hang.py").write_text(HANG)  # importable: the evaluator's cwd, and PYTHONPATH for its processes
    suite = {"name": "hang", "model_load_s": {"remote": 2.0, "shm": 2.0}, "plugin_timeout_s": timeout_s, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "heldout-cloze", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "hangs", "dataset": f"rt_hang:{factory}", "examples": 6, "mode": "ppl",
         "infer_s_per_example": 0.01, "options": options or {}}]}
    (tmp_path / "hang.yaml").write_text(json.dumps(suite))
    return tmp_path / "hang.yaml"


def _hang_run(ckpt: str, tmp_path: Path, hung: list, factory: str) -> tuple[subprocess.Popen, dict, str]:
    """`frenzy evaluate --json` of the suite whose `hangs` hangs in `factory` (deadline 3 s): it exits 2 with
    heldout-loss and heldout-cloze scored and `hangs` failed; (the process, its JSON, its stderr)."""
    proc = _evaluate(ckpt, str(_hang_suite(tmp_path, factory, 3)), tmp_path)
    hung.append(proc)
    out, _ = proc.communicate(timeout=600)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 2, err[-3000:]
    doc = json.loads(out)
    assert set(doc["scores"]) == {"heldout-loss", "heldout-cloze"} and list(doc["failed"]) == ["hangs"], doc
    return proc, doc, err


@pytest.mark.parametrize("phase", ["loading", "scoring"])
def test_a_plugin_that_hangs_while_it_loads_or_scores_fails_alone_at_its_deadline(ckpt, tmp_path, hung, phase):
    """Red team 41n C1b: a plugin whose factory hung kept `frenzy evaluate` at "model in shared memory" (nothing
    scored, not even heldout-loss) until killed; one whose `score` hung: no result at all. Now a plugin's load and
    each of its calls have a deadline (`plugin_timeout_s`, here 3 s): its metric process group is killed, that dataset
    fails with the hang, the phase and the setting named, the rest is scored and written, exit 2, nothing left."""
    proc, doc, err = _hang_run(ckpt, tmp_path, hung, "load" if phase == "loading" else "score")
    cause = doc["failed"]["hangs"]
    assert f"rt_hang:{'load' if phase == 'loading' else 'score'}: hung while {phase}" in cause, cause
    assert "no answer in 3s" in cause and "raise `plugin_timeout_s` in the suite file" in cause, cause
    assert f"hangs: FAILED (not scored): {cause}" in err if phase == "loading" else "hangs" in err
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["failed"] == doc["failed"] and set(saved["scores"]) == set(doc["scores"])
    assert list(Path("/dev/shm").glob(f"frenzy-eval-{proc.pid}-*")) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []  # no temp dir, no lock


def test_a_plugin_that_hangs_in_infer_fails_alone_at_the_trials_deadline_and_the_rest_is_scored(ckpt, tmp_path, hung):
    """Red team 41n, left open: a plugin whose `infer` hung (in the inference trial) held the whole evaluation for
    ever. Now a trial that makes no progress by its deadline (for a plugin's chunk the suite's `plugin_timeout_s`, here
    3 s, or 10x the chunk's predicted time) has its process group killed; the dataset it was at fails alone, named with
    the step, the setting and the trial's log, which exists; the rest is scored and written, exit 2."""
    proc, doc, err = _hang_run(ckpt, tmp_path, hung, "infer")
    cause = doc["failed"]["hangs"]
    assert re.search(r"trial-\d+ hung while inferring hangs\[0:\d+\] \(no progress in 3s", cause), cause
    assert "raise `plugin_timeout_s` in the suite file" in cause and "retrying" not in err, err[-3000:]
    log = re.search(r"its log: (\S+\.stderr)\)", cause)
    assert log and Path(log.group(1)).exists(), cause
    assert f"hangs: FAILED (not scored): {cause}" in err
    assert list(Path("/dev/shm").glob(f"frenzy-eval-{proc.pid}-*")) == []


def test_frenzys_own_datasets_are_scored_while_a_plugin_loads(ckpt, tmp_path, monkeypatch):
    """Red team 41n C1b: every plugin was loaded before anything was planned, so a slow plugin held Frenzy's own
    datasets back. The plugin here cannot finish loading until heldout-loss has been scored (its factory waits on a
    FIFO the test opens then): it loads, is planned late and is scored; before, the two waited on each other."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    suite = load_suite(_hang_suite(tmp_path, "load", 600, {"gate": str(gate)}))
    opened: list[threading.Thread] = []

    def progress(msg: str, frac: float) -> None:
        if msg.startswith("heldout-loss[") and not opened:  # heldout-loss scored: let the plugin finish loading
            opened.append(threading.Thread(target=gate.write_text, args=("go",), daemon=True))
            opened[0].start()

    res = evaluate(ckpt, suite, _opts(tmp_path, "o"), progress=progress)
    assert opened and res.failed == {}, res.failed
    assert set(res.scores) == {"heldout-loss", "heldout-cloze", "hangs"}
    assert res.scores["hangs"] == pytest.approx(res.scores["heldout-loss"])  # the same data, scored in its process
    late = [t for t in res.trials if "hangs" in t.datasets]
    assert late and all(t.datasets == ["hangs"] for t in late)  # planned once it had loaded, in trials of its own
    assert len({t.id for t in res.trials}) == len(res.trials)


def test_a_full_disk_while_evaluating_names_the_path_that_filled_and_the_fix(ckpt, tmp_path, capsys, monkeypatch):
    """Red team 41n C4: on a full disk `frenzy evaluate` said only `... failed: [Errno 28] No space left on device
    (logs in ...)`. The write that fails (a trial's spec, ENOSPC injected as the kernel gives it: no file name) is
    named, with the fix: free space, or point --out-dir / --history-dir elsewhere."""
    import errno

    from cli.main import main

    write = Path.write_text

    def full(self: Path, *a, **kw):  # noqa: ANN202
        if self.parent.name == "trials" and self.name.startswith("trial-") and self.suffix == ".json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", full)
    suite_file = tmp_path / "iso.yaml"
    suite_file.write_text(json.dumps(three(kill=False).model_dump()))
    assert main(["evaluate", ckpt, "--suite", str(suite_file), "--history-dir", str(tmp_path / "h"), "--no-learn",
                 "--out-dir", str(tmp_path / "o"), "--json"]) == 2
    msg = json.loads(capsys.readouterr().out)["error"]["message"]
    assert re.search(r"/trials/trial-\d{4}\.json: no space left on the device", msg), msg
    # red team 41o S7: the path named is where the attempt's file now is (kept at `o.failed/`), not the gone temp
    named = Path(re.search(r": (\S+/trials/trial-\d{4}\.json): no space", msg)[1])
    assert named.parent.parent == tmp_path / "o.failed" and named.parent.is_dir() and ".tmp-" not in msg, msg
    assert msg.endswith("the disk is full): free space there, or point --out-dir and --history-dir at another disk"), msg
    assert list((tmp_path / "shm").glob("*")) == [] if (tmp_path / "shm").exists() else True
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".o")) == []  # no temp dir, no lock


def test_evaluate_pending_with_a_plugin_that_hangs_while_it_loads_scores_the_rest_of_every_step(
        ckpt, tmp_path, prefect_server, monkeypatch):
    """Red team 41n C1b, in the scheduled pass: a plugin whose factory hangs fails alone at its deadline on each step
    (not the pass), the rest is scored, and nothing is left behind."""
    from flows.evaluate import PendingRequest, evaluate_pending

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    suite = _hang_suite(tmp_path, "load", 3)
    hist = tmp_path / "evals"
    done = evaluate_pending(PendingRequest(roots=[ckpt], suite=str(suite), history_dir=str(hist),
                                           ledger=str(tmp_path / "ledger.db")))
    assert [d.step for d in done] == [10, 20]
    assert all(set(d.scores) == {"heldout-loss", "heldout-cloze"} and list(d.failed) == ["hangs"] for d in done)
    assert all("hung while loading" in d.failed["hangs"] and "plugin_timeout_s" in d.failed["hangs"] for d in done)
    assert sorted(str(p.relative_to(hist)) for p in hist.rglob(".*")) == []  # no claim, lock nor temp directory


def test_a_trial_beats_on_each_forward_pass_so_a_long_honest_chunk_keeps_its_deadline_off(ckpt):
    """A trial's deadline counts from its last progress; a forward pass of the model is progress (a `beat`), so a
    chunk that takes long but runs the model is never taken for a hang. The real model of the checkpoint."""
    from tasks.evaluation.engine import LM, load_remote
    from tasks.evaluation.trial import beat

    state, info = load_remote(ckpt)
    lm = LM(state, info)
    events: list[dict] = []
    beat(lm, events.append, every_s=0.0)
    lm.nll_batch([[1, 2, 3, 4], [5, 6, 7]], batch=1)  # two forward passes
    lm.generate_batch(["ab"], max_new_tokens=3)  # prefill and decode steps
    assert events[:2] == [{"event": "beat"}, {"event": "beat"}] and len(events) >= 4, events


def test_a_metric_process_stopped_as_it_starts_fails_its_dataset_at_the_startup_deadline(tmp_path, monkeypatch):
    """Red team 41o S14: a plugin's metric process SIGSTOPped as it started held the evaluation 10 min 30 s with no
    message: the plugin deadline did not count the start-up (until its `ready` line). Now the start-up has its own
    deadline (`startup_s`; in a suite, `plugin_timeout_s` but at least 60 s): its group is killed and the job fails
    (MetricJobDied, which fails only its dataset), naming the dataset's source and what to do. Without it the job
    waited until this test's safety SIGCONT and then answered."""
    import contextlib

    from tasks.evaluation import metricjobs
    from tasks.evaluation.datasets import EvalContext
    from tasks.evaluation.metricjobs import STARTUP_FLOOR_S, MetricJobDied, MetricJobs

    started: list[subprocess.Popen] = []

    def stopped(*a, **kw):  # noqa: ANN202 - the metric process, stopped the moment it exists
        proc = metricjobs_popen(*a, **kw)
        os.kill(proc.pid, signal.SIGSTOP)
        started.append(proc)
        return proc

    metricjobs_popen = metricjobs.popen_trial
    monkeypatch.setattr(metricjobs, "popen_trial", stopped)

    def resume() -> None:  # only without the deadline: the stopped process would otherwise hang this test
        for p in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)

    safety = threading.Timer(120, resume)
    safety.start()
    jobs = MetricJobs(tmp_path / "trials", deadline_s=900, startup_s=2)
    try:
        with pytest.raises(MetricJobDied, match=r"rt_stop:good: its metric process was not ready 2s after it st"):
            jobs.probe({"dataset": "good", "source": "rt_stop:good", "mode": "gen", "options": {}},
                       EvalContext())
    finally:
        safety.cancel()
        jobs.close()
    assert started and started[0].poll() == -signal.SIGKILL  # its group killed, not left stopped
    assert MetricJobs(tmp_path, deadline_s=8).startup_s == STARTUP_FLOOR_S  # a short plugin deadline: the floor
    assert MetricJobs(tmp_path).startup_s == 900.0  # the default plugin deadline is longer: that one


def test_a_stopped_precursor_is_killed_at_the_model_loads_deadline_and_its_node_loads_from_storage(
        ckpt, tmp_path, monkeypatch):
    """Red team 41p S7: a SIGSTOPped precursor (the process that copies the model into shared memory) held `frenzy
    evaluate` with no deadline and no word. Now it has a trial's model-load deadline (`trial_stall_s` 1 s, or 10x the
    predicted load, 1.5 s: 15 s here): its group is killed, it is named with the fix, and its node's trials load the
    model from storage themselves; everything is scored."""
    from tasks.evaluation import runner

    real, stopped = runner.popen_trial, []

    def stop_the_precursor(arg: str, device: str, gpu: int, log):  # noqa: ANN001, ANN202
        p = real(arg, device, gpu, log)
        if Path(arg).name == "precursor-n0.json":
            os.kill(p.pid, signal.SIGSTOP)  # stopped before it read anything: it never answers
            stopped.append(p)
        return p

    monkeypatch.setattr(runner, "popen_trial", stop_the_precursor)
    suite = Suite.model_validate(three(kill=False).model_dump() | {
        "datasets": [d.model_dump() for d in three(kill=False).datasets[:2]], "trial_stall_s": 1.0,
        "model_load_s": {"remote": 1.5, "shm": 1.5}})
    said: list[str] = []
    try:
        res = evaluate(ckpt, suite, _opts(tmp_path, "o"), progress=lambda msg, frac: said.append(msg))
    finally:
        for p in stopped:
            p.kill()
    assert stopped and stopped[0].returncode is not None  # its group was killed by the deadline, not left stopped
    hung = [m for m in said if m.startswith("precursor-n0 hung while copying the model into shared memory")]
    assert hung, said
    assert "(no progress in 15s" in hung[0] and "raise `trial_stall_s` in the suite file" in hung[0], hung[0]
    assert hung[0].endswith("node 0's trials load the model from storage themselves instead"), hung[0]
    assert res.failed == {} and set(res.scores) == {"heldout-loss", "heldout-cloze"}
    assert res.trials and all(t.load == "remote" and t.error is None for t in res.trials)
    assert res.precursor_s == [0.0] and list(tmp_path.glob("shm/*")) == []


def test_a_plugin_example_without_an_id_is_scored_and_a_trials_exception_is_in_the_log_it_names(ckpt, tmp_path):
    """Red team 41p S3: a plugin whose `example(i)` gave no `id` failed every plugin dataset with `KeyError: 'id'`,
    naming trial logs that were empty. `id` is optional (the index when absent), and a trial's exception is written,
    with its traceback, to the log its error names; the dataset that raises fails alone."""
    echo = {"dataset": "tests.evalplugin:Echo", "examples": 4, "mode": "gen", "infer_s_per_example": 0.01}
    suite = Suite.model_validate({"name": "ids", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        echo | {"name": "no-id", "options": {"no_id": True}}, echo | {"name": "with-id"},
        echo | {"name": "boom", "options": {"explode": True}}]})
    res = evaluate(ckpt, suite, _opts(tmp_path, "o"))
    assert set(res.scores) == {"no-id", "with-id"} and list(res.failed) == ["boom"], res.failed
    assert res.scores["no-id"] == pytest.approx(res.scores["with-id"])
    rows = [json.loads(line) for f in sorted((tmp_path / "o" / "predictions" / "no-id").glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["i"] for r in rows] == [0, 1, 2, 3]
    cause = res.failed["boom"]
    assert "RuntimeError: inference exploded" in cause, cause
    log = Path(re.search(r"its log: (\S+\.stderr)\)", cause)[1])
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: inference exploded" in text, text[-2000:]


def test_plugin_examples_whose_ids_are_not_json_or_repeat_fail_their_dataset_naming_the_id_and_the_fix(ckpt, tmp_path):
    """Red team 41q X8: a bytes or set `id` failed its dataset as `TypeError: Object of type set is not JSON
    serializable` (no word of the `id`), a NaN id was written as a bare `NaN` (not strict JSON), a repeated id passed
    in silence. Each now fails its own dataset, naming the plugin, the example and the fix; the others are scored."""
    echo = {"dataset": "tests.evalplugin:Echo", "examples": 4, "mode": "gen", "infer_s_per_example": 0.01}
    odd = ("bytes", "set", "nan", "same")
    suite = Suite.model_validate({"name": "ids", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        echo | {"name": "with-id"}, *(echo | {"name": f"id-{k}", "options": {"odd_id": k}} for k in odd)]})
    res = evaluate(ckpt, suite, _opts(tmp_path, "o"))
    assert set(res.scores) == {"with-id"} and sorted(res.failed) == sorted(f"id-{k}" for k in odd), res.failed
    for k, shown in (("bytes", "b'q0' (bytes)"), ("set", "{0} (set)"), ("nan", "nan (float)")):
        cause = res.failed[f"id-{k}"]
        assert f"tests.evalplugin:Echo: example 0 has the id {shown}" in cause, cause
        assert "must be a str or an int" in cause and "`str(...)`" in cause, cause
    cause = res.failed["id-same"]
    assert "examples 0 and 1 have the same id 'same'" in cause and "must be unique in its dataset" in cause, cause
    def not_json(constant: str) -> None:
        raise AssertionError(f"{constant} in a predictions file is not JSON")

    for f in (tmp_path / "o" / "predictions").rglob("*.jsonl"):  # what was written is strict JSON
        for line in f.read_text().splitlines():
            json.loads(line, parse_constant=not_json)


def test_overwrite_that_fails_on_a_full_disk_says_the_complete_earlier_result_was_kept(ckpt, tmp_path, capsys,
                                                                                      monkeypatch):
    """`frenzy evaluate --overwrite --json` over a complete result on a disk that fills: exit 2 naming the file and
    the fix, the earlier result.json intact, but the message did not say the earlier result was kept (only the
    failed-dataset path said so). Every failure path of --overwrite says it."""
    import errno

    from cli.main import main
    from tasks.evaluation import record

    (tmp_path / "s.yaml").write_text(json.dumps({"name": "s", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01}]}))
    out = tmp_path / "o"
    args = ["evaluate", ckpt, "--suite", str(tmp_path / "s.yaml"), "--history-dir", str(tmp_path / "h"), "--no-learn",
            "--out-dir", str(out), "--json"]
    assert main(args) == 0
    capsys.readouterr()
    before = (out / "result.json").read_bytes()

    def full(uri, suite, opts, *_a):
        raise OSError(errno.ENOSPC, "No space left on device", f"{opts.out_dir}/trials/trial-0001.json")

    monkeypatch.setattr(record, "evaluate", full)
    assert main([*args, "--overwrite"]) == 2
    msg = json.loads(capsys.readouterr().out)["error"]["message"]
    assert "no space left" in msg and "point --out-dir and --history-dir at another disk" in msg, msg
    assert f"{out} keeps its earlier complete results (heldout-loss scored): nothing of them was replaced" in msg, msg
    assert (out / "result.json").read_bytes() == before
    (tmp_path / "o2").mkdir()  # the control: with no earlier result, nothing is said to be kept
    assert main([*args[:-3], "--out-dir", str(tmp_path / "o2"), "--json", "--overwrite"]) == 2
    assert "keeps its earlier" not in json.loads(capsys.readouterr().out)["error"]["message"]


def test_a_read_only_history_names_the_option_and_a_recorded_step_is_returned_without_a_lock(ckpt, tmp_path, capsys,
                                                                                           monkeypatch):
    """A read-only history directory: "is on a read-only file system: give a writable location" named no option, and
    `--no-reevaluate` of a step whose complete scores are recorded there failed taking `.SUITE.lock` for writing
    instead of returning them (it writes nothing). The message names `--history-dir` (or `--out-dir`, where that is
    what was refused), and the recorded scores come back without a lock."""
    import errno

    from cli.main import main
    from tasks.evaluation import record

    (tmp_path / "s.yaml").write_text(json.dumps({"name": "s", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01}]}))
    hist = tmp_path / "h"
    args = ["evaluate", ckpt, "--suite", str(tmp_path / "s.yaml"), "--history-dir", str(hist), "--no-learn", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)

    def read_only(out, *_a, **_k):
        raise OSError(errno.EROFS, "Read-only file system", f"{out.parent}/.{out.name}.lock")

    monkeypatch.setattr(record, "sole_writer", read_only)
    assert main([*args, "--no-reevaluate"]) == 0  # recorded whole: read, no lock taken
    again = json.loads(capsys.readouterr().out)
    assert again["scores"] == first["scores"] and again["out_dir"] == first["out_dir"]
    assert main(args) == 2  # the control: evaluating again needs the lock, refused by the read-only file system
    msg = json.loads(capsys.readouterr().out)["error"]["message"]
    assert msg.endswith("is on a read-only file system: give a writable location with --history-dir"), msg
    out = tmp_path / "o"
    assert main([*args, "--out-dir", str(out), "--overwrite"]) == 2
    msg = json.loads(capsys.readouterr().out)["error"]["message"]
    assert msg.endswith("give a writable location with --out-dir"), msg
