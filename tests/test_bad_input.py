"""Bad input, table-driven: every case ends with exit status 2 and one message naming the field or flag and the
fix, in bounded time, without a traceback (issue 18's sweep)."""

from __future__ import annotations

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
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_clear_message_and_exit_2(argv, expected, files, capsys):
    args = [a.replace("{d}", str(files)) for a in argv]
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


def test_train_on_cuda_without_a_gpu_names_the_fix(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["train", TINY, "--device", "cuda"]) == 2
    assert "no CUDA device is visible here" in capsys.readouterr().err
