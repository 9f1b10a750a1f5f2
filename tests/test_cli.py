import json
import subprocess
import sys

from flows.cli import main


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
    assert code == 2 and out == "" and "unknown key 'sequence_len'" in err
    code, _, err = run(capsys, "memory", "examples/jobs/gpt2-7b.yaml", "--tp", "3")
    assert code == 2 and "tp=3" in err
    code, _, err = run(capsys, "plan", "examples/jobs/llama3-8b.yaml", "--cluster", "nowhere")
    assert code == 2 and "neither a cluster preset" in err


def test_catalog_and_presets_listing(capsys):
    assert json.loads(run(capsys, "gpus", "--json")[1])["gpus"]
    assert any(p["preset"] == "llama3-70b" for p in json.loads(run(capsys, "presets", "--json")[1])["presets"])


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "flows.cli", "memory", "examples/jobs/tiny.yaml", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["peak_phase"] in {"backward_start", "backward_end", "optimizer_step"}
