"""Every `frenzy` command that computes something, run as a user runs it (a subprocess) with `--json`: the whole of
stdout is one JSON document. Library chatter (the HiGHS banner of the ILP baseline, torchrun's children, Ray)
must go to stderr or nowhere (cli/output.py, issue 26)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "tests" / "data" / "diagnosis" / "maddog-11-oom-old-format.log"

# commands whose --json is parsed by another test, because running them needs a Prefect server and minutes
ELSEWHERE = {"submit": "tests/test_submit.py::test_a_killed_submit_leaves_no_trainer_and_a_rerun_resumes",
             "demo": "benchmarks/pipeline.py (the whole pipeline, minutes on 2 cores)"}


def frenzy(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *argv], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Inputs the commands read: a text corpus, a ledger with the phoebe nodes, a straggler trace."""
    d = tmp_path_factory.mktemp("cli_json")
    (d / "corpus.txt").write_text("def add(a, b):\n    return a + b\n" * 200)
    assert frenzy("cluster", "init", "--cluster", "phoebe", "--ledger", str(d / "l.db"), cwd=d).returncode == 0
    (d / "t").mkdir()
    r = frenzy("stragglers", "generate", str(d / "t" / "trace.parquet"), "--dp", "2", "--pp", "2", "--steps", "3",
               "--slow-worker", "1,1,1.5", cwd=d)
    assert r.returncode == 0, r.stderr
    return {"dir": d}


@pytest.fixture(scope="module")
def checkpoint(world) -> Path:
    """A committed checkpoint of the tiny model (10 steps), for evaluate and export."""
    d = world["dir"]
    r = frenzy("train", str(REPO / "examples/jobs/tiny.yaml"), "--steps", "10", "--run-dir", str(d / "run"),
               "--checkpoint-uri", f"file://{d}/ckpt", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "ckpt"


def _cases() -> list:
    job, ex = str(REPO / "examples/jobs/gpt2-7b.yaml"), str(REPO / "examples/jobs/tiny.yaml")
    slow = pytest.mark.slow
    c: list[tuple[str, Callable[[Path], list[str]]] | object] = [
        ("plan", lambda d: ["plan", job, "--cluster", "phoebe", "--top", "3"]),
        ("memory", lambda d: ["memory", job, "--tp", "4", "--dp", "2", "--gpu", "A100-40GB-SXM"]),
        ("gpus", lambda d: ["gpus"]),
        ("presets", lambda d: ["presets"]),
        ("cluster", lambda d: ["cluster", "show", "--ledger", str(d / "l.db")]),
        # the ILP baseline: HiGHS prints its banner from C on fd 1 (issue 26)
        ("simulate", lambda d: ["simulate", "--trace", "newworkload:12", "--policy", "ilp", "--policy", "has"]),
        ("train", lambda d: ["train", ex, "--steps", "4", "--run-dir", str(d / "run4"), "--checkpoint-uri",
                             f"file://{d}/ckpt4"]),
        ("checkpoints", lambda d: ["checkpoints", str(d)]),
        ("stragglers", lambda d: ["stragglers", "analyze", str(d / "t" / "trace.parquet")]),
        ("diagnose", lambda d: ["diagnose", str(LOG)]),
        ("eval-plan", lambda d: ["eval-plan", "--suite", "core", "--nodes", "2"]),
        ("eval-datasets", lambda d: ["eval-datasets"]),
        ("tokenizer", lambda d: ["tokenizer", "train", str(d / "corpus.txt"), "--out", str(d / "tok.json"),
                                 "--vocab-size", "300"]),
        ("data", lambda d: ["data", "prepare", str(d / "corpus.txt"), "--out", str(d / "shards")]),
        pytest.param("cluster check", lambda d: ["cluster", "check", "--ledger", str(d / "l.db"), "--nodes",
                                                 "ampere-0,ampere-1"], marks=slow),
        pytest.param("evaluate", lambda d: ["evaluate", str(d / "ckpt"), "--suite", "quick", "--out-dir", str(d / "ev"),
                                            "--history-dir", str(d / "hist"), "--no-learn"], marks=slow),
        pytest.param("export", lambda d: ["export", str(d / "ckpt"), str(d / "hf")], marks=slow),
    ]
    return c


NEEDS_CHECKPOINT = {"evaluate", "export"}


@pytest.mark.parametrize(("name", "argv"), _cases())
def test_json_stdout_is_exactly_one_document(name, argv, world, request):
    if name in NEEDS_CHECKPOINT:
        request.getfixturevalue("checkpoint")
    d = world["dir"]
    r = frenzy(*argv(d), "--json", cwd=d)
    assert r.returncode == 0, f"frenzy {name}: {r.stderr[-2000:]}"
    doc = json.loads(r.stdout)  # the whole of stdout: a banner or a progress line before it fails here
    assert isinstance(doc, dict) and doc, f"frenzy {name} --json printed {r.stdout[:200]!r}"


def test_every_command_is_checked_for_one_json_document():
    """A new command lands in the cases above (or says which test parses its --json)."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    covered = {str(p.values[0]).split()[0] if hasattr(p, "values") else p[0] for p in _cases()} | set(ELSEWHERE)
    assert set(sub.choices) - covered == set()


KEYS = {"command", "kind", "message", "exit_code", "crash_file"}


def test_an_error_under_json_prints_one_error_document_and_exits_2(tmp_path):
    """Red team 41k B3: a failed `--json` command printed nothing on stdout; now one document, with the message stderr
    gives (the cause and the fix) and the same keys for every command."""
    r = frenzy("plan", str(tmp_path / "missing.yaml"), "--json", cwd=tmp_path)
    assert r.returncode == 2 and "frenzy plan: error:" in r.stderr
    err = json.loads(r.stdout)["error"]
    assert set(err) == KEYS and err["command"] == "plan" and err["kind"] == "error" and err["exit_code"] == 2
    assert "missing.yaml" in err["message"] and err["message"] in r.stderr and err["crash_file"] is None


def test_json_before_the_command_is_the_same_as_after_it(tmp_path):
    """Red team 41o S9: `frenzy --json submit job.yaml` was refused ("unrecognized arguments: --json") with no word of
    where the flag goes. The flag is taken before the command too: the same document, success and failure alike."""
    job = str(REPO / "examples/jobs/gpt2-7b.yaml")
    before = frenzy("--json", "plan", job, "--cluster", "phoebe", "--top", "2", cwd=tmp_path)
    after = frenzy("plan", job, "--cluster", "phoebe", "--top", "2", "--json", cwd=tmp_path)
    assert before.returncode == after.returncode == 0, before.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)
    bad = frenzy("--json", "plan", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    err = json.loads(bad.stdout)["error"]
    assert bad.returncode == 2 and err["command"] == "plan" and "missing.yaml" in err["message"]


@pytest.mark.parametrize("argv", [("submit", "job.yaml", "--json", "--bad-flag"), ("plan", "--json", "--top", "many"),
                                  ("--json",)])
def test_a_usage_error_under_json_prints_the_same_error_document_and_stays_text_without(argv, tmp_path):
    """Red team 41l: argparse's usage errors (an unknown flag, a malformed value, no command) printed only argparse's
    text, with nothing on stdout, under --json. Now the one error document, kind "usage", exit 2; stderr unchanged."""
    r = frenzy(*argv, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("usage: frenzy"), r.stderr
    err = json.loads(r.stdout)["error"]
    assert set(err) == KEYS and err["kind"] == "usage" and err["exit_code"] == 2 and err["crash_file"] is None
    assert err["command"] == ("" if argv == ("--json",) else argv[0])
    said = r.stderr.splitlines()[-1].split(": error: ", 1)[1]  # argparse's own line: `frenzy submit: error: ...`
    assert err["message"].startswith(said) and "--help` lists the arguments" in err["message"], (err, said)
    plain = frenzy(*(a for a in argv if a != "--json"), cwd=tmp_path)
    assert plain.returncode == 2 and plain.stdout == "" and plain.stderr == r.stderr  # human text, as argparse has it


def _run_json(fn: Callable, capsys) -> tuple[int, dict]:
    """`cli.output.run` of a command `fn` under --json: its status and the one document on stdout."""
    import argparse

    from cli.output import run

    rc = run(argparse.Namespace(command="demo", json=True, fn=fn))
    return rc, json.loads(capsys.readouterr().out)


def _raise(err: BaseException) -> Callable:
    def fn(_args: object) -> int:
        raise err
    return fn


def test_every_kind_of_failure_under_json_prints_the_same_keys(capsys, tmp_path, monkeypatch):
    from cli.output import CommandFailed

    monkeypatch.setenv("FRENZY_HOME", str(tmp_path))
    rc, doc = _run_json(_raise(RuntimeError("a bug")), capsys)
    assert rc == 1 and set(doc["error"]) == KEYS and doc["error"]["kind"] == "bug"
    assert Path(doc["error"]["crash_file"]).is_file() and doc["error"]["crash_file"] in doc["error"]["message"]
    rc, doc = _run_json(_raise(KeyboardInterrupt()), capsys)
    assert rc == 130 and doc["error"]["kind"] == "interrupted" and doc["error"]["exit_code"] == 130
    rc, doc = _run_json(_raise(CommandFailed("the trainer exited with status 1", 1)), capsys)  # `frenzy train`
    assert rc == 1 and doc["error"] | {"message": ""} == {"command": "demo", "kind": "error", "message": "",
                                                          "exit_code": 1, "crash_file": None}
    rc, doc = _run_json(lambda _args: 130, capsys)  # `submit`'s Ctrl-C: its line on stderr, no result
    assert rc == 130 and set(doc["error"]) == KEYS and doc["error"]["kind"] == "interrupted"
    with pytest.raises(SystemExit):  # `submit` stopped by SIGTERM
        _run_json(_raise(SystemExit(143)), capsys)
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["exit_code"] == 143 and doc["error"]["kind"] == "interrupted"
