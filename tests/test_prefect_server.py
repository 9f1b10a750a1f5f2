"""Frenzy on a real Prefect server, as a user runs it: deployed with deployments/deploy.sh, a process worker, the
`submit` deployment started the way the UI's Run button starts it, each commit event triggering
`evaluate-on-checkpoint`, and the `evaluate-pending` schedule actually firing (a scheduler that breaks, as it did
with SQLAlchemy 2.1, fails this test)."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.prefect_stack import prefect_stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with prefect_stack(tmp_path_factory.mktemp("prefect-stack")) as s:
        yield s


@pytest.fixture
def client(stack):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as c:
        yield c


def _wait_final(client, run_id, timeout_s: float, stack) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.read_flow_run(run_id)
        if run.state and run.state.is_final():
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"flow run {run.name} still {run.state_name} after {timeout_s:.0f} s; worker log:\n"
                                 + (stack.logs / "worker.log").read_text()[-4000:])
        time.sleep(1.0)


def _evaluated_steps(history: Path) -> list[int]:
    return sorted(json.loads(line)["step"] for line in history.read_text().splitlines())


def _artifact_text(client, prefix: str) -> str:
    """The newest artifact whose key starts with `prefix` (a run's keys end in a hash of its checkpoint root)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_=prefix)))
    arts = [a for a in arts if a.key and a.key.startswith(prefix)]
    assert arts, f"no artifact {prefix}*"
    return str(max(arts, key=lambda a: a.created).data)


def _warnings_of(client, run_id) -> list[str]:
    """The WARNING-and-above log lines of a flow run (its tasks' included)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterLevel

    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]),
                                                 level=LogFilterLevel(ge_=30)), limit=200)
    return [log.message for log in logs]


def _runs_of(client, deployment_name: str) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    dep = client.read_deployment_by_name(deployment_name)
    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))


SUBMIT_FORM = {"request": {
    "job": {"name": "served", "model": {"preset": "gpt-tiny"},
            "training": {"seq_len": 64, "global_batch": 8, "precision": "fp32", "steps": 40, "lr": 0.003,
                         "log_every_steps": 10, "trace_every_steps": 10,
                         "checkpoint": {"every_steps": 20, "uri": "file://./runs/served/ckpt", "keep": 5}},
            "evaluation": {"suite": "quick"}},
    "cluster": "local"}}


def test_deploy_sh_registers_every_deployment_and_the_pool(stack, client):
    names = {f"{client.read_flow(d.flow_id).name}/{d.name}" for d in client.read_deployments()}
    assert {"submit/submit", "train/train", "plan/plan", "evaluate-checkpoint/evaluate-on-checkpoint",
            "evaluate-pending/evaluate-pending", "stragglers/stragglers", "simulate/simulate"} <= names
    assert client.read_work_pool("frenzy").type == "process"
    # the working directory recorded for the runs is the checkout deploy.sh ran in, not an environment variable
    dep = client.read_deployment_by_name("submit/submit")
    assert str(stack.workdir.resolve()) in str(dep.pull_steps)


def test_submit_from_the_deployment_form_trains_and_each_commit_is_evaluated(stack, client):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        run = run_deployment("submit/submit", parameters=SUBMIT_FORM, timeout=0)
    run = _wait_final(client, run.id, 420, stack)
    assert run.state.is_completed(), run.state.message
    # the commit events triggered evaluate-on-checkpoint, once per checkpoint, and those runs completed
    evals = _runs_of(client, "evaluate-checkpoint/evaluate-on-checkpoint")
    assert sorted(r.parameters["request"]["uri"].rsplit("_", 1)[-1] for r in evals) == ["00000020", "00000040"]
    for r in evals:
        assert _wait_final(client, r.id, 120, stack).state.is_completed()
        assert r.parameters["request"]["suite"] == "quick"
    hist = (stack.data / "evals" / "served" / "history.jsonl").read_text().splitlines()
    assert len(hist) == 2
    keys = {a.key for a in client.read_artifacts()}
    assert {"report-served", "plans-served"} <= {k.rsplit("-", 1)[0] for k in keys if k}  # <kind>-<job>-<hash>
    # the form's relative paths are the data root's, not the worker's working directory (the checkout)
    assert (stack.data / "runs" / "served" / "report.html").exists()
    assert not (stack.workdir / "runs").exists() and not (stack.workdir / "evals").exists()


def test_the_hourly_schedule_fires_and_evaluates_a_checkpoint_without_scores(stack, client):
    from prefect.states import Scheduled

    from cluster.ledger import Ledger
    from tests.trainer_util import run as train_run
    from tests.trainer_util import tiny_job

    # a checkpoint that nobody evaluated, of a job the ledger knows (submit records each job's root there): the
    # deployment's default parameters (roots: []) cover every root in the ledger
    root = stack.data / "elsewhere" / "tiny" / "ckpt"
    train_run(tiny_job(f"file://{root}", steps=10, every=10), stack.data / "elsewhere" / "tiny-train")
    Ledger(stack.env["FRENZY_LEDGER"]).note_checkpoints("t", f"file://{root}", "core")
    # the scheduler service itself must create the hourly runs (it failed every minute under SQLAlchemy 2.1)
    deadline = time.monotonic() + 60
    while not (scheduled := [r for r in _runs_of(client, "evaluate-pending/evaluate-pending")
                             if r.state_name == "Scheduled"]):
        assert time.monotonic() < deadline, "the scheduler created no run for evaluate-pending:\n" + \
            (stack.logs / "server.log").read_text()[-3000:]
        time.sleep(1.0)
    first = min(scheduled, key=lambda r: r.expected_start_time)
    # bring the next hourly run forward to now instead of waiting up to an hour for it
    client.set_flow_run_state(first.id, Scheduled(scheduled_time=datetime.now(UTC)), force=True)
    done = _wait_final(client, first.id, 300, stack)
    assert done.state.is_completed(), done.state.message
    hist = (stack.data / "evals" / "t" / "history.jsonl").read_text()
    assert '"step": 10' in hist and '"suite": "core"' in hist


def test_a_user_runs_submit_from_the_prefect_ui_and_finds_its_artifacts(stack, client):
    """Headless Chromium on the real UI: the deployment's form shows the JobSpec fields, its Submit button starts
    a run, and the flow run page lists the plan and report artifacts. Screenshots are kept in
    test-artifacts/screenshots/ (FRENZY_TEST_ARTIFACTS moves it)."""
    chromium = "/usr/bin/chromium"
    import shutil

    if not shutil.which(chromium):
        pytest.skip("Chromium is not installed: apt-get install -y chromium (CI installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' installs playwright")
    from tests.prefect_stack import REPO

    shots = Path(os.environ.get("FRENZY_TEST_ARTIFACTS") or REPO / "test-artifacts") / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    dep = client.read_deployment_by_name("submit/submit")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{stack.ui_url}/deployments/deployment/{dep.id}/run")
        form = page.get_by_text("The job (the job YAML as a form)")
        form.wait_for(timeout=60_000)
        for label in ("Preset (Optional)", "Global Batch (Optional)", "Seq Len (Optional)", "Cluster (Optional)"):
            assert page.get_by_text(label, exact=True).count() >= 1, label
        # one field per concept (there were two "Suite" and two "Evaluation"), and no null-branch inputs
        labels = [t.strip() for t in page.locator("label").all_inner_texts() if t.strip()]
        assert len(labels) > 20, labels
        assert [t for t, c in Counter(labels).items() if c > 1] == [], labels
        assert page.get_by_text("Property is type None").count() == 0
        page.screenshot(path=str(shots / "1-submit-form.png"), full_page=True)
        before = {r.id for r in _runs_of(client, "submit/submit")}
        page.wait_for_load_state("networkidle")  # the form's handlers are attached once its requests settle
        submit_button = page.get_by_role("button", name="Submit")
        submit_button.click()
        # the UI then moves to the deployment's runs (how fast varies); the run itself is what must exist
        deadline, clicked_at = time.monotonic() + 90, time.monotonic()
        while not (new := [r for r in _runs_of(client, "submit/submit") if r.id not in before]):
            if time.monotonic() - clicked_at > 30 and page.url.rstrip("/").endswith("/run"):
                # still on the form with no run: the click landed before the page was ready (seen once under CI
                # load); a person would click again
                submit_button.click()
                clicked_at = time.monotonic()
            if time.monotonic() > deadline:
                page.screenshot(path=str(shots / "2-after-submit.png"), full_page=True)
                errors = [t for t in page.locator("[class*=error], [role=alert], .p-message").all_inner_texts() if t]
                raise AssertionError(f"the form's Submit created no flow run; the page shows: {errors[:10]}")
            time.sleep(0.5)
        run_id = new[0].id
        run = _wait_final(client, run_id, 420, stack)
        assert run.state.is_completed(), run.state.message
        steps = _evaluated_steps(stack.data / "evals" / "tiny-submit" / "history.jsonl")
        assert steps == [50, 100]  # each commit of the default run, evaluated once
        report = _artifact_text(client, "report-tiny-submit-")
        assert all(f"step {s} " in report for s in steps), report
        warnings = _warnings_of(client, run_id)
        assert len(warnings) < 50, warnings[:20]
        page.goto(f"{stack.ui_url}/runs/flow-run/{run_id}")
        page.get_by_text("Artifacts", exact=True).first.click()
        page.get_by_text(re.compile(r"^report-tiny-submit-[0-9a-f]{8}$")).first.wait_for(timeout=60_000)
        assert page.get_by_text(re.compile(r"^plans-tiny-submit-[0-9a-f]{8}$")).count() >= 1
        page.screenshot(path=str(shots / "2-flow-run-artifacts.png"), full_page=True)
        page.get_by_text(re.compile(r"^report-tiny-submit-[0-9a-f]{8}$")).first.click()  # the report itself, rendered
        page.get_by_text("Scores by checkpoint").first.wait_for(timeout=30_000)
        for s in steps:  # the report the user sees lists every evaluated step
            assert page.get_by_text(f"step {s}", exact=True).count() >= 1, s
        page.screenshot(path=str(shots / "3-run-report.png"), full_page=True)
        browser.close()
    assert (shots / "2-flow-run-artifacts.png").stat().st_size > 10_000
    print(f"screenshots: {shots}")


def test_the_quickstart_notebook_runs_against_the_server(stack, tmp_path):
    """examples/notebooks/quickstart.ipynb executed top to bottom by a real kernel, its flows and its
    run_deployment cell talking to the server; any error cell fails the test."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    from tests.prefect_stack import REPO

    nb = nbformat.read(REPO / "examples" / "notebooks" / "quickstart.ipynb", as_version=4)
    env = {"FRENZY_NOTEBOOK_DIR": str(tmp_path / "nb"), "PREFECT_API_URL": stack.api_url}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this environment
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "released: True" in outputs and "Scores by checkpoint" in outputs
    nbformat.write(nb, tmp_path / "quickstart.executed.ipynb")


def _flow_run_process(run_id) -> int | None:
    """The pid of the process a worker started for flow run `run_id` (its environment names the run), or None."""
    mark = f"PREFECT__FLOW_RUN_ID={run_id}".encode()
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and mark in (d / "environ").read_bytes().split(b"\0"):
                return int(d.name)
        except OSError:
            continue
    return None


def test_a_stopped_pending_evaluation_run_is_named_run_again_and_its_process_ended_by_its_worker(
        stack, client, tmp_path, monkeypatch):
    """Red team 41n C5, the worker's half: an evaluate-on-checkpoint flow-run process SIGSTOPped before its run started
    left the run PENDING for STUCK_S (180 s) before the waiting submit named it, and the stopped process lingered on the
    worker until continued. Now the threshold is FRENZY_EVAL_STUCK_S (here 5 s) and the stuck run is set Cancelling, on
    which its worker (Prefect 3.8 cancels never-started runs itself) kills the process; the run is reported crashed (to
    run again), and the Cancelled the worker sets is not read as a person's stop."""
    import signal

    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.stages import TriggeredEvaluations
    from tasks.procs import alive
    from tests import trainer_util as tu

    monkeypatch.setenv("FRENZY_EVAL_STUCK_S", "5")
    root = f"file://{tmp_path}/ck"
    since = datetime.now(UTC)
    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        run = run_deployment("evaluate-checkpoint/evaluate-on-checkpoint", timeout=0, parameters={"request": {
            "uri": f"{root}/step_00000010", "suite": "quick", "history_dir": str(tmp_path / "evals")}})
        found: list[int] = []

        def started() -> bool:
            if (pid := _flow_run_process(run.id)) is not None:
                found.append(pid)
            return bool(found)

        tu.wait_for(started, timeout=300, what="the worker to start the flow-run process")
        os.kill(found[0], signal.SIGSTOP)
        stopped = time.monotonic()
        assert client.read_flow_run(run.id).state.type.value == "PENDING"  # stopped before it could start
        warned: list[str] = []
        t = TriggeredEvaluations(root, since, warned.append)
        seen: dict = {}

        def named_() -> bool:
            seen.update(t.ended_without_score())
            return bool(seen)

        tu.wait_for(named_, timeout=120, what="the run named")
        named = time.monotonic() - stopped
        assert seen[10][0] == "crashed" and "never started" in seen[10][1] and "FRENZY_EVAL_STUCK_S=5" in seen[10][1]
        tu.wait_for(lambda: not alive(found[0]), timeout=180, what="its worker to end the stopped process")
        gone = time.monotonic() - stopped
        final = _wait_final(client, run.id, 60, stack)
        assert final.state.type.value == "CANCELLED" and t.ended_without_score()[10] == seen[10]
    print(f"stopped -> named {named:.1f} s, stopped -> process gone {gone:.1f} s")
