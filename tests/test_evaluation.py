"""Evaluation end to end on checkpoints the trainer wrote: datasets, preloading, trials, CPU metrics, priors,
history, the flows on a Prefect test server and the CLI."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tasks.artifactkey import run_key, step_root
from tasks.evaluation import history
from tasks.evaluation.datasets import DatasetError, EvalContext, HumanEval, resolve
from tasks.evaluation.runner import EvalError, EvalOptions, evaluate
from tasks.evaluation.suite import ModelLoad, Suite
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tests import trainer_util as tu


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_trained):
    return tu.copy_trained(tiny_trained, tmp_path_factory.mktemp("evalckpt"))


def one_dataset(name: str = "small") -> Suite:
    """`small_suite`'s first dataset alone: for the tests of what surrounds an evaluation (claims, locks, the history,
    where results go), which one trial of one dataset shows as well as four (with `schedule="naive"`: one process
    start per evaluation, where the elastic schedule starts a precursor and then a trial)."""
    return Suite.model_validate({"name": name, "datasets": [
        {"name": "heldout-loss", "examples": 4, "mode": "ppl", "infer_s_per_example": 0.01}]})


def small_suite(**extra) -> Suite:
    return Suite.model_validate({"name": "small", "model_load_s": {"remote": 2.0, "shm": 2.0}, "datasets": [
        {"name": "heldout-loss", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "heldout-cloze", "examples": 6, "mode": "ppl", "infer_s_per_example": 0.01},
        {"name": "heldout-line", "examples": 3, "mode": "gen", "infer_s_per_example": 0.05},
        {"name": "humaneval", "examples": 5, "mode": "exec", "infer_s_per_example": 0.01, "metric_s_per_example": 0.1,
         "options": {"reference": True}}, *extra.get("more", [])]})


def test_humaneval_ships_offline_and_its_canonical_solutions_pass_in_the_sandbox():
    he = HumanEval({"examples": 12})
    assert len(HumanEval()) == 164
    scores = [he.score(he.example(i), {"text": he.example(i)["reference"]}) for i in range(12)]
    assert all(s["pass@1"] == 1.0 for s in scores)
    assert he.score(he.example(0), {"text": "    return None\n"})["pass@1"] == 0.0


def test_jsonl_and_module_plugins(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text('{"prompt": "2+2=", "answer": "4"}\n{"prompt": "3+3=", "answer": "6"}\n')
    d = resolve(str(f), "gen")
    assert len(d) == 2 and d.score(d.example(0), {"text": " 4"}) == {"exact_match": 1.0}
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(DatasetError, match="missing answer"):
        resolve(str(tmp_path / "bad.jsonl"), "gen")
    with pytest.raises(DatasetError, match="unknown dataset"):
        resolve("no-such-set", "gen")
    with pytest.raises(DatasetError, match="mode ppl"):
        resolve("heldout-loss", "gen", ctx=EvalContext())
    assert resolve("tests.evalplugin:Echo", "gen").name == "echo"


@pytest.mark.parametrize(("line", "says"), [("this line is not JSON", "qa.jsonl:2:1: not JSON"),
                                             ('{"prompt": "x"}', "qa.jsonl:2: a gen row needs prompt, answer"),
                                             ("[1, 2]", "qa.jsonl:2: a row is a JSON object")])
def test_a_suite_with_a_bad_jsonl_row_is_refused_when_loaded_before_anything_trains(tmp_path, line, says):
    from tasks.evaluation.suite import SuiteError, load_suite

    (tmp_path / "qa.jsonl").write_text(f'{{"prompt": "1+1=", "answer": "2"}}\n{line}\n')
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({"name": "s", "datasets": [
        {"name": "qa", "examples": 1, "mode": "gen", "infer_s_per_example": 0.1, "dataset": "qa.jsonl"}]}))
    with pytest.raises(SuiteError) as err:
        load_suite(tmp_path / "suite.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'suite.yaml'}: dataset 'qa': ") and says in str(err.value)


def test_elastic_and_naive_give_the_same_scores_and_clean_up(ckpt, tmp_path):
    # a remote load 8x a shared-memory one: the copy pays for itself (with the suite's 2 s / 2 s, four datasets on two
    # slots would run `direct`, from storage: tests/test_eval_schedule.py)
    suite = small_suite().model_copy(update={"model_load_s": ModelLoad(remote=4.0, shm=0.5)})
    priors = tmp_path / "priors.json"
    seen = []
    el = evaluate(ckpt, suite, EvalOptions(nodes=2, gpus_per_node=1, cpu_workers_per_node=1,
                                           out_dir=str(tmp_path / "el"), priors_path=str(priors),
                                           shm_root=str(tmp_path / "shm")), lambda m, f: seen.append(f))
    assert el.step == 20 and el.uri.endswith("step_00000020")
    assert el.scores["humaneval"]["pass@1"] == 1.0
    assert 0.0 <= el.scores["heldout-cloze"]["accuracy"] <= 1.0 and el.scores["heldout-loss"]["loss"] > 0
    assert len(el.precursor_s) == 2 and all(s > 0 for s in el.precursor_s)
    assert {t.load for t in el.trials} == {"shm"} and seen[-1] == 1.0
    assert list((tmp_path / "shm").iterdir()) == []  # shared-memory copies removed
    # each trial ran in a process started ahead (warm): its log is the trial's, no unused one is left running
    logs = sorted(p.name for p in (tmp_path / "el" / "trials").glob("*.stderr"))
    assert [n for n in logs if not n.startswith("metrics-")] == sorted(  # a metric process's log stays if not empty
        [f"trial-{t.id:04d}.stderr" for t in el.trials] + ["precursor-n0.stderr", "precursor-n1.stderr"])
    # every chunk's metric ran after its predictions landed (no barrier), on the CPU pool
    for t in el.trials:
        for c in t.chunks:
            assert c.metric_end_s >= c.landed_s
    learned = json.loads(priors.read_text())
    (key,) = learned
    assert set(learned[key]["datasets"]) == {d.name for d in suite.datasets}
    nv = evaluate(ckpt, suite, EvalOptions(schedule="naive", out_dir=str(tmp_path / "nv"), priors_path=str(priors)))
    for name, ms in el.scores.items():  # the same predictions whichever schedule ran them
        assert nv.scores[name] == pytest.approx(ms)
    assert {t.load for t in nv.trials} == {"remote"} and len(nv.trials) == 4
    assert set(nv.priors_used) == {d.name for d in suite.datasets}
    saved = json.loads((tmp_path / "nv" / "result.json").read_text())
    assert saved["scores"] == nv.scores


def test_a_failing_trial_fails_its_own_dataset_with_its_error_and_cleans_up(ckpt, tmp_path):
    """Issue 41 promise 3: the dataset whose trial raises is not scored (named with its error); the others are."""
    suite = small_suite(more=[{"name": "boom", "dataset": "tests.evalplugin:Echo", "examples": 2, "mode": "gen",
                               "infer_s_per_example": 0.01, "options": {"explode": True}}])
    res = evaluate(ckpt, suite, EvalOptions(out_dir=str(tmp_path / "o"), shm_root=str(tmp_path / "shm"),
                                            learn_priors=False, use_priors=False))  # the suite's: the copy pays
    assert res.ran == "elastic" and list(res.failed) == ["boom"] and "RuntimeError: inference exploded" in res.failed["boom"]
    assert set(res.scores) == {d.name for d in small_suite().datasets}
    assert list((tmp_path / "shm").iterdir()) == []
    alone = Suite.model_validate(suite.model_dump() | {"datasets": suite.datasets[-1:]})
    with pytest.raises(EvalError, match="scored no dataset: boom: .*inference exploded"):  # nothing scored: an error
        evaluate(ckpt, alone, EvalOptions(out_dir=str(tmp_path / "a"), shm_root=str(tmp_path / "shm"),
                                          learn_priors=False, schedule="naive"))  # one trial: no precursor


def test_a_trial_killed_by_sigkill_is_said_as_killed_with_its_likely_sender(ckpt, tmp_path):
    """Red team 41i N8: "trial-0000 exited with status -9: no output" was the whole cause of an evaluation that the
    OOM killer ended. A real trial process SIGKILLs itself while it infers: the error names SIGKILL and the OOM killer."""
    suite = small_suite(more=[{"name": "oom", "dataset": "tests.evalplugin:Echo", "examples": 2, "mode": "gen",
                               "infer_s_per_example": 0.01, "options": {"oom_killed": True}}])
    res = evaluate(ckpt, suite, EvalOptions(out_dir=str(tmp_path / "o"), shm_root=str(tmp_path / "shm"),
                                            learn_priors=False))
    assert "was killed (SIGKILL: most often the kernel's out-of-memory killer; see `dmesg`)" in res.failed["oom"]
    assert "status -9" not in res.failed["oom"]


def test_a_corrupt_checkpoint_is_refused(ckpt, tmp_path):
    import shutil

    root = Path(ckpt[len("file://"):])
    bad = tmp_path / "ckpt"
    shutil.copytree(root, bad)
    shard = sorted((bad / "step_00000020").glob("rank*.bin"))[0]
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(EvalError, match="sha256"):
        evaluate(f"file://{bad}", small_suite(), EvalOptions(out_dir=str(tmp_path / "o"), learn_priors=False))


@pytest.mark.slow  # the evaluation flows on a Prefect server (about 45 s)
def test_flows_publish_scores_history_and_evaluate_only_pending_steps(ckpt, tmp_path, prefect_server):
    import shutil

    from prefect.artifacts import Artifact

    from cluster.ledger import Ledger, RunRecord
    from flows.evaluate import EvaluateRequest, PendingRequest, evaluate_checkpoint, evaluate_pending
    from tasks.evaluation.pending import Target, missing, targets

    suite_file = tmp_path / "small.yaml"
    suite_file.write_text(json.dumps(small_suite().model_dump()))
    hist = str(tmp_path / "evals")
    s = evaluate_checkpoint(EvaluateRequest(uri=f"{ckpt}/step_00000010", suite=str(suite_file), history_dir=hist))
    assert s.step == 10 and Path(s.result).exists()
    assert history.pending(ckpt, hist, "small") == [f"{ckpt}/step_00000020"]
    # a second run whose newest checkpoint is corrupt (a flipped byte): it fails alone, the good root is still covered
    bad = tmp_path / "bad"
    shutil.copytree(ckpt.removeprefix("file://"), bad)
    shard = next((bad / "step_00000020").glob("*.bin"))
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    bad_hist = str(tmp_path / "bad-evals")
    ledger = str(tmp_path / "ledger.db")
    led = Ledger(ledger)
    led.record_run(RunRecord(job="t", stage="reported", checkpoint_root=ckpt, run_dir=str(tmp_path / "run"),
                             history_dir=hist, suite=str(suite_file)))
    led.record_run(RunRecord(job="b", stage="reported", checkpoint_root=f"file://{bad}", run_dir=str(tmp_path / "r2"),
                             history_dir=bad_hist, suite=str(suite_file)))
    led.note_checkpoints("gone", f"file://{tmp_path}/never-written", str(suite_file))  # an older ledger's note
    # another user's run of the same job name "t", whose newest manifest is torn (cut mid-write)
    torn, torn_hist = tmp_path / "torn", str(tmp_path / "torn-evals")
    shutil.copytree(ckpt.removeprefix("file://"), torn)
    (torn / "step_00000020" / "manifest.json").write_text((torn / "step_00000020" / "manifest.json").read_text()[:80])
    led.record_run(RunRecord(job="t", stage="reported", checkpoint_root=f"file://{torn}", run_dir=str(tmp_path / "r3"),
                             history_dir=torn_hist, suite=str(suite_file)))
    # no root named: every run's root with its own suite and history, and the one that does not exist is named
    got = targets(PendingRequest(ledger=ledger), tmp_path)
    assert got == sorted([Target(root=ckpt, suite=str(suite_file), history_dir=hist, job="t"),
                          Target(root=f"file://{bad}", suite=str(suite_file), history_dir=bad_hist, job="b"),
                          Target(root=f"file://{tmp_path}/never-written", suite=str(suite_file),
                                 history_dir=str(tmp_path / "evals"), job="gone"),
                          Target(root=f"file://{torn}", suite=str(suite_file), history_dir=torn_hist, job="t")],
                         key=lambda t: t.root)
    assert [missing(t) is not None for t in got] == [False, False, True, False]
    done = evaluate_pending(PendingRequest(ledger=ledger))
    assert sorted((d.result.startswith(hist), d.step) for d in done) == [(False, 10), (False, 10), (True, 20)]
    assert [e.step for e in history.read(torn_hist, s.run, "small")] == [10]  # both users' "t" covered
    assert history.pending(ckpt, hist, "small") == []  # the good root, in its own history directory
    assert [e.step for e in history.read(hist, s.run, "small")] == [10, 20]
    assert history.pending(f"file://{bad}", bad_hist, "small") == [f"file://{bad}/step_00000020"]  # named, not scored
    report = str(Artifact.get("evaluate-pending").data)
    assert "2 could not be evaluated" in report, report  # the corrupt step and the torn manifest
    # the root a job never wrote: missing, with its path, not skipped (red team 41r)
    assert "0 skipped, 1 missing" in report and f"| `file://{tmp_path}/never-written` | checkpoint root" in report
    assert "bad/step_00000020" in report and "sha256" in report
    assert f"{torn}/step_00000020/manifest.json" in report, report  # the torn manifest is named, not skipped
    good = [d for d in done if d.result.startswith(hist)]
    assert good[0].history_plot and Path(good[0].history_plot).stat().st_size > 1000
    art = Artifact.get(run_key("eval-small", s.run, step_root(s.uri)))  # keyed by the run (its root), not the name
    assert art is not None and "pass@1" in str(art.data)


def test_an_evaluation_directory_has_one_writer(tmp_path):
    import threading

    from tasks.evaluation.record import sole_writer

    order: list[str] = []
    held, release = threading.Event(), threading.Event()

    def first() -> None:
        with sole_writer(tmp_path / "out"):
            order.append("first in")
            held.set()
            release.wait()
            order.append("first out")

    def second() -> None:
        with sole_writer(tmp_path / "out"):
            order.append("second in")

    a = threading.Thread(target=first)
    a.start()
    held.wait()
    b = threading.Thread(target=second)
    b.start()
    b.join(timeout=1.0)  # bounded: without the lock, the second writer gets in at once
    release.set()
    a.join()
    b.join()
    assert order == ["first in", "first out", "second in"]


def test_a_step_scored_twice_at_once_is_evaluated_once(ckpt, tmp_path):
    """An in-flow evaluation and the commit-triggered deployment run on the same step: the second waits for the
    first and returns its scores (before: two writers, `humaneval: 32 of 16 examples scored`)."""
    from concurrent.futures import ThreadPoolExecutor

    from tasks.evaluation.record import evaluate_and_record

    hist = str(tmp_path / "evals")

    def one(_: int):
        return evaluate_and_record(f"{ckpt}/step_00000010", one_dataset(), EvalOptions(schedule="naive"), hist,
                                   reevaluate=False)[1]

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(one, range(2))
    assert a.scores == b.scores and a.step == b.step == 10
    assert len(history.read(hist, a.run, "small")) == 1
    assert len(history.history_file(hist, a.run).read_text().splitlines()) == 1  # one evaluation, not two


def test_cli_eval_plan_and_evaluate_json(ckpt, tmp_path, capsys):
    from cli.main import main

    assert main(["eval-plan", "--suite", "acme63", "--nodes", "4", "--gpus-per-node", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["naive_makespan_s"] > doc["elastic_makespan_s"] >= doc["lower_bound_s"] and doc["trials"]
    suite_file = tmp_path / "s.yaml"
    suite_file.write_text(json.dumps(small_suite().model_dump()))
    assert main(["evaluate", ckpt, "--suite", str(suite_file), "--out-dir", str(tmp_path / "o"), "--history-dir",
                 str(tmp_path / "h"), "--no-learn", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scores"]["humaneval"]["pass@1"] == 1.0 and doc["history_plot"]
    assert main(["evaluate", "file:///nonexistent/ckpt", "--json"]) == 2
    assert "no committed checkpoint" in capsys.readouterr().err


def test_history_plot_draws_a_metrics_standard_error_as_its_error_bars(tmp_path):
    from tasks.evaluation import history

    assert history._stderr_twin("frz_mc acc_stderr,none") == "frz_mc acc,none"
    assert history._stderr_twin("heldout ppl_stderr") == "heldout ppl"
    assert history._stderr_twin("frz_mc acc,none") is None
    for step, acc in ((1, 0.25), (2, 0.5)):  # a stderr without its metric stays a panel of its own
        history.append(tmp_path, "r", step, "u", "s", {"t": {"acc,none": acc, "acc_stderr,none": 0.05,
                                                             "f1_stderr,none": 0.1}})
    assert history.plot(tmp_path, "r", "s").stat().st_size > 1000


def test_a_warm_trial_process_exits_quietly_when_no_trial_comes():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "tasks.evaluation.trial", "--warm"], input="", capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout == ""


def test_an_early_precursor_process_makes_the_copy_and_an_unneeded_one_is_killed(ckpt, tmp_path):
    from tasks.evaluation import warmstart

    warmstart.start_precursor("cpu")  # as `frenzy evaluate` does before its imports
    early = warmstart._EARLY[0]
    early.log.write("early-log-marker\n")
    early.log.flush()
    # the suite's priors, not those earlier tests taught this machine: with them the plan may run `direct` (no copy)
    res = evaluate(ckpt, small_suite(), EvalOptions(out_dir=str(tmp_path / "o"), use_priors=False))
    assert res.ran == "elastic"
    assert early.proc.wait(timeout=120) == 0  # it ran node 0's copy (a retired one is killed)
    log = (tmp_path / "o" / "trials" / "precursor-n0.stderr").read_text()
    assert log.startswith("early-log-marker") and not early.log_path.exists()
    assert warmstart.take_precursor() is None and res.precursor_s[0] > 0 and res.scores["heldout-loss"]
    warmstart.start_precursor("cpu")  # one nobody takes (the evaluation failed before its copy)
    other = warmstart._EARLY[0]
    warmstart.discard_precursor()
    assert other.proc.wait(timeout=30) != 0 and not other.log_path.exists() and warmstart.take_precursor() is None


def test_an_early_trial_process_runs_the_first_trial_and_keeps_its_log(ckpt, tmp_path):
    from tasks.evaluation import warmstart

    warmstart.start_next("cpu")  # as the in-flow evaluator does while the evaluation before finishes
    precursor, trial = warmstart._EARLY[0], warmstart._TRIAL[0]
    trial.log.write("early-trial-marker\n")
    trial.log.flush()
    # the suite's priors, not those earlier tests taught this machine: with them the plan may run `direct` (no copy)
    res = evaluate(ckpt, small_suite(), EvalOptions(out_dir=str(tmp_path / "o"), use_priors=False))
    assert res.ran == "elastic"
    assert precursor.proc.wait(timeout=120) == 0 and trial.proc.wait(timeout=120) == 0  # both ran (retired: killed)
    assert warmstart.take_precursor() is None and warmstart.take_trial() is None
    first = min(res.trials, key=lambda t: t.id)
    log = (tmp_path / "o" / "trials" / f"trial-{first.id:04d}.stderr").read_text()
    assert log.startswith("early-trial-marker") and not trial.log_path.exists()
    assert first.error is None and res.scores["heldout-loss"] and not res.failed


def test_roots_that_share_a_run_name_and_a_history_are_each_pending_until_scored_at_their_own_uri(ckpt, tmp_path):
    src = ckpt.removeprefix("file://")
    a, b = tmp_path / "alice", tmp_path / "bob"
    shutil.copytree(src, a)
    shutil.copytree(src, b)  # the same run name in every manifest: two users' `exp`, or copies
    hist = tmp_path / "evals"
    run = ck.read_manifest(Storage(f"file://{a}"), 10).run
    history.append(hist, run, 10, f"file://{a}/step_00000010", "small", {"x": {"acc": 1.0}})
    assert history.pending(f"file://{a}", hist, "small") == [f"file://{a}/step_00000020"]
    assert history.pending(f"file://{b}", hist, "small") == [f"file://{b}/step_00000010", f"file://{b}/step_00000020"]
    # and evaluating Bob's step 10 does not hand back Alice's recorded score
    from tasks.evaluation.record import evaluate_and_record

    got = evaluate_and_record(f"file://{b}/step_00000010", one_dataset(), EvalOptions(schedule="naive"), str(hist),
                              reevaluate=False, overwrite=True)[1]
    assert got.uri == f"file://{b}/step_00000010" and got.scores != {"x": {"acc": 1.0}}
    assert history.pending(f"file://{b}", hist, "small") == [f"file://{b}/step_00000020"]


def test_the_history_plot_draws_one_line_per_root_where_two_roots_share_a_run_name(tmp_path):
    """Red team 41l: with two roots of one run name in one history, the plot drew one value per step (the newest
    root's), though the history keeps a line per step and root. Now: one line per root, labelled with its tag."""
    h = tmp_path / "evals"
    a, b = f"file://{tmp_path}/lena/a", f"file://{tmp_path}/lena/b"
    for root, losses in ((a, {20: 4.858, 40: 4.1}), (b, {20: 3.356, 40: 3.0})):
        for step, loss in losses.items():
            history.append(h, "dave-smoke", step, f"{root}/{ck.step_dir(step)}", "quick",
                           {"heldout-loss": {"loss": loss}, "heldout-cloze": {"acc": 0.5}})
    fig = history.figure(h, "dave-smoke", "quick")
    panel = next(ax for ax in fig.axes if ax.get_title() == "heldout-loss loss")
    labels = panel.get_legend_handles_labels()[1]  # the legend names both roots, each by its tag
    assert sorted(labels) == sorted(history.root_label(history.uri_key(r)) for r in (a, b))
    assert sorted(lb.split()[0] for lb in labels) == sorted(history.root_tag(r) for r in (a, b))
    lines = sorted((tuple(map(tuple, line.get_xydata())) for line in panel.get_lines()), key=lambda xy: xy[0][1])
    assert lines == [((20.0, 3.356), (40.0, 3.0)), ((20.0, 4.858), (40.0, 4.1))]
    assert history.plot(h, "dave-smoke", "quick") == h / "dave-smoke" / "history-quick.png"
    # one root: one line per panel and no legend, as before
    history.append(h, "solo", 20, f"{a}/{ck.step_dir(20)}", "quick", {"heldout-loss": {"loss": 4.0}})
    solo = history.figure(h, "solo", "quick")
    assert len(solo.axes[0].get_lines()) == 1 and solo.axes[0].get_legend() is None


def test_two_roots_with_one_run_name_keep_their_own_results_in_one_history(ckpt, tmp_path):
    """Red team 41l C3: two roots of one run name evaluated into one history directory (as evaluate-pending does,
    overwrite=True). Before: both wrote `<run>/step_N/<suite>`, the second replacing the first's result.json,
    predictions and trials, so a history line pointed at another root's files."""
    from tasks.evaluation.record import evaluate_and_record, recorded
    from tasks.evaluation.runner import EvalResult
    from tasks.pipeline.evaluations import scored

    src = ckpt.removeprefix("file://")
    roots = [tmp_path / "a", tmp_path / "b"]
    for r in roots:
        shutil.copytree(src, r)
    hist, suite, naive = str(tmp_path / "evals"), one_dataset(), EvalOptions(schedule="naive")
    got = [evaluate_and_record(f"file://{r}/step_00000010", suite, naive, hist, reevaluate=False,
                               overwrite=True)[1] for r in roots]
    assert got[0].result != got[1].result
    run = got[0].run
    lines = history.read(hist, run, "small")
    assert sorted(e.uri for e in lines) == [f"file://{r}/step_00000010" for r in roots]  # both lines kept
    for e in lines:  # each line's files are its own root's, still there after the other root's evaluation
        res = EvalResult.model_validate_json(history.result_file(hist, e).read_text())
        assert res.uri == e.uri and Path(res.out_dir, "predictions", "heldout-loss").is_dir()
    assert got[0].result == f"{hist}/{run}/step_00000010/small/result.json"  # one root: the layout it always had
    for r, g in zip(roots, got, strict=True):
        assert recorded(hist, run, 10, "small", f"file://{r}/step_00000010").result == g.result
        assert scored(hist, run, "small", str(r))[10].result == g.result
        assert history.pending(f"file://{r}", hist, "small") == [f"file://{r}/step_00000020"]
    again = evaluate_and_record(f"file://{roots[1]}/step_00000010", suite, naive, hist, overwrite=True)[1]
    assert again.result == got[1].result  # the second root's own place, not the first's


def test_a_second_root_evaluated_while_the_first_is_writing_goes_beside_it_at_once(ckpt, tmp_path):
    """Red team 41o S6: carol's root and hana's copy of it (one run name) evaluated at the same moment into one
    history with `frenzy evaluate` (refused at once when busy). Before: the second exited 2, "another frenzy evaluate
    is writing .../small right now"; the decision "another root's directory" was made only from finished results.
    Now the writer's lock names its root, so the second root goes to `small@TAG/` at once; the same root is still
    refused."""
    import threading

    from tasks.evaluation.record import evaluate_and_record
    from tasks.outdir import OutputError

    src = ckpt.removeprefix("file://")
    carol, hana = tmp_path / "carol", tmp_path / "hana"
    for r in (carol, hana):
        shutil.copytree(src, r)
    hist, suite = str(tmp_path / "evals"), one_dataset()
    writing, go_on, got = threading.Event(), threading.Event(), []

    def hold(_msg: str, _frac: float) -> None:  # carol's evaluation, inside its lock, waits for the checks below
        writing.set()
        go_on.wait()

    def first() -> None:
        try:
            got.append(evaluate_and_record(f"file://{carol}/step_00000010", suite, EvalOptions(), hist, hold)[1])
        finally:
            writing.set()

    th = threading.Thread(target=first)
    th.start()
    try:
        assert writing.wait(timeout=120) and th.is_alive(), got
        second = evaluate_and_record(f"file://{hana}/step_00000010", suite, EvalOptions(), hist)[1]
        assert Path(second.result).parent.name == f"small@{history.root_tag(str(hana))}" and not second.failed
        with pytest.raises(OutputError, match="right now"):  # the same root as the writer: refused, as before
            evaluate_and_record(f"file://{carol}/step_00000010", suite, EvalOptions(), hist)
    finally:
        go_on.set()
        th.join()
    assert got and Path(got[0].result).parent.name == "small" and not got[0].failed


def test_a_failed_evaluations_named_log_survives_another_roots_evaluation_of_the_same_step(ckpt, tmp_path):
    """Red team 41n C3: two copies of one run evaluated into one history (as evaluate-pending does), one with a corrupt
    shard. Its step's failure named its log at `<run>/step_N/<suite>.failed/trials/...`; the good copy's evaluation of
    that step then completed into `<run>/step_N/<suite>` and removed `<suite>.failed` with the log. A failed attempt
    now keeps its root's mark, and another root's evaluation goes beside it (`<suite>@<tag>`)."""
    import re

    from tasks.evaluation.record import evaluate_and_record

    src = ckpt.removeprefix("file://")
    bad, good = tmp_path / "corrupt", tmp_path / "good"
    for r in (bad, good):
        shutil.copytree(src, r)
    shard = next((bad / "step_00000010").glob("rank*.bin"))
    shard.write_bytes(b"\0" * 64 + shard.read_bytes()[64:])  # its sha256 no longer the manifest's
    hist, suite = str(tmp_path / "evals"), Suite.model_validate({"name": "small", "datasets": [
        {"name": "heldout-loss", "examples": 4, "mode": "ppl", "infer_s_per_example": 0.01}]})
    with pytest.raises(Exception, match="does not match the manifest") as failed:
        evaluate_and_record(f"file://{bad}/step_00000010", suite, EvalOptions(), hist, reevaluate=False,
                            overwrite=True)
    named = [Path(p) for p in re.findall(r"its log: (\S+?)\)", str(failed.value))]
    assert named and all(p.is_file() for p in named), str(failed.value)
    got = evaluate_and_record(f"file://{good}/step_00000010", suite, EvalOptions(), hist, reevaluate=False,
                              overwrite=True)[1]
    assert not got.failed and Path(got.result).is_file()
    assert all(p.is_file() for p in named), f"the failure's log is gone: {named}"
    assert Path(got.result).parent != named[0].parent.parent  # the good copy's results beside it, not over it


def test_evaluate_pending_over_two_roots_with_one_run_name_keeps_each_roots_results(ckpt, tmp_path, prefect_server):
    """Red team 41l C3 as it was found: `evaluate-pending` named two roots with one run name, default layout under
    one history directory; the second root's evaluation replaced the first's results directory."""
    from flows.evaluate import PendingRequest, evaluate_pending
    from tasks.evaluation.runner import EvalResult

    src = ckpt.removeprefix("file://")
    roots = [tmp_path / "a", tmp_path / "b"]
    for r in roots:
        shutil.copytree(src, r)
    (tmp_path / "one.yaml").write_text(json.dumps(one_dataset("one").model_dump()))
    req = PendingRequest(roots=[str(r) for r in roots], suite=str(tmp_path / "one.yaml"), schedule="naive",
                         history_dir=str(tmp_path / "evals"), ledger=str(tmp_path / "ledger.db"))
    done = evaluate_pending(req)
    assert sorted(d.uri for d in done) == sorted(f"file://{r}/step_000000{s}" for r in roots for s in (10, 20))
    assert len({d.result for d in done}) == 4
    for e in history.read(req.history_dir, done[0].run, "one"):  # every line's files are its own root's
        assert EvalResult.model_validate_json(history.result_file(req.history_dir, e).read_text()).uri == e.uri
    from prefect.artifacts import Artifact

    for d in done:  # each root's score-history artifact lists its own lines, one per step
        table = str(Artifact.get(run_key("eval-history-one", d.run, step_root(d.uri))).data).splitlines()
        assert [ln.split(" | ")[0] for ln in table if ln.startswith("| 1") or ln.startswith("| 2")] == ["| 10", "| 20"]
    assert evaluate_pending(req) == []  # each root's steps scored: nothing pending on the next pass


def test_a_history_line_of_the_old_layout_finds_its_results_only_while_they_are_its_own(tmp_path):
    hist = tmp_path / "evals"
    old = hist / "r" / "step_00000010" / "small"
    old.mkdir(parents=True)
    (old / "result.json").write_text('{"uri": "file:///x/a/step_00000010"}')
    history.append(hist, "r", 10, "file:///x/a/step_00000010", "small", {"d": {"m": 1.0}})
    history.append(hist, "r", 10, "file:///x/b/step_00000010", "small", {"d": {"m": 2.0}})
    a, b = history.read(hist, "r", "small")
    assert history.result_file(hist, a) == old / "result.json"
    assert history.result_file(hist, b) is None  # that directory holds root a's results, not b's


def test_a_root_is_one_place_however_it_is_spelled(tmp_path, monkeypatch):
    from tasks.paths import place_key

    monkeypatch.chdir(tmp_path)
    spellings = ["ck", "./ck/", f"{tmp_path}/ck", f"{tmp_path}/ck/", f"file://{tmp_path}/ck", f"file://{tmp_path}//ck/"]
    assert {place_key(s) for s in spellings} == {f"file://{tmp_path}/ck"}
    assert place_key("ck", tmp_path / "sub") == f"file://{tmp_path}/sub/ck"
    assert place_key("s3://b/x/") == "s3://b/x" != place_key("s3://b/y")
    assert place_key(f"{tmp_path}/ck2") != place_key(f"{tmp_path}/ck")


def test_a_step_scored_under_one_spelling_of_its_root_is_not_pending_under_another(ckpt, tmp_path):
    src = ckpt.removeprefix("file://")
    hist = tmp_path / "evals"
    run = ck.read_manifest(Storage(ckpt), 10).run
    history.append(hist, run, 10, f"{src}/step_00000010/", "small", {"x": {"acc": 1.0}})  # a plain path's score
    assert history.pending(ckpt, hist, "small") == [f"{ckpt}/step_00000020"]
    assert history.pending(f"{src}/", hist, "small") == [f"file://{src}/step_00000020"]
    from tasks.evaluation.record import recorded

    assert recorded(str(hist), run, 10, "small", f"{ckpt}/step_00000010") is not None


def test_evaluate_pending_on_a_named_root_uses_its_recorded_run_suite_and_history(ckpt, tmp_path):
    from cluster.ledger import Ledger, RunRecord
    from tasks.evaluation.pending import Target, targets
    from tasks.evaluation.request import PendingRequest

    src = ckpt.removeprefix("file://")
    ledger = str(tmp_path / "ledger.db")
    hist = str(tmp_path / "alice" / "evals")
    # submit recorded the run with its plain-path root (a job's `uri: ck`), its own suite and history
    Ledger(ledger).record_run(RunRecord(job="a-s10", stage="training", checkpoint_root=src, run_dir=str(tmp_path / "r"),
                                        history_dir=hist, suite="quick"))
    run = ck.read_manifest(Storage(ckpt), 10).run
    history.append(hist, run, 10, f"{ckpt}/step_00000010", "quick", {"x": {"acc": 1.0}})
    got = targets(PendingRequest(roots=[f"{ckpt}/"], ledger=ledger), tmp_path / "cwd")
    assert got == [Target(root=src, suite="quick", history_dir=hist, job="a-s10")]
    assert history.pending(got[0].root, got[0].history_dir, got[0].suite) == [f"file://{src}/step_00000020"]  # 10 done
    # what the request names wins; a root no run records takes the request's (core, evals under the base)
    got = targets(PendingRequest(roots=[ckpt, str(tmp_path / "other")], ledger=ledger, suite="core"), tmp_path)
    assert [(t.suite, t.history_dir) for t in got] == [("core", hist), ("core", str(tmp_path / "evals"))]


def test_a_step_retention_removed_is_named_as_retention_and_is_not_a_failure_of_the_run(tmp_path):
    """Red team 41e S14: an evaluation of a step that keep=3 had removed failed with `no manifest.json` and counted
    as a failure of the run. Now it names retention and the setting, and nothing counts it as a failure."""
    from tasks.evaluation.engine import resolve_manifest
    from tasks.pipeline.evaluations import InFlowEvaluator, retired_steps

    root = f"file://{tmp_path}/ckpt"
    tu.run(tu.tiny_job(root, steps=30, every=10), tmp_path / "r")  # keep 3: steps 10, 20, 30
    st = Storage(root)
    said: list[str] = []

    def evaluate(uri: str):  # retention runs (the trainer's next commit) while the evaluator works through the list
        ck.apply_retention(st, 1)
        raise ck.CheckpointError(f"{uri}: the evaluation failed" if uri.endswith("30") else f"{uri}: no manifest.json")

    ev = InFlowEvaluator(root, str(tmp_path / "evals"), "t", "small", evaluate, said.append)
    ev.catch_up()
    assert sorted(ev.retired) == [10, 20] and [f.step for f in ev.failures()] == [30], said  # 30 failed for real
    assert "removed by retention" in said[0] and "not a failure" in said[0], said
    assert [m.step for m in ck.committed(st)] == [30]
    with pytest.raises(ck.RetiredCheckpoint) as err:
        resolve_manifest(f"{root}/step_00000010")
    msg = str(err.value)
    assert "removed by retention, by design" in msg and "training.checkpoint.keep = 3" in msg and "[30]" in msg, msg
    with pytest.raises(ck.CheckpointError) as err:  # a step newer than every commit is not retention's
        resolve_manifest(f"{root}/step_00000040")
    assert "removed by retention" not in str(err.value) and "no manifest.json" in str(err.value)
    # submit's wait: the removed, unscored steps are left out with why; a scored or kept one stays
    gone = retired_steps(root, [10, 20, 30], {20})
    assert [g.step for g in gone] == [10] and "removed by retention" in gone[0].why


_HOLDER = """
import sys
from tasks.evaluation.claim import claimed
with claimed(sys.argv[1], sys.argv[2], "small", "holder test") as h:
    print("held" if h is None else "not held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def _holder(hist: str, uri: str):
    import os
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", _HOLDER, hist, uri], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert p.stdout.readline().strip() == "held"  # the claim is made: an event, not a wait
    return p


def test_a_step_claimed_by_a_live_run_is_skipped_and_a_dead_or_stale_claim_is_taken_over(tmp_path):
    import os
    import signal

    from tasks.evaluation.claim import Claim, claim_path, claimed

    hist, uri = str(tmp_path / "evals"), "file:///data/ck/step_00000010"
    p = _holder(hist, uri)
    with claimed(hist, uri, "small", "second") as holder:  # a live process on this host holds it
        assert holder is not None and holder.pid == p.pid and "holder test" in holder.describe(holder.since)
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "released" and p.wait(60) == 0
    assert not (tmp_path / "evals" / ".claims").exists()  # released: no claim, no directory left
    p = _holder(hist, uri)
    os.kill(p.pid, signal.SIGKILL)  # the holder dies mid-evaluation: its claim is taken over at once
    p.wait(60)
    assert claim_path(hist, uri, "small").exists()
    with claimed(hist, uri, "small", "second") as holder:
        assert holder is None and Claim.model_validate_json(claim_path(hist, uri, "small").read_text()).pid == os.getpid()
    # a holder on another host cannot be checked: its claim is taken over once older than the (injected) timeout
    path = claim_path(hist, uri, "small")
    path.parent.mkdir(parents=True)
    path.write_text(Claim(pid=1, host="elsewhere", since=1000.0, by="far").model_dump_json())
    with claimed(hist, uri, "small", "second", stale_s=60, now=lambda: 1030.0) as holder:
        assert holder is not None and holder.host == "elsewhere"
    with claimed(hist, uri, "small", "second", stale_s=60, now=lambda: 1061.0) as holder:
        assert holder is None
    with pytest.raises(RuntimeError), claimed(hist, uri, "small", "second") as holder:  # released on failure
        assert holder is None
        raise RuntimeError("the evaluation failed")
    assert not path.exists() and not path.parent.exists()


def test_evaluate_pending_skips_a_step_another_run_is_evaluating_and_leaves_no_lock_files(ckpt, tmp_path,
                                                                                        prefect_server):
    """Red team 41e S12: two evaluate-pending runs at once evaluated every step twice and left
    `.history-small.png.lock` in the history directory."""
    from prefect.artifacts import Artifact

    from flows.evaluate import PendingRequest, evaluate_pending

    suite_file = tmp_path / "small.yaml"
    suite_file.write_text(json.dumps(one_dataset().model_dump()))
    hist = str(tmp_path / "evals")
    req = PendingRequest(roots=[ckpt], suite=str(suite_file), history_dir=hist, ledger=str(tmp_path / "ledger.db"),
                         schedule="naive")
    p = _holder(hist, f"{ckpt}/step_00000010")  # the other run is evaluating step 10 right now
    try:
        done = evaluate_pending(req)
    finally:
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait(60)
    assert [d.step for d in done] == [20]
    report = str(Artifact.get("evaluate-pending").data)
    assert "1 evaluated, 0 could not be evaluated, 1 skipped" in report, report
    assert f"pid {p.pid}" in report and "step_00000010" in report
    # the holder is gone: the next pass evaluates it; a root deleted by hand is a row of the artifact (red team 41f
    # S17), counted and listed as missing, not as skipped (red team 41r): test_a_root_that_no_longer_exists_...
    done = evaluate_pending(req.model_copy(update={"roots": [ckpt, str(tmp_path / "gone")]}))
    assert [d.step for d in done] == [10]
    report = str(Artifact.get("evaluate-pending").data)
    assert "1 evaluated, 0 could not be evaluated, 0 skipped, 1 missing" in report, report
    assert f"| missing: checkpoint root | why |\n|---|---|\n| `{tmp_path}/gone` | checkpoint root" in report, report
    assert len(history.history_file(hist, done[0].run).read_text().splitlines()) == 2  # one line per step
    left = sorted(str(f.relative_to(hist)) for f in Path(hist).rglob("*") if f.name.startswith("."))
    assert left == [], left  # no `.history-small.png.lock`, no `.claims`


def test_one_step_that_cannot_start_does_not_end_the_evaluate_pending_pass(ckpt, tmp_path, prefect_server):
    """Red team 41g S23: one server error starting one step's evaluation ended the whole pass (the steps after it
    never tried, no artifact). Here the step's claim cannot be taken (a directory where its claim file goes)."""
    from prefect.artifacts import Artifact

    from flows.evaluate import PendingRequest, evaluate_pending
    from tasks.evaluation.claim import claim_path

    suite_file = tmp_path / "small.yaml"
    suite_file.write_text(json.dumps(one_dataset().model_dump()))
    hist = str(tmp_path / "evals")
    claim_path(hist, f"{ckpt}/step_00000010", one_dataset().name).mkdir(parents=True)
    done = evaluate_pending(PendingRequest(roots=[ckpt], suite=str(suite_file), history_dir=hist,
                                           ledger=str(tmp_path / "ledger.db"), schedule="naive"))
    assert [d.step for d in done] == [20]
    report = str(Artifact.get("evaluate-pending").data)
    assert "1 evaluated, 1 could not be evaluated, 0 skipped" in report, report
    assert "step_00000010` | IsADirectoryError" in report


def test_a_completed_evaluation_whose_state_lost_its_data_is_read_from_the_history_not_failed(tmp_path):
    """Red team 41h R4: a 503 during an evaluate-pending pass: the child run of step 15 Completed and scored, but its
    state came back from the API without data and the pass logged "could not run: State data is missing"."""
    import torch
    from prefect.states import Completed

    from flows.evaluate import completed_summary
    from tasks.evaluation import history
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    st = Storage(f"file://{tmp_path}/ck")
    c = ck.AsyncCheckpointer(st, 0, 1, run="r4", keep=5)
    c.save(15, [("model.w", torch.zeros(4))], {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {},
                                               "fingerprint": {}})
    c.close()
    uri, hist = st.url(ck.step_dir(15)), str(tmp_path / "evals")
    with pytest.raises(RuntimeError, match="Completed, but its state came back from the API without its result"):
        completed_summary(Completed(), hist, "tiny", uri)  # no score in the history: said as what it is
    history.append(hist, "r4", 15, uri, "tiny", {"heldout-loss": {"loss": 2.5}})
    got = completed_summary(Completed(), hist, "tiny", uri)  # a state with no data, as one read from the API
    assert (got.run, got.step, got.suite, got.scores) == ("r4", 15, "tiny", {"heldout-loss": {"loss": 2.5}})


def test_evaluate_pending_with_nothing_to_cover_names_the_ledger_and_why(tmp_path):
    """Red team 41i N7/N19: "the ledger knows no submitted job yet" named no ledger, and was said of a ledger whose
    runs were all submitted with evaluation off. Now: the ledger read, and which of the two it is."""
    from cluster.ledger import Ledger, RunRecord
    from tasks.evaluation.pending import no_roots, targets
    from tasks.evaluation.request import PendingRequest

    req = PendingRequest(ledger=str(tmp_path / "l.db"))
    led = Ledger(str(tmp_path / "l.db"))
    assert targets(req, tmp_path) == []
    said = no_roots(req, tmp_path)
    assert f"the ledger sqlite:///{tmp_path}/l.db records no submitted job" in said
    led.record_run(RunRecord(job="offjob", stage="reported", checkpoint_root=f"file://{tmp_path}/ck",
                             run_dir=str(tmp_path / "run"), history_dir=str(tmp_path / "evals")))
    assert targets(req, tmp_path) == []  # evaluation was off: nothing to cover, and it says so
    said = no_roots(req, tmp_path)
    assert f"the ledger sqlite:///{tmp_path}/l.db records 1 run(s), none with an evaluation suite" in said
    assert "evaluation off: offjob" in said and "give `suite` in the request" in said and "no submitted job" not in said


def test_the_evaluate_pending_counts_add_up_to_the_checkpoints():
    """Red team 41q Y1: two checkpoints, each scored but for one dataset, were headed "2 evaluated, 2 failed"."""
    from flows.evaluate import pending_counts
    from tasks.evaluation.summary import EvalSummary

    def step(n: int, failed: dict[str, str]) -> EvalSummary:
        return EvalSummary(uri=f"/c/step_{n}", run="r", step=n, suite="s", scores={}, makespan_s=1.0,
                           predicted_makespan_s=1.0, result="", history_plot=None, failed=failed)

    partial = [step(10, {"hangs": "no progress"}), step(20, {"hangs": "no progress"})]
    failed = [(d.uri, "; ".join(d.failed_lines())) for d in partial]
    assert pending_counts(partial, failed, []) == (
        "2 evaluated (2 with failed datasets), 0 could not be evaluated, 0 skipped, 0 missing")
    whole = [*failed, ("/c/step_30", "EvalError: ...")]
    assert pending_counts([*partial, step(40, {})], whole, [("/c/step_50", "being evaluated")]) == (
        "3 evaluated (2 with failed datasets), 1 could not be evaluated, 1 skipped, 0 missing")


def test_an_evaluation_whose_progress_reports_cannot_be_made_is_scored(ckpt, tmp_path, capsys):
    """Red team 41q B3: the Prefect API refused the progress artifact's update while a worker's evaluation ran, and
    the whole step failed (`[Errno 111] Connection refused`), its work discarded. A report is not the evaluation."""
    calls: list[str] = []

    def api_gone(msg: str, frac: float) -> None:
        calls.append(msg)
        raise ConnectionRefusedError(111, "Connection refused")

    res = evaluate(ckpt, one_dataset(), EvalOptions(schedule="naive", out_dir=str(tmp_path / "o")), progress=api_gone)
    assert set(res.scores) == {"heldout-loss"} and res.failed == {}, res.failed
    assert len(calls) > 1  # tried at each report, not given up after the first
    err = capsys.readouterr().err
    assert err.count("evaluation progress could not be reported") == 1, err
    assert "ConnectionRefusedError: [Errno 111] Connection refused" in err and "the evaluation goes on" in err, err


_STOPS_IN_ITS_LOCK = """
import os, signal, sys
from tasks.evaluation.record import evaluate_and_record
from tasks.evaluation.runner import EvalOptions
from tasks.evaluation.suite import Suite
suite = Suite.model_validate_json(sys.argv[3])
def stop_here():  # inside the step's lock, its evaluation complete, just before it publishes: stopped as by `kill -STOP`
    os.kill(os.getpid(), signal.SIGSTOP)
    return None
evaluate_and_record(sys.argv[2], suite, EvalOptions(schedule="naive"), sys.argv[1], reevaluate=False, fence=stop_here)
print("published", flush=True)
"""


def test_an_evaluation_stopped_in_its_lock_is_taken_over_after_the_stale_time_and_publishes_nothing_when_continued(
        ckpt, tmp_path, capfd, monkeypatch):
    """Red team 41r: an evaluation process SIGSTOPped and never continued kept the step's lock, and the evaluation
    run made again waited on it for the whole eval_timeout_s. The holder renews its lock's time from a thread (a
    stopped process renews nothing); a waiter takes over a lock not renewed for FRENZY_EVAL_LOCK_STALE_S and says so,
    and the old holder, continued, finds its lock taken and publishes nothing. Real processes and a real SIGSTOP."""
    import concurrent.futures
    import os
    import signal
    import subprocess
    import sys
    import time

    from tasks.evaluation.record import evaluate_and_record, results_dir
    from tasks.outdir import lock_path

    monkeypatch.setenv("FRENZY_EVAL_LOCK_STALE_S", "3")
    hist, uri = str(tmp_path / "evals"), f"{ckpt}/step_00000010"
    run = ck.read_manifest(Storage(ckpt), 10).run
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    holder = subprocess.Popen([sys.executable, "-c", _STOPS_IN_ITS_LOCK, hist, uri, one_dataset().model_dump_json()],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()[1][-3000:]
            time.sleep(0.1)  # a poll of another process's state
        out = results_dir(hist, run, 10, "small", ckpt)
        assert f"pid {holder.pid}" in lock_path(out).read_text()  # stopped holding the step's lock
        pool, t0 = concurrent.futures.ThreadPoolExecutor(1), time.monotonic()
        taker = pool.submit(evaluate_and_record, uri, one_dataset(), EvalOptions(schedule="naive"), hist,
                            reevaluate=False)
        try:  # on main the taker waited for as long as the holder stayed stopped (here: 240 s, then it is killed)
            got = taker.result(timeout=240)[1]
        finally:
            if not taker.done():
                holder.kill()  # its lock goes with it: the taker's thread ends, and the pool with it
            pool.shutdown(wait=True)
        waited = time.monotonic() - t0
        said = capfd.readouterr().err
        assert f"frenzy evaluate (pid {holder.pid} on " in said and "with no heartbeat for" in said, said
        assert "taking its lock over; should it continue, it publishes nothing of its attempt" in said, said
        assert got.scores and [e.step for e in history.read(hist, run, "small")] == [10], waited
        holder.send_signal(signal.SIGCONT)
        _, err = holder.communicate(timeout=120)
        assert holder.returncode != 0 and "Fenced" in err and f"its lock {lock_path(out)} is no longer this process's" in err, err
        assert "not publishing this evaluation" in err, err[-3000:]
        assert [e.step for e in history.read(hist, run, "small")] == [10]  # one line: the taker's
        assert json.loads((out / "result.json").read_text())["scores"] == got.scores
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_an_evaluation_whose_run_ended_while_it_was_stopped_publishes_nothing_and_the_rerun_publishes(ckpt, tmp_path):
    """Issue 41: an evaluation process SIGSTOPped on a worker is marked Crashed by the waiting submit (no heartbeat for
    90 s) and its step run again; continued (SIGCONT), it wrote its result as well. Its run's state is now read just
    before the publish: a run that ended there publishes nothing (no history line, no results directory), and the
    run made again scores the step as if the first had never run."""
    from tasks.evaluation.record import Fenced, evaluate_and_record
    from tasks.pipeline.liveness import fenced

    hist, uri = str(tmp_path / "evals"), f"{ckpt}/step_00000010"
    run = ck.read_manifest(Storage(ckpt), 10).run
    asked: list[str] = []

    def crashed() -> str | None:
        asked.append("CRASHED")
        return fenced("CRASHED", "stopped-run")

    with pytest.raises(Fenced, match="its run stopped-run is Crashed on the server") as err:
        evaluate_and_record(uri, one_dataset(), EvalOptions(schedule="naive"), hist, reevaluate=False, fence=crashed)
    assert asked == ["CRASHED"] and "nothing of this attempt is written" in str(err.value)
    assert history.read(hist, run, "small") == [] and not (tmp_path / "evals" / run / "step_00000010" / "small").exists()
    got = evaluate_and_record(uri, one_dataset(), EvalOptions(schedule="naive"), hist, reevaluate=False,
                              fence=lambda: fenced("RUNNING", "rerun"))[1]
    assert got.scores and [e.step for e in history.read(hist, run, "small")] == [10]
    assert (tmp_path / "evals" / run / "step_00000010" / "small" / "result.json").exists()


def test_elastic_asked_on_a_suite_too_small_for_a_model_copy_runs_direct_and_stops_the_copy(ckpt, tmp_path):
    said: list[str] = []
    res = evaluate(ckpt, one_dataset(), EvalOptions(out_dir=str(tmp_path / "o"), shm_root=str(tmp_path / "shm"),
                                                    learn_priors=False, use_priors=False),
                   progress=lambda msg, frac: said.append(msg))
    assert res.schedule == "elastic" and res.ran == "direct", said
    assert any(m.startswith("elastic asked for, direct planned") for m in said), said
    assert res.failed == {} and res.scores["heldout-loss"]["loss"] > 0
    assert [t.load for t in res.trials] == ["remote"] and res.precursor_s == []
    assert [t.metrics_on for t in res.trials] == ["cpu"]
    assert list((tmp_path / "shm").glob("*")) == []  # the copy started ahead of planning was stopped and removed
    assert json.loads((tmp_path / "o" / "result.json").read_text())["ran"] == "direct"


def test_an_attempt_that_fails_because_its_lock_was_taken_over_says_it_publishes_nothing(ckpt, tmp_path, monkeypatch):
    """Red team 41s, scenario 18: a `frenzy evaluate` stopped past its lock's stale time, continued after a waiter took
    the lock over and swept its temporary results, failed on a file of its own that was gone (`...precursor-n0.stderr:
    no such file or directory: check the path`). Any failure of an attempt whose lock was taken is that takeover's:
    it says it publishes nothing. Without a takeover the error is the error."""
    from tasks.evaluation import record
    from tasks.evaluation.record import Fenced, evaluate_and_record

    def swept(uri, suite, opts, *a, **k):
        raise FileNotFoundError(2, "No such file or directory", f"{opts.out_dir}/trials/precursor-n0.stderr")

    monkeypatch.setattr(record, "evaluate", swept)
    hist, uri = str(tmp_path / "evals"), f"{ckpt}/step_00000010"
    with pytest.raises(Fenced, match="not publishing this evaluation: taken by pid 1"):
        evaluate_and_record(uri, one_dataset(), EvalOptions(schedule="naive"), hist,
                            fence=lambda: "not publishing this evaluation: taken by pid 1")
    with pytest.raises(Exception, match="precursor-n0.stderr") as err:
        evaluate_and_record(uri, one_dataset(), EvalOptions(schedule="naive"), hist, fence=lambda: None)
    assert not isinstance(err.value, Fenced)
