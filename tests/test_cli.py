import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_memory_json_has_the_three_totals_and_breakdown(capsys):
    code, out, _ = run(capsys, "memory", "examples/jobs/gpt2-7b.yaml", "--tp", "4", "--dp", "2",
                       "--micro-batch", "1", "--gpu", "A100-40GB-SXM", "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["allocated_bytes"] < doc["reserved_bytes"] < doc["device_bytes"]
    assert sum(doc["breakdown"].values()) == doc["device_bytes"] and doc["fits"] is True
    assert doc["baselines"]["frenzy_paper_bytes"] > 0


def test_plan_json_is_one_document(capsys):
    code, out, _ = run(capsys, "plan", "examples/jobs/gpt2-7b.yaml", "--cluster", "phoebe", "--json", "--top", "3")
    doc = json.loads(out)
    assert code == 0 and len(doc["plans"]) == 3 and doc["plans"][0]["rank"] == 1
    assert {"gpus", "gpu_type", "layout", "predicted_device_gib", "est_step_time_s"} <= set(doc["plans"][0])


def test_human_output_and_errors(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "examples/jobs/gpt2-7b.yaml")
    assert code == 0 and "rank" in out and "A800-80GB" in out
    bad = tmp_path / "job.yaml"
    bad.write_text("model: {preset: gpt2-124m}\ntraining: {global_batch: 8, sequence_len: 4}\n")
    code, out, err = run(capsys, "plan", str(bad), "--json")
    assert code == 2 and "unknown key 'sequence_len'" in err and "sequence_len" in json.loads(out)["error"]["message"]
    code, _, err = run(capsys, "memory", "examples/jobs/gpt2-7b.yaml", "--tp", "3")
    assert code == 2 and "tp=3" in err
    code, _, err = run(capsys, "plan", "examples/jobs/llama3-8b.yaml", "--cluster", "nowhere")
    assert code == 2 and "neither a cluster preset" in err


def test_catalog_and_presets_listing(capsys):
    assert json.loads(run(capsys, "gpus", "--json")[1])["gpus"]
    assert any(p["preset"] == "llama3-70b" for p in json.loads(run(capsys, "presets", "--json")[1])["presets"])


def test_console_script_runs():
    """The installed `frenzy` entry point (what `pip install -e .` puts beside the interpreter), not the module."""
    from pathlib import Path

    exe = Path(sys.executable).parent / "frenzy"
    assert exe.exists(), f"no console script at {exe}: is the project installed (pip install -e .)?"
    out = subprocess.run([str(exe), "memory", "examples/jobs/tiny.yaml", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["peak_phase"] in {"backward_start", "backward_end", "optimizer_step"}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_cluster_show_init_cordon_json(backend, request, capsys, tmp_path):
    if backend == "sqlite":
        led = f"sqlite:///{tmp_path / 'l.db'}"
    else:
        from tests.pg_server import fresh_database

        led = fresh_database(request.getfixturevalue("postgres_admin"))
    code, out, _ = run(capsys, "cluster", "init", "--cluster", "phoebe", "--ledger", led, "--json")
    doc = json.loads(out)
    assert code == 0 and len(doc["nodes"]) == 6 and sum(len(n["free_indices"]) for n in doc["nodes"]) == 44
    code, out, _ = run(capsys, "cluster", "cordon", "quadro-0", "--reason", "fan", "--ledger", led, "--json")
    node = {n["name"]: n for n in json.loads(out)["nodes"]}["quadro-0"]
    assert node["state"] == "cordoned" and node["reason"] == "fan"
    code, out, _ = run(capsys, "cluster", "show", "--ledger", led)
    assert code == 0 and "cordoned (fan)" in out and "44 GPUs" in out
    code, _, err = run(capsys, "cluster", "uncordon", "nope", "--ledger", led)
    assert code == 2 and "no node 'nope'" in err


def test_simulate_json_has_every_policy_and_the_bounds(capsys, tmp_path):
    png = tmp_path / "cdf.png"
    code, out, _ = run(capsys, "simulate", "--cluster", "frenzy-testbed", "--trace", "newworkload:8:1",
                       "--policy", "has", "--policy", "has-arrival", "--policy", "fcfs", "--json", "--plot", str(png))
    doc = json.loads(out)
    assert code == 0 and set(doc["policies"]) == {"has", "has-arrival", "fcfs"}
    for s in doc["policies"].values():
        for k in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "decision_p50_ms",
                  "decision_p99_ms", "oom_failures"):
            assert k in s
        assert s["avg_jct_s"] >= doc["lower_bounds"]["avg_jct_s"] * 0.999 or s["completed"] < doc["jobs"]
    assert png.stat().st_size > 1000


def test_simulate_load_rescales_the_trace_as_the_benchmark_does(capsys):
    """`--load` runs the trace at the offered load the benchmark reports (its arrivals rescaled); the output says the
    load it ran at and the trace's own."""
    code, out, _ = run(capsys, "simulate", "--trace", "production:60:2", "--policy", "fcfs", "--json")
    given = json.loads(out)
    code, out, _ = run(capsys, "simulate", "--trace", "production:60:2", "--policy", "fcfs", "--load", "0.9", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["offered_load"] == pytest.approx(0.9)
    assert doc["offered_load_as_given"] == pytest.approx(given["offered_load"]) != pytest.approx(0.9)
    assert doc["policies"]["fcfs"]["avg_jct_s"] != pytest.approx(given["policies"]["fcfs"]["avg_jct_s"])
    code, out, _ = run(capsys, "simulate", "--trace", "production:60:2", "--policy", "fcfs", "--load", "0.9")
    assert code == 0 and f"offered load 0.90 (rescaled from {given['offered_load']:.2f})" in out


def test_simulate_reads_sia_files_and_reports_bad_traces(capsys, tmp_path):
    trace = Path(__file__).resolve().parents[1] / "examples/traces/sia-workloads/saturn/workload-3.csv"
    code, out, _ = run(capsys, "simulate", "--trace", str(trace),
                       "--policy", "fcfs")
    assert code == 0 and "fcfs" in out and "lower bounds" in out
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    code, _, err = run(capsys, "simulate", "--trace", str(bad), "--format", "generic")
    assert code == 2 and "missing columns" in err


def test_train_and_checkpoints_json(capsys, tmp_path):
    uri = f"file://{tmp_path}/ckpt"
    common = ["examples/jobs/tiny.yaml", "--steps", "12", "--checkpoint-uri", uri, "--run-dir", str(tmp_path / "run"),
              "--device", "cpu"]
    code, out, err = run(capsys, "train", *common, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["final_step"] == 12 and doc["resumed_from_step"] is None
    assert [c["step"] for c in doc["checkpoints"]] == [10, 12]
    assert {"step", "uri", "blocked_s", "wait_s", "drag_s", "persist_s", "bytes", "deferred_steps"} == set(doc["checkpoints"][0])
    assert "checkpoint step 10 committed" in err and "step 10/12" in err
    code, out, err = run(capsys, "train", *common)
    assert code == 2 and out == "" and "pass --resume" in err
    code, out, _ = run(capsys, "checkpoints", uri, "--verify", "--json")
    steps = json.loads(out)["steps"]
    assert [(s["step"], s["committed"], s["verified"]) for s in steps] == [(12, True, True), (10, True, True)]


_PLUGINS = {  # package: (its __init__ when imported, its factory module)
    "rtkillpkg": ("import os, signal\nwith open(os.environ['RT_IMPORTS'], 'a') as f:\n    f.write('kill\\n')\n"
                  "os.killpg(0, signal.SIGKILL)\n", "def make(options, ctx):\n    raise AssertionError\n"),
    "rthangpkg": ("import os, threading\nwith open(os.environ['RT_IMPORTS'], 'a') as f:\n    f.write('hang\\n')\n"
                  "threading.Event().wait()\n", "def make(options, ctx):\n    raise AssertionError\n"),
    "rtgoodpkg": ("", "from tasks.evaluation.datasets import EvalDataset\n\n\nclass Good(EvalDataset):\n"
                      "    name, mode, description = 'good', 'gen', 'a plugin that imports'\n"
                      "    prior_infer_s_per_example = 0.5\n"),
}


def _install_plugins(where: Path) -> None:
    """Three installed dataset plugins (a package with a `frenzy.eval_datasets` entry point in its metadata): one kills
    its process group when imported, one hangs when imported, one imports."""
    for pkg, (init, data) in _PLUGINS.items():
        (where / pkg).mkdir(parents=True)
        (where / pkg / "__init__.py").write_text(init)
        (where / pkg / "data.py").write_text(data)
        meta = where / f"{pkg}-0.1.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 0.1\n")
        attr = "Good" if pkg == "rtgoodpkg" else "make"
        (meta / "entry_points.txt").write_text(f"[frenzy.eval_datasets]\n{pkg[2:-3]} = {pkg}.data:{attr}\n")


def test_eval_datasets_lists_plugins_from_metadata_and_check_names_a_bad_one_without_failing(tmp_path):
    """`frenzy eval-datasets` imported every installed plugin: one that killed its process group at import killed the
    listing, one that hung held it for ever. Now plugins are listed from their packages' metadata (no import), and
    `--check` imports each in a process of its own under a deadline, naming a bad one; the listing exits 0. The
    deadline here is 4 s (the hanging plugin is waited out for it; a good one's check takes 0.1 s on a quiet machine)."""
    _install_plugins(tmp_path / "plugins")
    root = str(Path(__file__).resolve().parents[1])
    env = {**__import__("os").environ, "PYTHONPATH": f"{root}:{tmp_path / 'plugins'}",
           "RT_IMPORTS": str(tmp_path / "imports")}

    def listing(*extra: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "cli", "eval-datasets", "--json", *extra], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, start_new_session=True)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
        return {d["name"]: d for d in json.loads(proc.stdout)["datasets"]}

    plain = listing()
    assert not (tmp_path / "imports").exists()  # no plugin's code ran
    assert {n: (d["source"], d["distribution"], d["check"]) for n, d in plain.items() if d["distribution"]} == {
        "kill": ("rtkillpkg.data:make", "rtkillpkg", ""), "hang": ("rthangpkg.data:make", "rthangpkg", ""),
        "good": ("rtgoodpkg.data:Good", "rtgoodpkg", "")}
    assert plain["heldout-loss"]["source"] == "built-in" and plain["good"]["mode"] == "?"
    checked = listing("--check", "--plugin-timeout-s", "4")
    assert checked["good"]["check"] == "ok" and checked["good"]["mode"] == "gen", checked["good"]
    assert checked["good"]["prior_infer_s_per_example"] == 0.5
    assert checked["kill"]["check"].startswith("rtkillpkg.data:make: its import process killed by SIGKILL"), checked
    assert checked["hang"]["check"].startswith("rthangpkg.data:make: hung while importing (no answer in 4s"), checked
    assert sorted((tmp_path / "imports").read_text().split()) == ["hang", "kill"]  # each in a process of its own


def test_embedded_submit_refuses_a_prefect_home_whose_database_a_running_server_keeps(tmp_path):
    """Red team 41n: `frenzy submit` without PREFECT_API_URL, in an environment whose PREFECT_HOME is a running
    server's, opened that server's own `prefect.db` with its embedded API. Now it refuses before anything starts,
    naming the server (pid, URL) and both fixes. A real `prefect server start` on that PREFECT_HOME."""
    import os
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from cluster.ledger import Ledger

    Ledger(str(tmp_path / "l.db"))
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_") and "DATABASE" not in k}
    env |= {"PREFECT_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    prefect = str(Path(sys.executable).parent / "prefect")
    server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc = subprocess.run([sys.executable, "-m", "cli", "submit", str(Path("examples/jobs/tiny.yaml").resolve()),
                               "--ledger", str(tmp_path / "l.db"), "--run-dir", str(tmp_path / "run"), "--json"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    msg = json.loads(proc.stdout)["error"]["message"]
    url = f"http://127.0.0.1:{port}/api"
    assert f"a Prefect server (pid {server.pid}, {url}) keeps its database in PREFECT_HOME={home}" in msg, msg
    assert f"export PREFECT_API_URL={url}" in msg and "another PREFECT_HOME" in msg
    assert not (tmp_path / "run").exists()  # nothing started
