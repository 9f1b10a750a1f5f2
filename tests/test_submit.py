"""The `submit` pipeline flow on a real Prefect test server: one job from plan to report with its GPUs given back,
bad input that stops before anything is allocated, cancellation, a killed run that a re-run resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cluster.ledger import CheckpointRoot, Ledger
from tasks.artifactkey import run_key
from tasks.evaluation import history
from tasks.jobspec import parse_job
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage

SUITE = str(Path(__file__).parent / "data" / "suites" / "one.yaml")
"""The pipeline tests' suite: one dataset on 8 examples (the quick suite's HumanEval costs seconds per checkpoint)."""


def _job(tmp: Path, name: str = "sub", steps: int = 40, every: int = 20, **training: object) -> dict:
    """A gpt-tiny job. Untraced unless `trace_every_steps` is given: with no op trace a run has no straggler analysis
    (its task costs 1-3 s per submit: pandas, the trace, the simulator), which the whole-pipeline test checks."""
    t = {"seq_len": 64, "global_batch": 8, "precision": "fp32", "steps": steps, "lr": 3e-3, "warmup_steps": 5,
         "log_every_steps": 5, "trace_every_steps": 0,
         "checkpoint": {"every_steps": every, "uri": f"file://{tmp}/ckpt", "keep": 5}, **training}
    return {"name": name, "model": {"preset": "gpt-tiny"}, "training": t, "evaluation": {"suite": SUITE}}


def _request(tmp: Path, **job_kw: object):
    from flows.submit import SubmitRequest

    return SubmitRequest(job=parse_job(_job(tmp, **job_kw)), cluster="local", ledger=str(tmp / "ledger.db"),
                         evaluation="in-flow", device="cpu", run_dir=str(tmp / "run"), history_dir=str(tmp / "evals"))


def test_submit_runs_the_whole_pipeline_and_gives_the_gpus_back(prefect_server, tmp_path, monkeypatch):
    from prefect.artifacts import Artifact

    import flows.train
    from flows.submit import submit

    def traced(**job_kw: object):  # this test checks the straggler analysis, which needs an op trace (`_job`)
        return _request(tmp_path, trace_every_steps=10, **job_kw)

    announced: list[dict] = []
    monkeypatch.setattr(flows.train, "checkpoint_event", lambda rec, *a: announced.append(rec))
    res = submit(traced())
    # evaluated in-flow: no commit event, which would have the evaluate-on-checkpoint deployment score them again
    assert announced == []
    # the scheduled evaluate-pending finds this job's checkpoints through the ledger
    noted = CheckpointRoot(root=f"file://{tmp_path}/ckpt", suite=SUITE, job="sub")
    assert Ledger(str(tmp_path / "ledger.db")).checkpoint_roots() == {noted.root: noted}
    doc = res.model_dump(mode="json")
    for key in ("plan", "allocation", "train", "evaluations", "stragglers", "report", "released"):
        assert key in doc, key
    assert res.plan.gpu_type == "cpu" and res.allocation.nodes[0].gpu_type == "cpu"
    assert [c.step for c in res.train.checkpoints] == [20, 40]
    # every committed checkpoint was evaluated, the last one included, and the scores are real numbers
    assert [e.step for e in res.evaluations] == [20, 40]
    assert all(0 < e.scores["heldout-loss"]["loss"] < 6 for e in res.evaluations)
    assert res.stragglers is not None and res.stragglers.slowdown >= 1.0
    from cli.submit import _human
    from tasks.report import NO_STRAGGLER_S

    said = _human(res, 1.0)  # what `frenzy submit` / `frenzy demo` print: the report's straggler words
    assert ("no worker held the others up" in said) == (res.stragglers.slowdown < NO_STRAGGLER_S)
    assert ("worst op type" in said) == (res.stragglers.slowdown >= NO_STRAGGLER_S)
    assert res.released and Ledger(str(tmp_path / "ledger.db")).allocations() == []
    html = Path(res.report).read_text()
    assert html.count("data:image/png;base64,") >= 3  # loss curve, scores by step, straggler heatmap
    assert "chosen" in html and "heldout-loss loss" in html
    root = f"file://{tmp_path}/ckpt"  # artifacts are keyed by the run: job name and checkpoint root
    assert Artifact.get(run_key("report", "sub", root)) is not None and Artifact.get(run_key("plans", "sub", root)) is not None

    # a re-run of the same job resumes from the newest verified checkpoint instead of starting over
    again = submit(traced(steps=60))
    assert again.train.resumed_from_step == 40 and again.train.final_step == 60
    assert [e.step for e in again.evaluations] == [20, 40, 60]  # the report shows the whole run
    assert len((tmp_path / "evals" / "sub" / "history.jsonl").read_text().splitlines()) == 3  # 20, 40 not redone

    # the ledger records where the run's files are (what a later submit of the finished job reports from: that
    # decision, the history's scores and the fewer-steps note are test_pipeline's; the flow's early return is the
    # evaluation-off test's third submit; a rerun that trains nothing reports the earlier training: test_pipeline's
    # Earlier test, and the evaluation-off test's second submit through the real trainer)
    rec = Ledger(str(tmp_path / "ledger.db")).run("sub")
    assert rec.stage == "reported" and rec.report == again.report and rec.history_dir == str(tmp_path / "evals")


def test_an_infeasible_job_fails_at_plan_and_allocates_nothing(prefect_server, tmp_path):
    from flows.submit import SubmitRequest, submit
    from tasks.planning.plans import InfeasibleJobError

    job = parse_job({"name": "huge", "model": {"preset": "llama3-70b"}, "training": {"global_batch": 8}})
    with pytest.raises(InfeasibleJobError, match="needs .* GiB per GPU"):
        submit(SubmitRequest(job=job, ledger=str(tmp_path / "l.db"), run_dir=str(tmp_path / "run")))
    led = Ledger(str(tmp_path / "l.db"))
    assert led.allocations() == [] and led.queue() == []


def test_an_unknown_suite_or_cluster_fails_before_anything_starts(prefect_server, tmp_path, monkeypatch):
    import logging

    import flows.submit
    from cluster.inventory import InventoryError
    from flows.submit import start, submit
    from tasks.evaluation.suite import SuiteError

    req = _request(tmp_path)
    # whole flow runs: a suite the run's start refuses, and a cluster the flow cannot load
    with pytest.raises(SuiteError, match="neither a built-in suite .*core.*quick"):
        submit(req.model_copy(update={"suite": "nope"}))
    with pytest.raises(InventoryError, match="phoebe"):
        submit(req.model_copy(update={"cluster": "nope"}))
    # what else the run's start (the flow's first step, flows/submit.start) refuses, called as the flow calls it
    # (a plain logger for the run's, which exists only in a flow run):
    monkeypatch.setattr(flows.submit, "get_run_logger", lambda: logging.getLogger("frenzy.test.start"))
    # evaluated in this process (in-flow), a dataset plugin it cannot import would fail only after training
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "datasets": [
        {"name": "qa", "examples": 2, "mode": "gen", "infer_s_per_example": 0.1, "dataset": "no_such_pkg_x:make"}]}))
    with pytest.raises(SuiteError, match="plugin no_such_pkg_x:make: no module 'no_such_pkg_x' here"):
        start(req.model_copy(update={"suite": str(tmp_path / "s.yaml")}))
    # a dataset that names a directory (where its .jsonl files were meant) fails every evaluation, on any worker:
    # refused before training, also when workers evaluate (deployment), naming the suite, the dataset and the fix
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({"name": "d", "datasets": [
        {"name": "qa", "examples": 1, "mode": "gen", "infer_s_per_example": 0.1, "dataset": "data"}]}))
    for mode in ("in-flow", "deployment"):
        with pytest.raises(SuiteError, match=r"d.yaml: dataset 'qa': data is a directory .*`dataset: data/a.jsonl`"):
            start(req.model_copy(update={"suite": str(tmp_path / "d.yaml"), "evaluation": mode}))
    assert not (tmp_path / "run").exists() and not (tmp_path / "ledger.db").exists()


def test_dataset_problems_are_what_evaluation_would_refuse(tmp_path):
    from tasks.evaluation.datasets import DatasetError, dataset_problems, resolve
    from tasks.evaluation.suite import Suite

    (tmp_path / "notes.txt").write_text("x")
    entries = {"ok": "heldout-loss", "file": "notes.txt", "typo": "heldout-los", "jl": "a.jsonl", "dir": "."}
    suite = Suite.model_validate({"name": "s", "datasets": [
        {"name": n, "examples": 1, "mode": "ppl", "infer_s_per_example": 0.1, "dataset": src}
        for n, src in entries.items()]})
    got = {p.text.split("'")[1]: p.everywhere for p in dataset_problems(suite, tmp_path)}
    assert got == {"file": True, "typo": False, "dir": True}  # a name a worker's plugin may have is only "here"
    for name in got:  # each is what resolve() refuses
        with pytest.raises(DatasetError):
            resolve(str(tmp_path / entries[name]) if name != "typo" else entries[name], "ppl")


def test_a_job_no_node_can_ever_hold_fails_at_once_instead_of_waiting(tmp_path):
    from cluster.inventory import load_cluster
    from flows.place import placed
    from tasks.planning.plans import plan_resources

    led = Ledger(str(tmp_path / "l.db"))
    led.sync(load_cluster("local"))
    plans = plan_resources(parse_job({"name": "p", "model": {"preset": "gpt2-124m"}, "training": {"global_batch": 16}}),
                           load_cluster("phoebe"))
    big = [p for p in plans if p.gpu_type == "A100-40GB-SXM"] or plans
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="even when every GPU is free"), placed("p", big, ledger_url=str(tmp_path / "l.db")):
        pass
    assert time.monotonic() - t0 < 10 and led.queue() == []


def _cli(args: list[str], cwd: Path, server: bool = True, **env_vars: str) -> subprocess.Popen:
    """`frenzy ARGS` as a user starts it, on the test server or (server=False) Prefect's embedded API."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value() or "" if server else "", **env_vars}
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=open(cwd / "cli.err", "ab"), text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)


def _as_from_a_terminal() -> None:
    """The signal dispositions of a command typed in a terminal, even when pytest runs as a background job (SIGINT
    ignored there) or under nohup (SIGHUP ignored: `frenzy submit` then rightly keeps running when the terminal closes,
    and the SIGHUP test waited 300 s for a stop that was never to come)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(tmp_path):
    """A failed test must not leave its submit or trainer running beside the rest of the suite (one did, for 11
    minutes at a full core): every process whose command line names this test's directory is killed at teardown."""
    yield
    subprocess.run(["pkill", "-KILL", "-f", "--", f"{tmp_path}/"], check=False)


def _wait_for_commit(root: Path, min_step: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any(m.step >= min_step for m in ck.committed(Storage(f"file://{root}"))):
        assert proc.poll() is None, (root.parent / "cli.err").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint committed in time"
        time.sleep(0.2)


def _wait_crashed_on_the_server(name_prefix: str, timeout_s: float = 60) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=name_prefix)))
            states = [(r.name, r.state_type.value if r.state_type else None) for r in runs]
            if states and all(t == "CRASHED" for _, t in states):
                assert all("killed (SIGKILL" in (r.state.message or "") for r in runs), [r.state for r in runs]
                return
            assert time.monotonic() < deadline, f"flow runs {states}: the killed submit's run is not Crashed"
            time.sleep(0.5)


def _trainers_of(run_dir: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "--", f"--run-dir {run_dir}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _living(pids: list[int], submit_pid: int) -> list[int]:
    """The processes of `pids` but `submit_pid` (its command line names the run directory too) that have not exited
    (a zombie has: its parent has not reaped it yet)."""
    def state(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"
    return [p for p in pids if p != submit_pid and state(p) not in ("Z", "X", "gone")]


def _describe(pids: list[int], run_dir: Path) -> str:
    ps = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,wchan:20,cmd", "-p", ",".join(map(str, pids))],
                        capture_output=True, text=True).stdout
    log = run_dir / "train.log"
    return ps + "\n--- train.log ---\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "(none)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_cancelling_submit_commits_a_final_checkpoint_and_releases(prefect_server, tmp_path, sig):
    """SIGTERM: what a Prefect cancellation does to the flow process. SIGHUP: the terminal closed (red team 41h N23:
    it killed submit at once, no line, the flow run left Running for good, the GPUs back only a lease later)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    Ledger(str(tmp_path / "l.db"))  # an explicit --ledger must exist (`frenzy cluster init` makes one)
    name = f"cancelme-{sig.name.lower()}"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name=name, steps=100000, every=50)))
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run"), "--json"], tmp_path)
    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    proc.send_signal(sig)
    proc.wait(timeout=300)  # the trainer's commit and the release: a minute or two on a loaded 2-core machine
    err = (tmp_path / "cli.err").read_text()
    newest = max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"submit-{name}"])))
    assert [fr.state.type.value for fr in runs] in (["CRASHED"], ["CANCELLED"]), runs  # not left RUNNING
    assert proc.returncode == 128 + sig and err.strip().splitlines()[-1] == (
        f"frenzy submit: stopped at step {newest}, committed under file://{tmp_path}/ckpt; rerun the same command to "
        "resume") and "Traceback" not in err, err[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["stopped_early"] is True  # the trainer was asked to stop, and committed the step it was at
    assert result["final_step"] == max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    assert Ledger(str(tmp_path / "l.db")).allocations() == []
    assert _trainers_of(tmp_path / "run") == []


@pytest.mark.parametrize("server", [True, pytest.param(False, marks=pytest.mark.slow)],  # embedded: ~50 s more
                         ids=["server", "embedded-api"])
def test_ctrl_c_ends_submit_in_one_line_that_says_where_it_stopped(prefect_server, tmp_path, server):
    """With a server, and with Prefect's embedded API (which Ctrl-C used to kill with the flow: connection
    tracebacks, minutes of retries, a second Ctrl-C and no line)."""
    Ledger(str(tmp_path / "l.db"))  # an explicit --ledger must exist (`frenzy cluster init` makes one)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="ctrlc", steps=100000, every=50)))
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")], tmp_path, server=server)
    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground process group
    proc.wait(timeout=120)
    err = (tmp_path / "cli.err").read_text()
    newest = max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"frenzy submit: stopped at step {newest}, committed under "
                                            f"file://{tmp_path}/ckpt; rerun the same command to resume")
    assert Ledger(str(tmp_path / "l.db")).allocations() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "ctrl-c"])
def test_a_stop_in_submits_first_seconds_says_it_was_planning_and_what_to_run(tmp_path, sig):
    """Red team 41r: SIGTERM in `frenzy submit`'s first 5 s exited 143 with no line (its handler was set only after
    the imports and the checks before the flow), and Ctrl-C there said only `interrupted`. Here submit is stopped
    while it asks the Prefect API, the first of those checks: a port on loopback that takes the connection and never
    answers. The line says it was planning, that nothing was queued or trained, and what to run."""
    import socket

    Ledger(str(tmp_path / "l.db"))  # an explicit --ledger must exist (`frenzy cluster init` makes one)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="early")))
    api = socket.socket()
    api.bind(("127.0.0.1", 0))
    api.listen(1)
    api.settimeout(120)
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")], tmp_path, PREFECT_API_URL=f"http://127.0.0.1:{api.getsockname()[1]}/api")
    try:
        conn, _ = api.accept()  # submit is in its first checks: nothing planned, queued or trained yet
        proc.send_signal(sig)
        proc.wait(timeout=60)
        conn.close()
    finally:
        api.close()
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), (proc.returncode, err[-3000:])
    assert err.strip().splitlines()[-1] == ("frenzy submit: stopped while planning, before it asked for GPUs: nothing "
                                            "was queued or trained; rerun the same command to start it"), err[-3000:]
    assert "Traceback" not in err and Ledger(str(tmp_path / "l.db")).queue() == []


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in time: " + path.read_text()[-3000:]
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_submit_stopped_while_queued_says_it_held_no_trainer_and_no_gpus(prefect_server, tmp_path, sig):
    """Red team 41r: SIGTERM of a submit still waiting in the queue said "stopped before the first checkpoint was
    committed", and one SIGKILLed was marked Crashed as if "the trainer it started commits its step; its GPUs come
    back when the lease runs out": it had neither. The only device is held by another job, so the submit waits in
    the queue; stopped there, its line (SIGTERM) or its run's Crashed message (SIGKILL, the guardian's) says so."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster

    led = Ledger(str(tmp_path / "l.db"))
    led.sync(load_cluster("local"))
    assert led.allocate("hog", [GpuRequest(1, 0)], lease_s=3600) is not None  # every device of this machine
    name = f"queued-{sig.name.lower()}"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name=name)))
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")], tmp_path)
    _wait_for_text(tmp_path / "cli.err", f"{name}: waiting, queue position 1", proc)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    err = (tmp_path / "cli.err").read_text()
    assert [a.job for a in led.allocations()] == ["hog"] and not (tmp_path / "run" / "train.log").exists()
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            "frenzy submit: stopped while queued for GPUs: no trainer had started and no GPUs were held, and its "
            "place in the queue is given up; rerun the same command to start it"), err[-3000:]
        assert led.queue() == []
        return
    deadline = time.monotonic() + 90
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"submit-{name}"])))
            if runs and runs[0].state_type.value == "CRASHED":
                break
            assert time.monotonic() < deadline, [(r.name, r.state) for r in runs]
            time.sleep(0.5)
    said = runs[0].state.message
    assert "killed (SIGKILL" in said and "It was waiting in the ledger's queue for GPUs: no trainer had started and it " \
        "held no GPUs; its place in the queue lapses with its lease (`--lease`)" in said, said
    assert "The trainer it started" not in said, said


_NOTEBOOK = """
import json, sys
from flows.submit import SubmitInterrupted, SubmitRequest, submit
from tasks.jobspec import load_job
request = SubmitRequest(job=load_job("job.yaml"), ledger=sys.argv[1], evaluation="off", device="cpu", run_dir="run")
try:
    submit(request)
except KeyboardInterrupt as err:  # what a notebook cell shows: the exception's type and its message
    print(json.dumps({"type": type(err).__name__, "says": str(err), "step": getattr(err, "stopped", None) and
                      err.stopped.step}), flush=True)
"""


def test_a_submit_interrupted_in_python_says_where_it_stopped_as_the_cli_does(prefect_server, tmp_path):
    """Red team 41e S14: a notebook's interrupted `submit(...)` raised a bare KeyboardInterrupt; only the CLI said
    "stopped at step N, committed under URI". Now the flow itself raises the same record."""
    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="nbint", steps=100000, every=50)))
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value() or ""}
    proc = subprocess.Popen([sys.executable, "-c", _NOTEBOOK, str(tmp_path / "l.db")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "cli.err", "ab"), text=True,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    os.kill(proc.pid, signal.SIGINT)  # the kernel's interrupt: a KeyboardInterrupt in the cell
    out, _ = proc.communicate(timeout=120)
    newest = max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"type": "SubmitInterrupted", "step": newest,
                   "says": f"submit: stopped at step {newest}, committed under file://{tmp_path}/ckpt; call submit again "
                           "with the same request to resume"}, (got, (tmp_path / "cli.err").read_text()[-2000:])
    assert Ledger(str(tmp_path / "l.db")).allocations() == []


@pytest.mark.slow  # a whole submit killed and rerun (about 30 s)
def test_a_killed_submit_leaves_no_trainer_and_a_rerun_resumes(prefect_server, tmp_path):
    Ledger(str(tmp_path / "l.db"))  # an explicit --ledger must exist (`frenzy cluster init` makes one)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="killme", steps=100000, every=50)))
    args = ["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
            "--run-dir", str(tmp_path / "run"), "--lease", "5", "--json"]
    proc = _cli(args, tmp_path)
    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    proc.send_signal(signal.SIGKILL)  # the flow process crashes: no finally, no release
    proc.wait(timeout=30)
    deadline = time.monotonic() + 90
    while _trainers_of(tmp_path / "run") and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _trainers_of(tmp_path / "run")
    assert left == [], _describe(left, tmp_path / "run")  # the trainer died with its launcher: no orphan writer
    _wait_crashed_on_the_server("submit-killme")  # not Running for good: its guardian ended it (flows/guardian.py)
    newest = max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    # the crashed run still holds this machine's one device until its 5 s lease runs out: the re-run waits in
    # the queue for that, then resumes
    job = _job(tmp_path, name="killme", steps=newest + 10, every=50)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    again = _cli(args, tmp_path)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, (tmp_path / "cli.err").read_text()[-3000:]
    res = json.loads(out)
    assert res["train"]["resumed_from_step"] == newest and res["train"]["final_step"] == newest + 10
    assert res["released"] is True


def _killed_after_a_commit_leaves_no_server(proc: subprocess.Popen, tmp_path: Path) -> None:
    """SIGKILL `proc` (a submit on the embedded API) once a step is committed: its Prefect server must be gone."""
    import psutil

    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    servers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "uvicorn" in " ".join(p.cmdline())]
    assert servers, "no embedded server found under the process"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _, alive = psutil.wait_procs(servers, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]


@pytest.mark.slow  # the embedded API's start and a trainer's first commit (about 40 s)
def test_a_killed_submit_on_the_embedded_api_leaves_no_server_behind(tmp_path):
    """Red team 41j S07: `frenzy submit` SIGKILLed on the embedded API left its Prefect server (uvicorn, in a session
    of its own so that Ctrl-C does not reach it) running as an orphan for 13 minutes and more. It now gets the
    parent-death signal: gone within seconds, as the trainer is."""
    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="embkill", steps=100000, every=50)))
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")], tmp_path, server=False)
    _killed_after_a_commit_leaves_no_server(proc, tmp_path)


@pytest.mark.slow  # the embedded API's start and a trainer's first commit (about 40 s)
def test_a_killed_notebook_submit_on_the_embedded_api_leaves_no_server_behind(tmp_path):
    """Red team 41k A5: a notebook's `submit(...)` on the embedded API, its kernel SIGKILLed: the temporary server
    ran on as an orphan (only the CLI armed its parent-death signal). The flow call arms it too."""
    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="nbkill", steps=100000, every=50)))
    env = {**os.environ, "PREFECT_API_URL": ""}
    proc = subprocess.Popen([sys.executable, "-c", _NOTEBOOK, str(tmp_path / "l.db")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "cli.err", "ab"), text=True,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    _killed_after_a_commit_leaves_no_server(proc, tmp_path)


def test_the_report_waits_for_every_committed_steps_score_not_just_the_final_one():
    from tasks.pipeline.evaluations import collect_scores

    # the triggered runs finish out of order: step 100 first, step 50 one poll later
    arrivals = [{100: "s100"}, {100: "s100", 50: "s50"}]
    now = [0.0]
    polls = []

    def read() -> dict:
        polls.append(now[0])
        return arrivals[min(len(polls), len(arrivals)) - 1]

    def sleep(dt: float) -> None:
        now[0] += dt

    got, failed = collect_scores(read, [50, 100], timeout_s=60, clock=lambda: now[0], sleep=sleep)
    assert got == {100: "s100", 50: "s50"} and len(polls) == 2 and failed == []

    # bounded: a score that never comes ends the wait at eval_timeout_s with what arrived
    polls.clear()
    now[0] = 0.0
    arrivals[:] = [{100: "s100"}]
    got, failed = collect_scores(read, [50, 100], timeout_s=10, clock=lambda: now[0], sleep=sleep)
    assert got == {100: "s100"} and 10 <= now[0] <= 12 and failed == []


def test_a_failed_evaluation_run_ends_the_wait_at_once_and_a_crashed_one_is_run_again():
    from tasks.pipeline.evaluations import collect_scores

    now, reruns = [0.0], []
    runs = {50: ("failed", "DatasetError: data.jsonl line 3 is not JSON"), 100: ("crashed", "worker lost")}

    def rerun(step: int) -> bool:  # the second run of step 100 succeeds
        reruns.append(step)
        del runs[100]
        return True

    def read() -> dict:
        return {100: "s100"} if reruns else {}

    def sleep(dt: float) -> None:
        now[0] += dt

    got, failed = collect_scores(read, [50, 100], timeout_s=1800, runs=lambda: dict(runs), rerun=rerun,
                                 clock=lambda: now[0], sleep=sleep)
    assert got == {100: "s100"} and reruns == [100]
    assert [(f.step, f.cause) for f in failed] == [(50, "DatasetError: data.jsonl line 3 is not JSON")]
    assert now[0] <= 4  # two polls, not the 30 minutes of eval_timeout_s


def test_an_in_flow_evaluation_that_fails_is_kept_with_its_cause_and_one_retention_struck_is_named_not_failed(tmp_path):
    import torch

    from tasks.pipeline.evaluations import InFlowEvaluator

    st = Storage(f"file://{tmp_path}/ckpt")
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    for step in (10, 20):
        c = ck.AsyncCheckpointer(st, 0, 1, run="t", keep=10)
        c.save(step, [("model.w", torch.full((4,), float(step)))], fields)
        c.close()
    warned: list[str] = []

    def evaluate(uri: str):
        if uri.endswith("step_00000010"):  # retention removes it while it is evaluated
            import shutil

            shutil.rmtree(tmp_path / "ckpt" / "step_00000010")
        raise ValueError(f"cannot read {uri}")

    ev = InFlowEvaluator(st.uri, str(tmp_path / "evals"), "t", "quick", evaluate, warned.append)
    ev.catch_up()
    ev.catch_up()  # a failed step is not tried again
    got = {f.step: f.cause for f in ev.failures()}
    assert sorted(got) == [20] and len(warned) == 2 and ev.summaries() == []  # retention's step is no failure
    assert "removed by retention" in ev.retired[10] and "training.checkpoint.keep" in ev.retired[10], ev.retired
    assert "retention" not in got[20] and got[20].startswith("cannot read")


def _commit_tiny(st: Storage, step: int) -> None:
    """One committed step of a 4-float model under `st` (an in-flow evaluator's test input)."""
    import torch

    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    c = ck.AsyncCheckpointer(st, 0, 1, run="t", keep=10)
    c.save(step, [("model.w", torch.full((4,), float(step)))], fields)
    c.close()


def test_a_step_a_rollback_discarded_while_queued_for_evaluation_is_named_not_failed_and_evaluated_again(tmp_path):
    """After red team 41o S10: a loss-spike rollback to step 10 discarded step 20 while the in-flow evaluator had it
    queued; its evaluation failed (`no manifest.json`) and counted as a failure of the run. Now it is named as
    discarded by design, and the step the run commits again on its new timeline is evaluated."""
    from tasks.pipeline.evaluations import InFlowEvaluator, retired_steps

    st = Storage(f"file://{tmp_path}/ckpt")

    def commit(step: int) -> None:
        _commit_tiny(st, step)

    commit(10), commit(20)
    warned: list[str] = []
    tried: list[str] = []

    def evaluate(uri: str):
        tried.append(uri)
        if uri.endswith("step_00000020") and len(tried) == 2:  # the trainer rolls back to 10 while 20 is queued
            ck.discard_after(st, 10)
            raise ck.CheckpointError(f"{uri} is not a committed checkpoint (no manifest.json)")
        return uri

    ev = InFlowEvaluator(st.uri, str(tmp_path / "evals"), "t", "quick", evaluate, warned.append)
    ev.catch_up()
    assert ev.failures() == [] and 20 not in ev.retired, (warned, ev.failures())
    assert len(warned) == 1 and "discarded when the run went back to step 10" in warned[0], warned
    gone = retired_steps(st.uri, [10, 20], {10})  # submit's wait does not wait for it either
    assert [g.step for g in gone] == [20] and "discarded" in gone[0].why
    commit(20)  # the new timeline commits step 20 again: it is evaluated
    ev.catch_up()
    assert [s for s in ev.summaries()] == [st.uri + "/step_00000010", st.uri + "/step_00000020"], tried
    assert retired_steps(st.uri, [10, 20], {10}) == []  # committed again: waited for


def test_evaluation_runs_stuck_pending_are_crashed_and_waiting_for_a_worker_is_said(prefect_server):
    from datetime import UTC, datetime, timedelta

    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.states import Failed, Pending, Running, Scheduled

    from flows.stages import STUCK_S, TriggeredEvaluations

    root = "file:///data/alice/ckpt"
    later = datetime.now(UTC) + timedelta(seconds=STUCK_S + 60)  # the clock of the waiting submit
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("evaluate-checkpoint")
        dep = client.create_deployment(flow_id, name="evaluate-on-checkpoint")
        ids = {}
        for step, state in ((10, Pending()), (20, Failed(message="boom: qa.jsonl")), (30, Scheduled()),
                            (40, Running())):
            fr = client.create_flow_run_from_deployment(dep, parameters={"request": {"uri": f"{root}/step_{step:08d}"}})
            client.set_flow_run_state(fr.id, state, force=True)
            ids[step] = fr.id
        warned, said = [], []
        t = TriggeredEvaluations(root, datetime.now(UTC) - timedelta(seconds=60), warned.append, said.append)
        assert t.ended_without_score() == {20: ("failed", "boom: qa.jsonl")}  # 10 pending only just: may start
        t.now, t.said_at = lambda: later, 0.0
        out = t.ended_without_score()
        assert sorted(out) == [10, 20], out  # 40 runs: it may take as long as it takes
        assert out[10][0] == "crashed" and "never started" in out[10][1] and out[20] == ("failed", "boom: qa.jsonl")
        assert "FRENZY_EVAL_STUCK_S=180" in out[10][1], out[10]
        # its worker is asked to end its process (red team 41n C5: a stopped one lingered): Cancelling, and the
        # Cancelled the worker then sets is this submit's doing, still a crash to run again, not a person's stop
        assert client.read_flow_run(ids[10]).state.type.value == "CANCELLING"
        assert t.ended_without_score()[10] == out[10]
        # this test server's deployment has no work pool: the hint names both causes (served, or its pool deleted)
        assert len(warned) == 1 and "step 30" in warned[0] and "waited" in warned[0] and "deploy.sh" in warned[0]
        assert said and all(f"step {s}" in said[0] for s in (10, 20, 30, 40))
        t.ended_without_score()
        assert len(warned) == 1  # said once
        t.now = lambda: later + timedelta(seconds=STUCK_S + 1)  # no worker ended it: Crashed, not left a zombie
        t.ended_without_score()
        assert client.read_flow_run(ids[10]).state.type.value == "CRASHED"
        assert "no worker ended it" in client.read_flow_run(ids[10]).state.message
        # a resumed run waits for the runs an earlier invocation's commits started (before `since`) too, and starts
        # the one that was never started
        t2 = TriggeredEvaluations(root, datetime.now(UTC), warned.append, now=lambda: later, earlier=frozenset({20, 50}))
        assert t2.ended_without_score() == {20: ("failed", "boom: qa.jsonl")} and 10 not in t2.params, warned
        t2.start(50, "quick", "/data/alice/evals")
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep])))
        assert [fr.parameters["request"] for fr in runs if fr.parameters["request"]["uri"].endswith("50")] == [
            {"uri": f"{root}/step_00000050", "suite": "quick", "history_dir": "/data/alice/evals", "reevaluate": False}]


def test_the_waiting_line_names_only_the_steps_waited_for():
    """Red team 41l D1: `waiting for the evaluation runs: step 40 Submitting, ...` right after the run said step 40
    was removed by retention and not waited for."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from flows.stages import TriggeredEvaluations

    def run(state: str) -> SimpleNamespace:
        return SimpleNamespace(state=SimpleNamespace(name=state.title(), type=SimpleNamespace(value=state)))

    said: list[str] = []
    t = TriggeredEvaluations("file:///d/ck", datetime.now(UTC), said.append, said.append,
                             waited=frozenset({120, 160}))
    t._say({40: run("PENDING"), 120: run("SCHEDULED"), 160: run("COMPLETED")})
    assert said == ["waiting for the evaluation runs: step 120 Scheduled, step 160 Completed"]
    said.clear()
    TriggeredEvaluations("file:///d/ck", datetime.now(UTC), said.append, said.append)._say({40: run("PENDING")})
    assert said == ["waiting for the evaluation runs: step 40 Pending"]  # no list given: every step with a run


def test_an_evaluation_run_failed_by_an_unreachable_api_is_run_again_naming_the_api_and_its_log():
    """Red team 41q B3: an evaluation whose Prefect API refused connections while it ran Failed, and submit reported
    the step failed (`[Errno 111] Connection refused`), not run again, naming neither the API nor its log. A Failed
    run whose cause is the API's is run again as a crashed one is; any other failure is still the step's."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from flows.stages import TriggeredEvaluations

    def failed(message: str) -> SimpleNamespace:
        return SimpleNamespace(id=message, name="lurking-sheep", state=SimpleNamespace(
            type=SimpleNamespace(value="FAILED"), name="Failed", message=message, timestamp=datetime.now(UTC)))

    t = TriggeredEvaluations("file:///d/ck", datetime.now(UTC), print, print)
    refused = ("Flow run encountered an exception: EvalError: evaluation of file:///d/ck/step_00000020 failed: "
               "[Errno 111] Connection refused (logs in /d/evals/s3.failed/trials)")
    verdict, cause = t._verdict(None, 20, failed(refused))
    assert verdict == "crashed" and "the Prefect API did not answer" in cause, cause
    assert "`prefect flow-run logs lurking-sheep`" in cause and cause.endswith(refused), cause
    assert t._verdict(None, 20, failed("httpx.ConnectError: All connection attempts failed"))[0] == "crashed"
    assert t._verdict(None, 20, failed("EvalError: shape mismatch")) == ("failed", "EvalError: shape mismatch")


def test_an_api_error_rerunning_one_crashed_evaluation_is_that_steps_failure_and_a_retry_that_helps_is_made(prefect_server):
    """Red team 41h N15: a 503 on `create_flow_run` while submit re-ran one crashed evaluation run ended the whole
    submit as a bug. The real server behind a proxy that answers 503 to that route: the step is failed with the API's
    answer and the wait returns (the report is written); when the API recovers, the run is made and the step scores."""
    from datetime import UTC, datetime, timedelta
    from urllib.parse import urlparse

    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings
    from prefect.states import Crashed

    from flows.stages import START_TRIES, TriggeredEvaluations
    from tasks.pipeline.evaluations import collect_scores
    from tests.s3_endpoint import FlakyProxy

    root = "file:///data/n15/ckpt"
    api = PREFECT_API_URL.value()
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("evaluate-checkpoint")
        dep = client.create_deployment(flow_id, name="evaluate-on-checkpoint")
        for step in (10, 20):
            fr = client.create_flow_run_from_deployment(dep, parameters={"request": {"uri": f"{root}/step_{step:08d}"}})
            client.set_flow_run_state(fr.id, Crashed(message="worker lost"), force=True)

    def made(step: int) -> int:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep])))
        return sum(fr.parameters["request"]["uri"] == f"{root}/step_{step:08d}" for fr in runs)  # other tests' too

    now = [0.0]
    # Retry-After: 0: the client's own 2 s sleep after each 503 (it sleeps even with no retry left) is not waited out
    with FlakyProxy(urlparse(api).port, only="/create_flow_run", retry_after="0") as proxy, temporary_settings(
            {PREFECT_API_URL: f"http://127.0.0.1:{proxy.port}/api", PREFECT_CLIENT_MAX_RETRIES: 0}):
        warned: list[str] = []
        t = TriggeredEvaluations(root, datetime.now(UTC) - timedelta(seconds=600), warned.append, earlier=frozenset({10, 20}))
        proxy.fail_for(3600)  # the API never recovers: both steps fail, each with the API's answer; nothing raises
        got, failed = collect_scores(dict, [10, 20], 1800, runs=t.ended_without_score, rerun=t.rerun,
                                     clock=lambda: now[0], sleep=lambda dt: now.__setitem__(0, now[0] + dt))
        assert got == {} and [f.step for f in failed] == [10, 20], failed
        assert all("could not be started" in f.cause and "503" in f.cause and f"{START_TRIES} times" in f.cause
                   and "frenzy evaluate file:///data/n15/ckpt/step_" in f.cause for f in failed), failed
        assert proxy.failed == 2 * START_TRIES and made(10) == 1 and any("trying again (1/" in w for w in warned)
        # the API answers 503 twice, then recovers: the crashed run of step 10 is run again, and it scores
        proxy.fail_for(0)
        proxy.fail_next(2)
        t = TriggeredEvaluations(root, datetime.now(UTC) - timedelta(seconds=600), warned.append, earlier=frozenset({10}))
        got, failed = collect_scores(lambda: {10: "s10"} if made(10) == 2 else {}, [10], 1800, runs=t.ended_without_score,
                                     rerun=t.rerun, clock=lambda: now[0], sleep=lambda dt: now.__setitem__(0, now[0] + dt))
        assert got == {10: "s10"} and failed == [] and made(10) == 2 and t.balked == {}


def test_a_quiet_running_evaluation_is_named_with_how_long_and_how_to_look(prefect_server):
    """Red team 41c S17: a SIGSTOPped evaluation showed only "step 20 Running" each minute until eval_timeout_s."""
    from datetime import timedelta

    from prefect import get_client
    from prefect.client.schemas.actions import LogCreate
    from prefect.states import Cancelled, Running

    from flows.stages import QUIET_S, TriggeredEvaluations

    root = "file:///data/quiet/ckpt"
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("evaluate-checkpoint")
        dep = client.create_deployment(flow_id, name="evaluate-on-checkpoint")
        runs = {}
        for step in (10, 20, 30):
            runs[step] = client.create_flow_run_from_deployment(
                dep, parameters={"request": {"uri": f"{root}/step_{step:08d}"}})
            client.set_flow_run_state(runs[step].id, Running(), force=True)
        started = client.read_flow_run(runs[20].id).state.timestamp
        later = started + timedelta(seconds=QUIET_S + 100)  # the waiting submit's clock
        client.create_logs([LogCreate(name="prefect.flow_runs", level=20, message="trial 3/4 done",
                                      timestamp=later - timedelta(seconds=30), flow_run_id=runs[10].id)])
        client.set_flow_run_state(runs[30].id, Cancelled(message="cancelled by alice"), force=True)
        warned, said = [], []
        t = TriggeredEvaluations(root, started - timedelta(seconds=60), warned.append, said.append, now=lambda: later)
        assert t.ended_without_score() == {30: ("failed", "cancelled by alice")}  # not waited out, not rerun
        # step 10 logged 30 s ago: working; step 20 logged nothing since it started: named once, with the commands
        assert len(warned) == 1 and "step 20" in warned[0] and f"prefect flow-run logs {runs[20].id}" in warned[0]
        assert f"logged nothing for {QUIET_S + 100:.0f} s" in warned[0]
        assert "step 10 Running" in said[0] and "(last log 30 s ago)" in said[0], said
        assert f"step 20 Running {QUIET_S + 100:.0f} s (last log {QUIET_S + 100:.0f} s ago)" in said[0], said
        t.said_at = 0.0
        t.ended_without_score()
        assert len(warned) == 1 and len(said) == 2  # the warning once, the waiting line each minute


def test_a_running_evaluation_whose_process_stopped_beating_is_crashed_and_run_again_a_beating_one_is_not(
        prefect_server):
    """Red team 41q G3: the worker and its evaluation process SIGKILLed 5 s after the run started: Running for good,
    waited out until eval_timeout_s. On the real server: a deployment whose runs send heartbeats, two quiet RUNNING
    runs 200 s after they started, one that sent a heartbeat 10 s ago and one whose last came 195 s ago."""
    from datetime import timedelta
    from uuid import uuid4

    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.events import Event
    from prefect.events.filters import EventFilter, EventNameFilter
    from prefect.states import Running

    from flows.stages import TriggeredEvaluations
    from tasks.pipeline.evaluations import collect_scores

    root = "file:///data/g3/ckpt"
    with get_client(sync_client=True) as client:
        dep = client.create_deployment(client.create_flow_from_name("evaluate-checkpoint"), name="evaluate-on-checkpoint")
        runs = {s: client.create_flow_run_from_deployment(dep, parameters={"request": {"uri": f"{root}/step_{s:08d}"}})
                for s in (10, 20)}
        for fr in runs.values():
            client.set_flow_run_state(fr.id, Running(), force=True)
        started = client.read_flow_run(runs[20].id).state.timestamp
        later = started + timedelta(seconds=200)  # the waiting submit's clock
        beats = [Event(id=uuid4(), occurred=at, event="prefect.flow-run.heartbeat",
                       resource={"prefect.resource.id": f"prefect.flow-run.{runs[s].id}"})
                 for s, at in ((10, later - timedelta(seconds=10)), (20, started + timedelta(seconds=5)))]
        client.request("POST", "/events", json=[b.model_dump(mode="json") for b in beats])
        flt = EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]))
        flt.occurred.until = later
        for _ in range(1000):  # the server persists events in batches: read (each read a round trip) until stored
            if {e.id for e in client.read_events(flt, limit=50).events} >= {b.id for b in beats}:
                break
        warned, said = [], []
        t = TriggeredEvaluations(root, started - timedelta(seconds=60), warned.append, said.append, now=lambda: later)
        assert t.ended_without_score() == {}  # the deployment sends no heartbeats: nothing tells a dead run apart
        client.update_deployment(dep, DeploymentUpdate(job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}))
        try:
            got, failed = collect_scores(dict, [10, 20], 1800, runs=t.ended_without_score, rerun=t.rerun,
                                         clock=iter(range(0, 10**6, 700)).__next__, sleep=lambda _: None)
            assert got == {} and failed == [], failed  # the wait ran out (fake clock): nothing failed yet
            dead, live = client.read_flow_run(runs[20].id).state, client.read_flow_run(runs[10].id).state
            assert dead.type.value == "CRASHED" and "sent no heartbeat for 195 s" in dead.message, dead
            assert "its process is gone" in dead.message and f"prefect flow-run logs {runs[20].id}" in dead.message
            assert live.type.value == "RUNNING"  # quiet 200 s, but beating
            assert t.newest[20].id != runs[20].id and t.newest[10].id == runs[10].id  # step 20 run again, once
            assert "step 20: run " in t.left([10, 20]) and "Scheduled" in t.left([10, 20])
        finally:
            client.update_deployment(dep, DeploymentUpdate(job_variables={}))


def test_a_root_that_holds_another_jobs_checkpoints_is_refused_with_both_fixes(tmp_path):
    import torch

    from tasks.pipeline.summary import foreign_root

    st = Storage(f"file://{tmp_path}/ckpt")
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    c = ck.AsyncCheckpointer(st, 0, 1, run="ivy-a", keep=10)
    c.save(20, [("model.w", torch.zeros(4))], fields)
    c.close()
    why = foreign_root(_request(tmp_path, name="ivy-b"))
    assert why is not None and "job 'ivy-a' (newest step 20)" in why and "its own training.checkpoint.uri" in why
    assert foreign_root(_request(tmp_path, name="ivy-a")) is None  # its own: a rerun resumes it
    assert foreign_root(_request(tmp_path / "empty", name="ivy-b")) is None


def test_triggered_runs_are_matched_however_the_root_is_spelled_and_the_causes_of_a_silent_wait_are_named(
        prefect_server, tmp_path, monkeypatch):
    from datetime import UTC, datetime, timedelta

    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.states import Failed

    from flows.stages import ORPHAN_S, DeploymentGone, TriggeredEvaluations

    monkeypatch.chdir(tmp_path)
    root = f"file://{tmp_path}/ck-suite"  # what the commit events carry, whatever the job's `uri:` said
    clock = [datetime.now(UTC)]
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="pool-41e"), overwrite=True)
        dep = client.create_deployment(client.create_flow_from_name("evaluate-checkpoint"), name="evaluate-on-checkpoint",
                                       work_pool_name="pool-41e")
        fr = client.create_flow_run_from_deployment(dep, parameters={"request": {"uri": f"{root}/step_00000010"}})
        client.set_flow_run_state(fr.id, Failed(message="unknown dataset 'data'"), force=True)
        for spelled in ("ck-suite", "./ck-suite/", f"{tmp_path}/ck-suite", f"{root}/"):  # `uri: ck-suite` and kin
            t = TriggeredEvaluations(spelled, clock[0] - timedelta(seconds=60), print, now=lambda: clock[0])
            assert t.ended_without_score() == {10: ("failed", "unknown dataset 'data'")}, spelled
        # step 20 committed, but its commit made no run: started once ORPHAN_S has passed (the clock is injected)
        assert t.orphans({20}) == []
        clock[0] += timedelta(seconds=ORPHAN_S)
        assert t.orphans({20}) == [20]
        t.start(20, "quick", str(tmp_path / "evals"))
        assert t.orphans({20}) == []
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep])))
        mine = sorted(u for r in runs if (u := r.parameters["request"]["uri"]).startswith(root))
        assert mine == [f"{root}/step_00000010", f"{root}/step_00000020"]
        # the pool paused: said at once, with the command that resumes it (not "is a worker running?")
        client.update_work_pool("pool-41e", WorkPoolUpdate(is_paused=True))
        warned: list[str] = []
        t = TriggeredEvaluations("ck-suite", clock[0] - timedelta(seconds=600), warned.append, now=lambda: clock[0])
        t.ended_without_score()
        t.ended_without_score()
        assert warned == ["the work pool pool-41e is paused: the evaluation runs wait until it is resumed "
                          "(`prefect work-pool resume pool-41e`)"]
        # the deployment deleted while submit waits: named, so that submit evaluates the steps left in-flow
        client.delete_deployment(dep)
        with pytest.raises(DeploymentGone, match="evaluate-on-checkpoint deployment is not on the server"):
            t.ended_without_score()
        with pytest.raises(DeploymentGone):
            t.rerun(20)


def test_a_commit_event_lost_while_the_server_was_unreachable_gets_its_run_as_soon_as_the_server_answers(
        prefect_server, tmp_path):
    """Red team 41l B3: a step committed while the Prefect server restarted has no run; it was started only after
    ORPHAN_S (120 s). Now the first answer after the outage starts it, and the waiting line says why."""
    import socket
    from datetime import UTC, datetime, timedelta

    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from flows.stages import TriggeredEvaluations
    from tasks.pipeline.outage import CommitTimes

    root = f"file://{tmp_path}/ck-lost"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="pool-41l"), overwrite=True)
        dep = client.create_deployment(client.create_flow_from_name("evaluate-checkpoint"), name="evaluate-on-checkpoint",
                                       work_pool_name="pool-41l")
        client.create_flow_run_from_deployment(dep, parameters={"request": {"uri": f"{root}/step_00000010"}})
    said: list[str] = []
    commits = [CommitTimes()]
    t = TriggeredEvaluations(root, datetime.now(UTC) - timedelta(seconds=60), said.append, said.append,
                             waited=frozenset({10, 20}), committed_at=lambda: commits[0])
    assert t.ended_without_score() == {} and t.orphans({20}) == []  # the server up: step 20's event may be in flight
    with socket.socket() as closed:  # a port nothing listens on: the API as a stopped server leaves it
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}/api"
        with temporary_settings({PREFECT_API_URL: down, PREFECT_CLIENT_MAX_RETRIES: 0}):
            commits[0] = CommitTimes(((20, datetime.now(UTC).timestamp()),))  # step 20 commits while the server is down
            assert t.ended_without_score() == {}
            assert t.orphans({20}) == []  # nothing is started while the server cannot be reached
    t.ended_without_score()  # the server answers again, with no run for step 20: its event was lost
    assert t.orphans({20}) == [20]
    assert "commit event was lost: the Prefect server was unreachable from" in t.lost[20]
    t.start(20, "quick", str(tmp_path / "evals"))
    assert t.orphans({20}) == []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep])))
    assert sorted(u for r in runs if (u := r.parameters["request"]["uri"]).startswith(root)) == [
        f"{root}/step_00000010", f"{root}/step_00000020"]
    t.said_at = 0.0  # the once-a-minute waiting line, now
    t.ended_without_score()
    assert any("step 20 Scheduled (started by submit: its commit event was lost in a server outage)" in w
               for w in said), said


def test_submit_evaluates_in_flow_when_the_evaluation_deployment_is_gone_while_it_waits(prefect_server, tmp_path,
                                                                                       tiny_trained):
    from prefect import flow, get_client
    from prefect.exceptions import ObjectNotFound

    from cluster.inventory import load_cluster
    from flows.stages import EVAL_DEPLOYMENT, FlowStages
    from tasks.pipeline.run import Run
    from tasks.training.request import TrainResult
    from tests import trainer_util as tu

    tu.copy_trained(tiny_trained, tmp_path, "t")  # tiny_job(file://tmp_path/ckpt, steps=20, every=10), trained
    res = TrainResult.model_validate_json((tmp_path / "t" / "result.json").read_text())
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "datasets": [
        {"name": "heldout-loss", "examples": 4, "mode": "ppl", "infer_s_per_example": 0.01}]}))
    req = _request(tmp_path, name="t", steps=20, every=10).model_copy(
        update={"evaluation": "deployment", "suite": str(tmp_path / "s.yaml"), "eval_timeout_s": 600.0})
    with get_client(sync_client=True) as client:  # deleted (by an admin) before submit looks for its runs
        try:
            client.delete_deployment(client.read_deployment_by_name(EVAL_DEPLOYMENT).id)
        except ObjectNotFound:
            pass
    run = Run(request=req, run_dir=str(tmp_path / "run"), suite="s", mode="deployment", result=res)

    @flow
    def waiting() -> tuple[list, list]:
        return FlowStages(req, Ledger(str(tmp_path / "l.db")), load_cluster("local")).evaluations(run)

    found, failures = waiting()
    assert [e.step for e in found] == [10, 20] and failures == []
    assert {e.step for e in history.read(str(tmp_path / "evals"), "t", "s")} == {10, 20}


@pytest.mark.parametrize("moved", [False, True])
def test_an_unusable_cache_is_refused_before_placement_naming_home_or_frenzy_cache(tmp_path, monkeypatch, moved):
    """Red team 41c S10: HOME a regular file was found by the trainer, after placement, and HOME was never named."""
    from tasks.errors import FrenzyError
    from tasks.training.data import cache_subdir
    from tests.hostile_kit import cli

    (tmp_path / "homefile").write_text("not a directory")
    monkeypatch.setenv("HOME", str(tmp_path / "homefile"))
    if moved:
        monkeypatch.setenv("FRENZY_CACHE", str(tmp_path / "homefile" / "cache"))
    else:
        monkeypatch.delenv("FRENZY_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="hana")))
    run = cli("submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu")
    assert run.rc == 2, run
    want = f"FRENZY_CACHE={tmp_path}/homefile/cache" if moved else f"HOME={tmp_path}/homefile"
    assert want in run.err and "set FRENZY_CACHE to a directory you may write" in run.err, run.err
    assert "is a file" in run.err and "Traceback" not in run.err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "ckpt").exists() and not (tmp_path / "l.db").exists()
    with pytest.raises(FrenzyError, match="set FRENZY_CACHE"):  # what the trainer meets, with the same words
        cache_subdir("corpus")
    monkeypatch.setenv("FRENZY_CACHE", str(tmp_path / "cache"))
    assert cache_subdir("corpus") == tmp_path / "cache" / "corpus" and (tmp_path / "cache" / "corpus").is_dir()


def test_runs_waiting_on_a_deployment_without_a_work_pool_name_both_causes_not_a_literal_pool():
    """Red team 41e: `prefect work-pool delete frenzy` leaves the deployments without a pool (a worker makes a new
    pool, which they are not bound to); the late-run hint said `prefect worker start --pool POOL` while a worker ran.
    A deployment with no pool may also be served by a process (`.serve()`): the hint names both, and the real pool
    when there is one."""
    from datetime import UTC, datetime

    from flows.stages import TriggeredEvaluations

    t = TriggeredEvaluations("file:///r/ck", datetime.now(UTC), print)
    t.pool = ""
    hint = t._no_worker_hint()
    assert "has no work pool" in hint and "bash deployments/deploy.sh" in hint and "serves it" in hint
    assert "POOL" not in hint
    t.pool = "frenzy"
    assert "`prefect worker start --pool frenzy`" in t._no_worker_hint()


def test_a_step_evaluated_for_an_earlier_suite_gets_a_run_of_this_suite_and_a_deleted_pool_is_named(
        prefect_server, tmp_path):
    """Red team 41f S15: a job resubmitted with a new suite while its old runs were queued waited on their Completed
    runs until the timeout; S21: a pool deleted after it was said paused was never named."""
    from datetime import UTC, datetime, timedelta

    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.states import Completed

    from flows.stages import TriggeredEvaluations

    root = f"file://{tmp_path}/ck-s15"
    hist = str(tmp_path / "evals")
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="pool-41f"), overwrite=True)
        dep = client.create_deployment(client.create_flow_from_name("evaluate-checkpoint"), name="evaluate-on-checkpoint",
                                       work_pool_name="pool-41f")
        for step, suite in ((10, str(tmp_path / "suite.yaml")), (20, str(tmp_path / "suite2.yaml"))):
            fr = client.create_flow_run_from_deployment(dep, parameters={"request": {
                "uri": f"{root}/step_{step:08d}", "suite": suite, "history_dir": hist}})
            client.set_flow_run_state(fr.id, Completed(), force=True)
        client.update_work_pool("pool-41f", WorkPoolUpdate(is_paused=True))
        warned: list[str] = []
        t = TriggeredEvaluations(root, datetime.now(UTC) - timedelta(seconds=60), warned.append)
        assert t.ended_without_score() == {}  # completed runs are not failures
        # step 10's run evaluated the old suite: it needs one of suite2 (spelled another way); step 20's is this suite's
        assert t.other_suite({10, 20}, f"{tmp_path}/./suite2.yaml", hist) == [(10, str(tmp_path / "suite.yaml"))]
        assert t.other_suite({10, 20}, str(tmp_path / "suite.yaml"), hist) == [(20, str(tmp_path / "suite2.yaml"))]
        assert t.other_suite({20}, str(tmp_path / "suite2.yaml"), str(tmp_path / "elsewhere")) == \
            [(20, f"{tmp_path / 'suite2.yaml'} into {hist}")]
        t.start(10, str(tmp_path / "suite2.yaml"), hist)  # the new run is the newest: the step leaves the list
        t.ended_without_score()
        assert t.other_suite({10}, str(tmp_path / "suite2.yaml"), hist) == []
        assert warned == ["the work pool pool-41f is paused: the evaluation runs wait until it is resumed "
                          "(`prefect work-pool resume pool-41f`)"]
        client.delete_work_pool("pool-41f")  # after the pause was said: the deployment is left without a pool
        t.ended_without_score()
        t.ended_without_score()
        assert warned[1:] == ["the work pool pool-41f was deleted: the deployment evaluate-checkpoint/evaluate-on-checkpoint "
                              "has no work pool now and no worker takes its runs; deploy it again "
                              "(`bash deployments/deploy.sh`)"]


def test_a_run_directory_holding_another_jobs_run_is_refused_before_anything_runs(tmp_path):
    """Red team 41g S22: two jobs given one --run-dir: the second overwrote the first's report and result, and its
    straggler analysis failed on the two jobs' mixed traces."""
    from tasks.pipeline.summary import foreign_run_dir

    req = _request(tmp_path, name="k2")
    assert foreign_run_dir(req) is None  # empty: the trainer writes its job.json
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "job.json").write_text(parse_job(_job(tmp_path, name="k1")).model_dump_json())
    why = foreign_run_dir(req)
    assert why is not None and "holds the run of job 'k1'" in why and "give each job its own --run-dir" in why
    assert foreign_run_dir(_request(tmp_path, name="k1")) is None  # its own: a rerun resumes there


def test_a_checkpoint_root_holding_the_run_or_history_directory_is_refused_before_training(prefect_server, tmp_path):
    """Red team 41h N13: `checkpoint: {uri: .}` beside the default ./runs/<name> trained every step, then exited 2
    naming `stragglers generate`. Refused before anything is placed or trained, naming the settings to change."""
    from tasks.pipeline.summary import outputs_in_root

    job = _job(tmp_path, name="n13", steps=20, every=10)
    job["training"]["checkpoint"]["uri"] = "."
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    Ledger(str(tmp_path / "l.db"))
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu"],
                tmp_path)
    proc.wait(timeout=300)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 2, err[-3000:]
    assert f"the run directory {tmp_path}/runs/n13" in err and f"(training.checkpoint.uri: {tmp_path})" in err, err[-3000:]
    assert "--run-dir" in err and "--history-dir" in err and "stragglers" not in err and "Traceback" not in err
    assert not list(tmp_path.glob("step_*")) and not (tmp_path / "runs" / "n13" / "train.log").exists()
    assert Ledger(str(tmp_path / "l.db")).allocations() == []
    # controls: a root beside the directories (the usual layout), a root inside the run directory (the demo's),
    # and an object store are not refused; a history directory inside the root alone is
    req = _request(tmp_path)
    assert outputs_in_root(req) is None
    assert outputs_in_root(req.model_copy(update={"run_dir": str(tmp_path)})) is None  # ckpt inside the run dir
    s3 = req.job.model_copy(deep=True)
    s3.training.checkpoint.uri = "s3://bucket/ck"
    assert outputs_in_root(req.model_copy(update={"job": s3})) is None
    why = outputs_in_root(req.model_copy(update={"history_dir": str(tmp_path / "ckpt" / "evals")}))
    assert why is not None and "history directory" in why and "run directory" not in why, why
    # the root is the checkpoints' own already (red team 41i R-b): the fix is to move the history, not the root
    assert "Move it outside the root" in why and "training.checkpoint.uri: ck, say" not in why, why
    assert "training.checkpoint.uri: ck, say" in err  # `uri: .`, submitted from that directory: the root moves


def test_a_submit_whose_output_reader_exits_stops_as_sigterm_does_and_exits_141(prefect_server, tmp_path):
    """Red team 41h N22: `frenzy submit ... 2>&1 | grep -m1 'step 3..'`: rich's console answered the broken pipe with
    SystemExit(1) from the thread that logged; submit exited 1 (a "bug") 85 s later and no line said why. Now: the
    trainer commits, the GPUs come back, exit 141 as `cat` does, and the flow run is not left Running."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL

    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="n22", steps=100000, every=50)))
    proc = subprocess.Popen([sys.executable, "-m", "cli", "submit", "job.yaml", "--ledger", str(tmp_path / "l.db"),
                             "--evaluation", "off", "--device", "cpu", "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    seen = b""
    while b"checkpoint step 50 committed" not in seen:  # the reader reads until training is well under way ...
        line = proc.stdout.readline()
        assert line, seen.decode(errors="replace")[-3000:]
        seen += line
    proc.stdout.close()  # ... and exits
    proc.wait(timeout=240)
    assert proc.returncode == 141, seen.decode(errors="replace")[-2000:]
    newest = max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    assert newest >= 50 and json.loads((tmp_path / "run" / "result.json").read_text())["stopped_early"] is True
    assert Ledger(str(tmp_path / "l.db")).allocations() == [] and _trainers_of(tmp_path / "run") == []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["submit-n22"])))
    assert [fr.state.type.value for fr in runs] in (["CRASHED"], ["CANCELLED"]), runs


def test_a_cancel_from_the_api_stops_a_cli_submit_as_sigterm_does(prefect_server, tmp_path):
    """Red team 41g S08: `prefect flow-run cancel` of a CLI-started submit was ignored (it ran on, exit 0, and the
    server kept the run Cancelling). A CLI run has no worker to send SIGTERM: it reads its own state."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.states import Cancelling

    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="apicancel", steps=100000, every=50)))
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")], tmp_path, FRENZY_CANCEL_POLL_S="1")  # not up to 10 s of waiting
    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    with get_client(sync_client=True) as client:
        [fr] = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["submit-apicancel"])))
        client.set_flow_run_state(fr.id, Cancelling(message="cancelled in the UI"), force=True)
    proc.wait(timeout=180)
    err = (tmp_path / "cli.err").read_text()
    newest = max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    assert proc.returncode == 143, err[-3000:]
    assert "cancelled from the Prefect UI or API" in err and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"frenzy submit: stopped at step {newest}, committed under "
                                            f"file://{tmp_path}/ckpt; rerun the same command to resume")
    assert Ledger(str(tmp_path / "l.db")).allocations() == [] and _trainers_of(tmp_path / "run") == []


def test_the_cancel_poll_period_is_ten_seconds_unless_frenzy_cancel_poll_s_says_otherwise(monkeypatch):
    from flows.stages import CANCEL_POLL_S, cancel_poll_s

    monkeypatch.delenv("FRENZY_CANCEL_POLL_S", raising=False)
    assert cancel_poll_s() == CANCEL_POLL_S == 10.0
    monkeypatch.setenv("FRENZY_CANCEL_POLL_S", "1.5")
    assert cancel_poll_s() == 1.5


@dataclass
class Finished:
    """A `frenzy submit` that ran to its end: its directory, its ledger's path, exit status, stdout and stderr."""

    dir: Path
    ledger: Path
    rc: int
    out: str
    err: str


@pytest.fixture(scope="module")
def cuda_asked_ledger_deleted(prefect_server, tmp_path_factory) -> Finished:
    """One `frenzy submit --device cuda` of a 40-step job on this machine's CPU allocation, whose ledger file is deleted
    once step 20 is committed: the run's last commit (step 40) is held 5 s (FRENZY_FAULT_PERSIST_DELAY), so the
    deletion comes while the job holds its GPUs. Two tests read it, each for its own lines: the device test and the
    ledger test (two runs before, one for each)."""
    tmp = tmp_path_factory.mktemp("cuda-ledger")
    led = tmp / "l.db"
    Ledger(str(led))
    (tmp / "job.yaml").write_text(yaml.safe_dump(_job(tmp, name="noledger", steps=40, every=20)))
    try:
        proc = _cli(["submit", "job.yaml", "--ledger", str(led), "--evaluation", "off", "--device", "cuda",
                     "--run-dir", str(tmp / "run")], tmp, FRENZY_FAULT_PERSIST_DELAY="40:5")
        _wait_for_commit(tmp / "ckpt", 20, proc)
        for f in tmp.glob("l.db*"):  # the database and its WAL files, as `rm ledger.db*`
            f.unlink()
        out, _ = proc.communicate(timeout=300)
    finally:  # as _no_process_outlives_its_test does for a test's own directory
        subprocess.run(["pkill", "-KILL", "-f", "--", f"{tmp}/"], check=False)
    return Finished(dir=tmp, ledger=led, rc=proc.returncode, out=out, err=(tmp / "cli.err").read_text())


def test_device_cuda_on_an_allocation_without_a_cuda_gpu_says_it_trains_on_the_cpu(cuda_asked_ledger_deleted):
    """Red team 41g S15: `--device cuda` on a machine without CUDA trained on the CPU and said nothing. (The decision
    and its words: test_pipeline's device test.)"""
    run = cuda_asked_ledger_deleted
    assert "--device cuda, but the allocation on " in run.err and "holds no CUDA GPU: training runs on the CPU" in \
        run.err, run.err[-3000:]
    assert "40 steps on 1 x cpu" in run.out, run.out


def test_a_ledger_deleted_while_a_job_holds_its_gpus_is_said_and_not_made_again(cuda_asked_ledger_deleted):
    """Red team 41g S13: the ledger file deleted mid-run was recreated silently (empty) and the summary said "GPUs
    released: yes" against a ledger that no longer held the allocation. Before, 380 more steps (12 s of a core) made
    the window for the deletion; now the held last commit does (the fixture)."""
    run = cuda_asked_ledger_deleted
    assert run.rc == 0, run.err[-3000:]
    said = f"the ledger file {run.ledger} was deleted while this process used it"
    assert said in run.err and "is no longer recorded (another job may be placed on its GPUs)" in run.err, \
        run.err[-3000:]
    assert f"note: {said}" in run.out and "GPUs released: NO" in run.out, run.out
    assert not run.ledger.exists()  # nothing made again mid-run; `frenzy cluster init` makes a ledger


def test_a_second_sigterm_while_the_trainer_commits_still_leaves_no_trainer(prefect_server, tmp_path):
    """Red team 41g S08b: `timeout` sends SIGTERM to the process and then to its group; the second one, landing while
    the trainer committed its step, released the GPUs at once while the trainer trained on and committed later steps,
    and the line named a step that was no longer the newest. The trainer is gone before the release now."""
    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="twice", steps=100000, every=50)))
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")], tmp_path)
    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    proc.send_signal(signal.SIGTERM)  # what `timeout` does: the command, then its whole process group
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=180)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 143, err[-3000:]
    assert _trainers_of(tmp_path / "run") == [], _describe(_trainers_of(tmp_path / "run"), tmp_path / "run")
    newest = max(m.step for m in ck.committed(Storage(f"file://{tmp_path}/ckpt")))
    assert err.strip().splitlines()[-1] == (f"frenzy submit: stopped at step {newest}, committed under "
                                            f"file://{tmp_path}/ckpt; rerun the same command to resume"), err[-3000:]
    assert Ledger(str(tmp_path / "l.db")).allocations() == []


def test_a_stopped_submit_keeps_its_gpus_while_its_trainer_trains_and_a_released_allocation_stops_the_trainer(
        prefect_server, tmp_path):
    """Red team 41i N21: `frenzy submit` stopped like Ctrl-Z (SIGSTOP of the CLI only; its trainer runs in its own
    session) past its `--lease`: the ledger freed the device while the trainer trained on, and placed a second job
    there. The trainer renews its allocation itself: three leases later the device is still allocated to the job.
    Then the allocation is released under it (as `frenzy cluster` could): the trainer stops by itself, its submitter
    still stopped, committing its step; the last line names the cause, the step and how to resume."""
    led = str(tmp_path / "l.db")
    Ledger(led)  # an explicit --ledger must exist (`frenzy cluster init` makes one)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="ctrlz", steps=100000, every=50)))
    proc = _cli(["submit", "job.yaml", "--ledger", led, "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run"), "--lease", "5"], tmp_path)
    root = Storage(f"file://{tmp_path}/ckpt")
    _wait_for_commit(tmp_path / "ckpt", 50, proc)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        start, first = time.monotonic(), max(m.step for m in ck.committed(root))
        while time.monotonic() - start < 3 * 5 or max(m.step for m in ck.committed(root)) < first + 100:
            assert time.monotonic() - start < 240, "the trainer made no progress while its submitter was stopped"
            time.sleep(0.5)
        held = Ledger(led).allocations()
        assert [a.job for a in held] == ["ctrlz"], held  # past three leases: the device is still this job's
        Ledger(led).release(held[0].id)
        deadline = time.monotonic() + 180
        while _living(_trainers_of(tmp_path / "run"), proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _living(_trainers_of(tmp_path / "run"), proc.pid)  # exited: a zombie until its stopped parent reaps it
        assert left == [], _describe(left, tmp_path / "run")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.wait(timeout=300)
    err = (tmp_path / "cli.err").read_text()
    newest = max(m.step for m in ck.committed(root))
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert f"allocation {held[0].id} in the ledger sqlite:///{led} was released by hand while its trainer ran" in last, last
    assert f"Training stopped at step {newest} after committing it" in last, last
    assert f"rerun the same command to place the job again and resume from step {newest}" in last, last
    assert json.loads((tmp_path / "run" / "result.json").read_text())["final_step"] == newest


def test_a_finished_run_that_had_evaluation_off_is_evaluated_when_submitted_again_with_it_on(prefect_server, tmp_path):
    """Red team 41i N6: a job finished with `--evaluation off`, submitted again with evaluation on, said "nothing to
    train or evaluate again" and scored nothing. Its committed steps were never evaluated: the rerun evaluates them
    (the trainer resumes at the final step and trains nothing). A third submit reports the finished, scored run."""
    from flows.submit import submit

    off = submit(_request(tmp_path).model_copy(update={"evaluation": "off"}))
    assert off.evaluations == [] and [c.step for c in off.train.checkpoints] == [20, 40]
    on = submit(_request(tmp_path))
    assert not on.already_finished and on.train.resumed_from_step == 40 and on.train.final_step == 40
    # the trainer trained nothing: the run reports the training that committed step 40 (tasks/pipeline/rerun.py)
    assert on.train.checkpoints == off.train.checkpoints and on.train.last_loss == off.train.last_loss
    assert [e.step for e in on.evaluations] == [20, 40]
    assert all(0 < e.scores["heldout-loss"]["loss"] < 6 for e in on.evaluations)
    # red team 41j S06: the summary said nothing of the job having finished already
    assert on.notes[0].endswith("had finished: nothing trained, steps [20, 40] evaluated now"), on.notes
    again = submit(_request(tmp_path))  # now every committed step has its score: reported, nothing run
    assert again.already_finished and [e.step for e in again.evaluations] == [20, 40]


def test_a_submit_whose_stdout_is_full_says_the_run_finished_and_names_stdout_and_the_report(prefect_server, tmp_path):
    """Red team 41i N12: after the whole run, "the disk is full: free space there", naming nothing. Now: the run
    finished, its report, and that standard output (/dev/full) refused the answer."""
    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="fullout", steps=10, every=10)))
    from prefect.settings import PREFECT_API_URL

    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "cli", "submit", "job.yaml", "--ledger", str(tmp_path / "l.db"),
                            "--evaluation", "off", "--device", "cpu", "--run-dir", str(tmp_path / "run"), "--json"],
                           cwd=tmp_path, env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value() or ""},
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=600)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2, r.stderr[-3000:]
    report = Ledger(str(tmp_path / "l.db")).run("fullout").report
    assert last.startswith(f"frenzy submit: error: the command finished (its report: {report}), but its answer could "
                           "not be written to standard output (/dev/full): no space left on the device"), last


def test_the_release_after_training_is_the_ledgers_own_call_not_a_prefect_task(prefect_server, tmp_path):
    """Red team 41m R1: the release ran as a Prefect task, whose task run is made through the API: with the server
    restarting, the client's retries held a finished run's GPUs for 71 s. It is the ledger's call now, in the flow,
    and nothing named `release` appears among the flow run's task runs."""
    from prefect import flow, get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.context import get_run_context

    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster
    from flows.stages import FlowStages
    from tasks.pipeline.run import Attempt, Run

    cluster = load_cluster("local")
    req = _request(tmp_path, name="t", steps=20, every=10)
    ledger = Ledger(req.ledger)
    ledger.sync(cluster)
    alloc = ledger.allocate("t", [GpuRequest(1, 0)], lease_s=600)
    assert alloc is not None and [a.id for a in ledger.allocations()] == [alloc.id]
    run = Run.model_construct(job="t", attempt=Attempt.model_construct(allocation=alloc))

    @flow
    def releasing() -> str:
        FlowStages(req, ledger, cluster).release(run)
        return str(get_run_context().flow_run.id)

    flow_run_id = releasing()
    assert ledger.allocations() == [] and ledger.allocation(alloc.id).state == "released"
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    assert not [r.name for r in runs if r.name.startswith("release")]


KILLS_AT_IMPORT = """import os
import signal

with open(os.environ["RT_IMPORTS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
os.killpg(0, signal.SIGKILL)
"""


def _installed_plugin(where: Path) -> None:
    """A dataset plugin as a package installs it: `rtkillpkg` with an entry point `rtkill` in its metadata; the
    package kills its own process group when it is imported (and writes the importer's pid to $RT_IMPORTS first)."""
    (where / "rtkillpkg").mkdir(parents=True)
    (where / "rtkillpkg" / "__init__.py").write_text(KILLS_AT_IMPORT)
    (where / "rtkillpkg" / "data.py").write_text("def make(options, ctx):\n    raise AssertionError('unreachable')\n")
    meta = where / "rtkillpkg-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: rtkillpkg\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text("[frenzy.eval_datasets]\nrtkill = rtkillpkg.data:make\n")


def test_submit_checks_a_suites_plugins_without_running_them_and_one_that_kills_its_group_fails_alone(
        prefect_server, tmp_path):
    """`frenzy submit` checked a suite's plugin datasets before training by importing them in its own process (every
    installed entry point's module, the package of a dotted `module:factory`): a plugin package that kills its process
    group at import killed submit before anything started, with no message. Now the check reads the packages' metadata
    and the path only; the plugin is loaded where the evaluation loads plugins (a metric process of its own session),
    fails there alone and named, the rest is scored, and submit reports it and exits 2. A real package on PYTHONPATH,
    named once by its entry point and once as `module:factory`."""
    _installed_plugin(tmp_path / "plugins")
    Ledger(str(tmp_path / "l.db"))
    (tmp_path / "pk.yaml").write_text(yaml.safe_dump({"name": "pk", "datasets": [
        {"name": "heldout-loss", "examples": 8, "mode": "ppl", "infer_s_per_example": 0.004},
        {"name": "viaep", "dataset": "rtkill", "examples": 2, "mode": "gen", "infer_s_per_example": 0.01},
        {"name": "viamod", "dataset": "rtkillpkg.data:make", "examples": 2, "mode": "gen",
         "infer_s_per_example": 0.01}]}))
    job = _job(tmp_path, name="plugkill", steps=10, every=10) | {"evaluation": {"suite": "pk.yaml"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join([root, str(tmp_path / "plugins"), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = _cli(["submit", "job.yaml", "--ledger", str(tmp_path / "l.db"), "--evaluation", "in-flow", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run"), "--json"], tmp_path, PYTHONPATH=path,
                RT_IMPORTS=str(tmp_path / "imports"))
    out, _ = proc.communicate(timeout=600)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 2, f"rc {proc.returncode}: {err[-3000:]}"
    (ev,) = json.loads(out)["evaluations"]
    assert ev["step"] == 10 and set(ev["scores"]) == {"heldout-loss"} and set(ev["failed"]) == {"viaep", "viamod"}
    assert "rtkill: killed its process group while loading (killed by SIGKILL" in ev["failed"]["viaep"], ev["failed"]
    assert "rtkillpkg.data:make: killed its process group while loading" in ev["failed"]["viamod"], ev["failed"]
    assert "viaep FAILED (not scored): rtkill: killed its process group while loading" in err, err[-3000:]
    importers = {int(p) for p in (tmp_path / "imports").read_text().split()}
    assert len(importers) == 2 and proc.pid not in importers  # once per dataset, never in submit's own process


@pytest.mark.slow
def test_the_gpus_go_back_as_the_trainer_ends_while_the_prefect_server_is_stopped(prefect_server, tmp_path):
    """Red team 41n B3: the Prefect server stopped while `frenzy submit` trained; the trainer ended, and its
    allocation was released only 25.6 s later, once the server answered again: the flow asked the server, every poll,
    whether the train task had ended, and released after that. The test's own real Prefect server is stopped
    (SIGSTOP: connections are accepted and never answered) after the first commit and left stopped until the ledger
    shows the allocation released: the train task gives it back as the trainer ends. Once the server answers again
    the run finishes and is recorded as before."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer._instances[None].server_process
    assert server is not None and server.poll() is None
    led = str(tmp_path / "l.db")
    Ledger(led)  # an explicit --ledger must exist (`frenzy cluster init` makes one)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path, name="outage", steps=200, every=20)))
    proc = _cli(["submit", "job.yaml", "--ledger", led, "--evaluation", "off", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run")], tmp_path)
    _wait_for_commit(tmp_path / "ckpt", 20, proc)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        held = Ledger(led).allocations()
        assert [a.job for a in held] == ["outage"], held
        ended = tmp_path / "run" / "result.json"  # rank 0 writes it as the trainer ends
        deadline = time.monotonic() + 300
        while not ended.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "cli.err").read_text()[-3000:]
            time.sleep(0.2)
        deadline = time.monotonic() + 30  # the flow's API calls, unanswered, wait 60 s each before their retries
        while Ledger(led).allocation(held[0].id).state != "released":
            assert time.monotonic() < deadline, "the trainer ended, but its GPUs are held while the server is stopped"
            time.sleep(0.2)
        assert server.poll() is None  # still stopped, not gone: the release did not wait for it
    finally:
        os.kill(server.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=300)
    err = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 0, err[-3000:]
    assert "GPUs released: yes" in out, out
    assert f"released allocation {held[0].id} as the trainer ended" in err, err[-3000:]
    assert [r.stage for r in Ledger(led).runs("outage")] == ["reported"]  # what the flow records, once it answers


def test_the_in_flow_evaluator_starts_the_next_evaluations_processes_only_when_another_evaluation_follows(tmp_path):

    from tasks.pipeline.evaluations import InFlowEvaluator

    st = Storage(f"file://{tmp_path}/ckpt")

    def commit(step: int) -> None:
        _commit_tiny(st, step)

    calls: list[str] = []

    def evaluate(uri: str):
        calls.append(uri.rsplit("_", 1)[-1].lstrip("0"))
        if uri.endswith("step_00000020"):
            raise ValueError("cannot read it")  # a failed one is followed by the next all the same
        return uri

    ev = InFlowEvaluator(st.uri, str(tmp_path / "evals"), "t", "quick", evaluate, calls.append,
                         ahead=lambda: calls.append("ahead"))
    commit(10)
    ev.catch_up(training=lambda: True)  # the trainer's next commit comes: the next evaluation's processes start now
    assert calls == ["10", "ahead"]
    for step in (20, 30):
        commit(step)
    ev.catch_up(training=lambda: "30" not in calls)  # it ended while step 30 was evaluated: none after the last
    assert calls[2:] == ["20", "evaluation of step 20 failed: cannot read it", "ahead", "30"], calls
    commit(40)
    ev.catch_up()
    assert calls[6:] == ["40"]  # the trainer has ended: nothing started after the last step


def test_runs_no_worker_will_take_are_said_at_once_and_given_up_for_in_flow_a_worker_between_polls_is_alive(
        prefect_server, tmp_path):
    """Issue 41: `frenzy submit --evaluation deployment` with no worker on the pool waited eval_timeout_s (1800 s) for
    Scheduled runs no worker would take. On the real server, a worker's heartbeats as the server records them and
    the waiting submit's clock moved on: a worker 60 s after its heartbeat (between polls) is alive; 100 s after,
    with the step's run not taken, NoWorker (the caller evaluates the steps left in-flow); a RUNNING run holds it
    off. A pool that no worker ever polled is said at once, and `auto` evaluates in-flow from the start."""
    from datetime import UTC, datetime, timedelta

    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.states import Running, Scheduled

    from flows.stages import NoWorker, TriggeredEvaluations, evaluation_mode

    root = f"file://{tmp_path}/ck-41p"
    with get_client(sync_client=True) as client:
        for name in ("pool-41p", "pool-41p-empty"):
            client.create_work_pool(WorkPoolCreate(name=name, type="process"), overwrite=True)
        flow_id = client.create_flow_from_name("evaluate-checkpoint")
        dep = client.create_deployment(flow_id, name="evaluate-on-checkpoint", work_pool_name="pool-41p")
        fr = client.create_flow_run_from_deployment(dep, parameters={"request": {"uri": f"{root}/step_00000010"}})
        client.send_worker_heartbeat("pool-41p", "w-41p", heartbeat_interval_seconds=30)
        beat = client.read_workers_for_work_pool("pool-41p")[0].last_heartbeat_time
        clock, warned = [beat + timedelta(seconds=60)], []
        t = TriggeredEvaluations(root, datetime.now(UTC) - timedelta(seconds=60), warned.append,
                                 now=lambda: clock[0], waited=frozenset({10}))
        assert t.ended_without_score() == {} and warned == []  # 2 of its heartbeats missed: between polls, alive
        clock[0] = beat + timedelta(seconds=100)
        client.set_flow_run_state(fr.id, Running(), force=True)
        assert t.ended_without_score() == {}  # its process may still score the step: waited for as before
        assert len(warned) == 1 and "no worker polls the work pool pool-41p (its newest worker, w-41p, last polled " \
            "100 s ago)" in warned[0] and "`prefect worker start --pool pool-41p`" in warned[0], warned
        client.set_flow_run_state(fr.id, Scheduled(), force=True)
        with pytest.raises(NoWorker, match="none for 100 s"):
            t.ended_without_score()
        assert len(warned) == 1  # said once
        assert client.read_flow_run(fr.id).state.type.value == "SCHEDULED"  # left for a worker started later
        # a pool no worker ever polled: said at the first look, given up NO_WORKER_S (90 s) of watching later
        client.create_deployment(flow_id, name="evaluate-on-checkpoint", work_pool_name="pool-41p-empty")
        clock[0], warned[:] = datetime.now(UTC), []
        t = TriggeredEvaluations(root, clock[0] - timedelta(seconds=60), warned.append, now=lambda: clock[0])
        assert t.ended_without_score() == {} and len(warned) == 1 and "no worker ever polled it" in warned[0]
        clock[0] += timedelta(seconds=91)
        with pytest.raises(NoWorker, match="no worker polls the work pool pool-41p-empty"):
            t.ended_without_score()
        said: list[str] = []
        req = _request(tmp_path)
        assert evaluation_mode(req.model_copy(update={"evaluation": "auto"}), said.append) == "in-flow"
        assert evaluation_mode(req.model_copy(update={"evaluation": "deployment"}), said.append) == "deployment"
        assert len(said) == 2 and all("no worker polls the work pool pool-41p-empty" in s for s in said), said
        assert "evaluating in this run (in-flow) instead" in said[0] and "evaluates the steps left itself" in said[1]
        client.create_deployment(flow_id, name="evaluate-on-checkpoint", work_pool_name="pool-41p")
        client.send_worker_heartbeat("pool-41p", "w-41p", heartbeat_interval_seconds=30)
        assert evaluation_mode(req.model_copy(update={"evaluation": "auto"}), said.append) == "deployment"
        assert len(said) == 2
        client.delete_deployment(dep)  # no later test meets this pool's worker, gone quiet
