"""A small team on one shared service, as the mission's main use has it: a real `prefect server`, a Postgres ledger,
S3 on loopback, two process workers started in directories of their own, and three users submitting at once from
their own directories with relative paths in their jobs: Alice with `frenzy submit` (checkpoints on S3), Bob from a
notebook through the `submit` deployment, Carol with `frenzy submit` and a suite whose dataset plugin is not
installed where evaluations run. Then the hourly `evaluate-pending` over every run the ledger knows, a corrupt
checkpoint root among them.

Holds when every good job completes with a score for every committed step, readable where its user is; Carol's ends
promptly with the cause; evaluate-pending evaluates every good root and names the bad one; the GPUs are back in the
ledger; no file lands in a worker's working directory or in the deployed checkout. The scenario's wall time goes to
test-artifacts/shared-service.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.prefect_stack import REPO, prefect_stack

pytestmark = pytest.mark.slow
pytest.importorskip("moto.server")
nbformat = pytest.importorskip("nbformat")

CORPUS = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n\n" for i in range(600))  # code: the quick suite's


def _job(name: str, **training: object) -> dict:
    t = {"seq_len": 64, "global_batch": 8, "precision": "fp32", "steps": 20, "lr": 3e-3, "log_every_steps": 5,
         "trace_every_steps": 10, "data": {"source": "text", "path": "corpus.txt"},
         "checkpoint": {"every_steps": 10, "keep": 5}, **training}
    return {"name": name, "model": {"preset": "gpt-tiny"}, "training": t, "evaluation": {"suite": "quick"}}


def _user_dir(tmp: Path, name: str, job: dict) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "corpus.txt").write_text(CORPUS)
    (d / "job.yaml").write_text(yaml.safe_dump(job))
    return d


@pytest.fixture(scope="module")
def service(tmp_path_factory, postgres_admin):
    from moto.server import ThreadedMotoServer

    from tests.pg_server import fresh_database
    from tests.s3_endpoint import free_port

    tmp = tmp_path_factory.mktemp("team")
    port = free_port()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    s3.start()
    s3env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
    old = {k: os.environ.get(k) for k in s3env}
    os.environ.update(s3env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("team")
    ledger = fresh_database(postgres_admin)
    try:
        with prefect_stack(tmp, workers=2, extra_env={"FRENZY_LEDGER": ledger, **s3env}) as stack:
            yield stack, ledger, tmp
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        s3.stop()


def _cli(user: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "submit", "job.yaml", "--evaluation", "deployment",
                             "--max-wait", "1800", "--json"], cwd=user, env={**env, "PYTHONPATH": str(REPO)},
                            stdout=open(user / "out.json", "w"), stderr=open(user / "err.txt", "w"))


NOTEBOOK = '''
import json
from pathlib import Path
from prefect.deployments import arun_deployment
from tasks.jobspec import parse_job
from tasks.pipeline.request import SubmitRequest

job = parse_job(json.loads(Path("job.json").read_text()))
request = SubmitRequest(job=job, cluster="local", max_wait_s=1800).resolved(Path.cwd())  # absolute, here
run = await arun_deployment("submit/submit", parameters={"request": request.model_dump(mode="json", exclude_none=True)},
                            timeout=1500)  # a notebook's kernel runs an event loop: the async call
print("STATE", run.state_name, run.state.message)
'''


def _notebook(user: Path, env: dict, out: list) -> threading.Thread:
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NOTEBOOK)])

    def go() -> None:
        saved = dict(os.environ)
        try:
            os.environ.update({**env, "PYTHONPATH": str(REPO)})
            NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(user)}}).execute()
            out.append("".join(o.get("text", "") for o in nb.cells[0].get("outputs", [])))
        except Exception as err:  # noqa: BLE001 - reported by the test
            out.append(f"ERROR {err!r}")
        finally:
            os.environ.clear()
            os.environ.update(saved)

    th = threading.Thread(target=go)
    th.start()
    return th


def _history_steps(history: Path) -> list[int]:
    return sorted(json.loads(ln)["step"] for ln in history.read_text().splitlines()) if history.exists() else []


def _wait_final(client, run_id, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not (run := client.read_flow_run(run_id)).state.is_final():
        assert time.monotonic() < deadline, f"{run.name} still {run.state_name}"
        time.sleep(2)
    return run


def _side_runs(tmp: Path, ledger: str) -> tuple[str, str, Path]:
    """Two runs the ledger knows that were never evaluated: Erin's healthy one, Dave's with a corrupt shard."""
    from cluster.ledger import Ledger, RunRecord
    from tests.trainer_util import run as train_run
    from tests.trainer_util import tiny_job

    led, roots = Ledger(ledger), {}
    for who in ("erin", "dave"):
        root = tmp / who / "ckpt"
        train_run(tiny_job(f"file://{root}", steps=10, every=10), tmp / who / "run")
        roots[who] = f"file://{root}"
        led.record_run(RunRecord(job=who, stage="reported", checkpoint_root=roots[who], run_dir=str(tmp / who / "run"),
                                 history_dir=str(tmp / who / "evals"), suite="quick", steps=10))
    shard = next((tmp / "dave" / "ckpt" / "step_00000010").glob("*.bin"))
    data = bytearray(shard.read_bytes())
    data[64] ^= 0xFF
    shard.write_bytes(bytes(data))
    return roots["erin"], roots["dave"], tmp / "erin" / "evals"


def test_three_users_one_server_one_ledger_and_storage(service):
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from cluster.ledger import Ledger

    stack, ledger, tmp = service
    env = {**stack.env}
    env.pop("FRENZY_DATA")  # users have their own directories
    alice = _user_dir(tmp, "alice", _job("alice-run", checkpoint={"every_steps": 10, "keep": 5, "uri": "s3://team/alice"}))
    bob = _user_dir(tmp, "bob", _job("bob-run"))
    (bob / "job.json").write_text(json.dumps(_job("bob-run")))
    carol = _user_dir(tmp, "carol", {**_job("carol-run"), "evaluation": {"suite": "suite.yaml"}})
    (carol / "suite.yaml").write_text(yaml.safe_dump({"name": "carols", "datasets": [  # fails only where it runs
        {"name": "qa", "examples": 2, "mode": "gen", "infer_s_per_example": 0.1, "dataset": "carol_plugin:QA"}]}))
    t0 = time.monotonic()
    procs = {"alice": _cli(alice, env), "carol": _cli(carol, env)}
    nb_out: list[str] = []
    nb = _notebook(bob, env, nb_out)
    ended: dict[str, float] = {}
    while len(ended) < len(procs):  # when each one exits (not in the order they are waited for)
        for name, p in procs.items():
            if name not in ended and p.poll() is not None:
                ended[name] = time.monotonic()
        assert time.monotonic() - t0 < 1800, f"still running after 30 minutes: {set(procs) - set(ended)}"
        time.sleep(0.5)
    nb.join(timeout=1800)
    wall_s = time.monotonic() - t0

    # Alice: trained on S3, every committed step scored, in her own directory
    a_err = (alice / "err.txt").read_text()
    assert procs["alice"].returncode == 0, a_err[-3000:]
    a = json.loads((alice / "out.json").read_text())
    steps = [c["step"] for c in a["train"]["checkpoints"]]
    assert steps == [10, 20] and a["train"]["checkpoint_uri"] == "s3://team/alice" and a["released"]
    assert _history_steps(alice / "evals" / "alice-run" / "history.jsonl") == steps
    assert Path(a["report"]).is_relative_to(alice)
    # Bob (notebook, through the deployment, trained by a worker elsewhere): his files in his directory
    assert nb_out and "STATE Completed" in nb_out[0], nb_out
    assert _history_steps(bob / "evals" / "bob-run" / "history.jsonl") == [10, 20]
    assert (bob / "runs" / "bob-run" / "report.html").exists()
    rec = Ledger(ledger).run("bob-run")
    assert rec is not None and rec.stage == "reported" and rec.report == str(bob / "runs" / "bob-run" / "report.html")
    # Carol: trained, her evaluation fails on her dataset: the cause, promptly, not after eval_timeout_s (30 min)
    c_err = (carol / "err.txt").read_text()
    assert procs["carol"].returncode == 2, c_err[-3000:]
    c = json.loads((carol / "out.json").read_text())
    assert c["evaluation_failures"] and all("carol_plugin" in f["cause"] for f in c["evaluation_failures"]), c
    assert [f["step"] for f in c["evaluation_failures"]] == [10, 20], c

    # evaluate-pending: every good root evaluated (Erin's had none), the corrupt one named, Carol's named again
    erin, dave, erin_evals = _side_runs(tmp, ledger)
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        run = run_deployment("evaluate-pending/evaluate-pending", parameters={"request": {}}, timeout=0)
        run = _wait_final(client, run.id, 900)
        assert run.state.is_completed(), run.state.message
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["evaluate-pending"])))
        report = str(max(arts, key=lambda x: x.created).data)
    assert _history_steps(erin_evals / "t" / "history.jsonl") == [10]
    assert f"{dave}/step_00000010" in report and "sha256" in report, report
    assert "carol" in report, report

    # the GPUs are back; nothing was written where the workers or the deployment run
    assert Ledger(ledger).allocations() == []
    for i in (0, 1):
        assert sorted(os.listdir(tmp / f"worker-{i}")) == [], f"worker-{i} working directory is not empty"
    assert not (stack.workdir / "runs").exists() and not (stack.workdir / "evals").exists()

    out = Path(os.environ.get("FRENZY_TEST_ARTIFACTS") or REPO / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    (out / "shared-service.json").write_text(json.dumps(
        {"wall_s": round(wall_s, 1), "alice_s": round(ended["alice"] - t0, 1), "carol_s": round(ended["carol"] - t0, 1),
         "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores"}, indent=1))
    print(f"three users on one service: {wall_s:.0f} s")
