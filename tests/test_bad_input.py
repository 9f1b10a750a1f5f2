"""Bad input, table-driven: every case ends with exit status 2 and one message naming the field or flag and the
fix, in bounded time, without a traceback (issue 18's sweep)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from cli.main import main

TINY = "examples/jobs/tiny.yaml"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "mb.yaml").write_text("name: x\nmodel: {preset: gpt-tiny}\ntraining: {global_batch: 3, micro_batch: 2}\n")
    (tmp_path / "huge.yaml").write_text("name: x\nmodel: {preset: gpt-tiny}\ntraining: {global_batch: 1000000000000}\n")
    (tmp_path / "ftp.yaml").write_text("name: t\nmodel: {preset: gpt-tiny}\ntraining: {steps: 2, seq_len: 32, "
                                       "checkpoint: {uri: 'ftp://x/y'}}\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "path-name.yaml").write_text("name: ../../..\nmodel: {preset: gpt-tiny}\n")
    (tmp_path / "big-node.yaml").write_text("name: c\nnodes: [{name: a, gpu: A100-80GB-SXM, count: 100000000}]\n")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty.csv").write_text("submit_time,duration,num_gpus\n")
    (tmp_path / "b.log").write_bytes(random.Random(0).randbytes(1 << 16))  # random bytes: no text in any encoding
    (tmp_path / "c1.log").write_bytes(b"\x82" * (1 << 16))  # one C1 byte repeated: not UTF-8, no letter anywhere
    (tmp_path / "dup.jsonl").write_text('{"text": "a", "text": "b"}\n')
    (tmp_path / "blank.txt").write_text("")
    return tmp_path


CASES = [
    # (argv with {d} for the fixture directory, expected text in the message)
    (["plan", "{d}"], "is a directory; give a job YAML file"),
    (["plan", "{d}/empty.yaml"], "model: missing; give `model: {preset: NAME}`"),
    (["plan", "{d}/mb.yaml"], "micro_batch 2 does not divide global_batch 3"),
    (["plan", "{d}/huge.yaml"], "training.global_batch: Input should be less than or equal to 4194304"),
    (["plan", "{d}/path-name.yaml"], "is not a name"),
    (["plan", TINY, "--cluster", "{d}"], "is a directory"),
    (["plan", TINY, "--cluster", "{d}/big-node.yaml"], "count"),
    (["plan", TINY, "--margin", "-5"], "--margin: -5 is out of range"),
    (["plan", TINY, "--margin", "nan"], "--margin: nan is out of range"),
    (["plan", TINY, "--top", "-1"], "--top: -1 is out of range"),
    (["simulate", "--trace", "{d}"], "is a directory"),
    (["simulate", "--trace", "newworkload:2000000"], "1 <= N <= 100,000"),
    (["simulate", "--trace", "{d}/empty.csv"], "no jobs in the trace"),
    (["simulate", "--trace", "prod:400"], "a generated trace is newworkload:N[:SEED], production:N[:SEED]"),
    (["simulate", "--trace", "production:40", "--load", "0"], "--load: 0 is out of range"),
    (["simulate", "--trace", "newworkload:8", "--load", "0.5"], "no arrival gaps to rescale"),
    (["train", TINY, "--nproc", "0"], "--nproc: 0 is out of range"),
    (["train", TINY, "--nproc", "-3"], "--nproc: -3 is out of range"),
    (["train", TINY, "--threads", "-1"], "--threads: -1 is out of range"),
    (["train", TINY, "--run-dir", "{d}/afile"], "is a file; give a directory"),
    (["train", "{d}/ftp.yaml", "--run-dir", "{d}/run"], "unsupported storage scheme ftp://"),
    (["checkpoints", "{d}/nonexistent"], "no such checkpoint directory"),
    (["checkpoints", "{d}/afile"], "is a file; give a directory (give the checkpoint root"),
    (["evaluate", "{d}/afile"], "is a file; give a directory"),
    (["stragglers", "generate", "{d}"], "is a directory; give the .parquet file"),
    (["stragglers", "analyze", "{d}/afile"], "meta"),
    (["eval-plan", "--suite", "core", "--nodes", "100000000"], "--nodes: 100000000 is out of range"),
    (["eval-plan", "--suite", "nope"], "neither a built-in suite"),
    (["submit", "{d}/empty.yaml"], "model: missing"),
    # issue 44, second red team: a file output's directory must exist (never created; tests/test_bad_input.py below)
    (["simulate", "--trace", "newworkload:3", "--policy", "fcfs", "--jobs-csv", "{d}/otu/jobs.csv"],
     "the directory {d}/otu does not exist"),
    (["stragglers", "generate", "{d}/otu/g.parquet", "--steps", "1"], "the directory {d}/otu does not exist"),
    (["tokenizer", "train", "{d}/mb.yaml", "--out", "{d}/otu/tok.json"], "the directory {d}/otu does not exist"),
    # readers that refuse: a binary file is no log, corpus or tokenizer text; a key given twice is no document
    (["diagnose", "{d}/b.log"], "{d}/b.log looks binary"),
    (["diagnose", "{d}/c1.log"], "{d}/c1.log looks binary"),
    (["data", "prepare", "{d}/b.log", "--out", "{d}/o"], "{d}/b.log looks binary"),
    (["tokenizer", "train", "{d}/b.log", "--out", "{d}/tok.json"], "{d}/b.log looks binary"),
    (["data", "prepare", "{d}/dup.jsonl", "--out", "{d}/o", "--format", "jsonl"], "{d}/dup.jsonl:1: duplicate key 'text'"),
    (["data", "prepare", "{d}/blank.txt", "--out", "{d}/o"], "{d}/blank.txt: no text to tokenize"),
    # every number in range: flags and the seed of a generated trace
    (["plan", TINY, "--top", "0"], "--top: 0 is out of range"),
    (["simulate", "--trace", "production:5:-1"], "0 <= SEED < 2^63"),
    (["simulate", "--trace", "newworkload:5:-1"], "0 <= SEED < 2^63"),
    (["stragglers", "generate", "{d}/g.parquet", "--slow-worker", "9,9,1.3"], "--slow-worker (slow_worker.stage): stage 9"),
    (["stragglers", "generate", "{d}/g.parquet", "--slow-worker", "9,1,1.3"], "--slow-worker (slow_worker.dp): DP rank 9"),
    (["stragglers", "generate", "{d}/g.parquet", "--slow-worker", "1,1,0"], "--slow-worker (factor)"),
    # refused before any rank starts, exit 2 (not a rank's failure reported by torchrun as 1)
    (["train", TINY, "--nproc", "3", "--tp", "3"], "--tp 3 does not divide the model's heads=4"),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_clear_message_and_exit_2(argv, expected, files, capsys):
    args = [a.replace("{d}", str(files)) for a in argv]
    expected = expected.replace("{d}", str(files))
    before = sorted(p.name for p in files.iterdir() if not p.name.startswith("."))
    t0 = time.monotonic()
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expected in err, err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 60
    assert sorted(p.name for p in files.iterdir() if not p.name.startswith(".")) == before  # nothing created


def test_train_on_cuda_without_a_gpu_names_the_fix(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["train", TINY, "--device", "cuda"]) == 2
    assert "no CUDA device is visible here" in capsys.readouterr().err


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    """A dp-2 pp-2 straggler trace with its meta YAML."""
    assert main(["stragglers", "generate", str(tmp_path / "trace.parquet"), "--dp", "2", "--pp", "2", "--steps", "2"]) == 0
    return tmp_path


@pytest.mark.parametrize(("edit", "expected"), [
    ({"world_size": 7}, "world_size 7 is not dp_size x pp_size x tp_size x dsp_size = 2 x 2 x 1 x 1 = 4"),
    ({"dp_size": 8, "world_size": 16}, "dp_size 8 does not match the trace"),
    ({"pp_size": 1, "world_size": 2}, "pp_size 1 does not match the trace"),
], ids=["world_size", "dp too large", "pp too small"])
def test_a_meta_that_is_not_the_traces_layout_is_refused(edit, expected, trace_dir, capsys):
    import yaml

    meta = next(trace_dir.glob("meta*.yaml"))
    meta.write_text(yaml.safe_dump({**yaml.safe_load(meta.read_text()), **edit}))
    capsys.readouterr()
    assert main(["stragglers", "analyze", str(trace_dir / "trace.parquet")]) == 2
    err = capsys.readouterr().err
    assert str(meta) in err and expected in err, err


def test_analyze_outputs_into_a_mistyped_directory_are_refused_before_the_analysis(trace_dir, capsys):
    for flag, name in (("--timeline", "t.json.gz"), ("--heatmap", "h.png")):
        capsys.readouterr()
        assert main(["stragglers", "analyze", str(trace_dir / "trace.parquet"), flag, str(trace_dir / "tmie" / name)]) == 2
        err = capsys.readouterr().err
        assert f"the directory {trace_dir / 'tmie'} does not exist" in err and "mkdir -p" in err, err
        assert "attributed" not in err  # refused before the analysis ran
        assert not (trace_dir / "tmie").exists()
