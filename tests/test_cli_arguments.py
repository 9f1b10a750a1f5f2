"""Every command's arguments, by property (hypothesis): a flag given any text is parsed to a value in its range or
refused by argparse naming the flag (exit 2), and the commands that compute at once, given any mix of in-range and
out-of-range values, answer with exit 0 or a user's error (exit 2), never a bug (exit 1) or a traceback."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.main import build_parser, main

TINY = str(Path(__file__).resolve().parents[1] / "examples/jobs/tiny.yaml")
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
texts = st.one_of(st.text(max_size=12), st.integers(-10**30, 10**30).map(str), st.floats().map(repr),
                  st.sampled_from(["nan", "inf", "-inf", "1e999", "0x10", "1_000", " 7 ", "", "-0", "١٢"]))


def _typed_flags() -> list[tuple[str, str, object]]:
    """(command, flag, argparse type) of every option of every command that converts its text."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(cmd, a.option_strings[0], a.type) for cmd, p in sub.choices.items() for a in p._actions
            if a.option_strings and callable(a.type) and a.type is not str]


FLAGS = _typed_flags()


def test_every_numeric_flag_has_a_checked_type():
    """No `type=int`/`type=float` left: those take nan, inf and any magnitude (the bounded types state a range)."""
    assert FLAGS and not [(c, f) for c, f, t in FLAGS if t in (int, float)]


@pytest.mark.parametrize(("command", "flag", "kind"), FLAGS, ids=[f"{c} {f}" for c, f, _ in FLAGS])
@settings(max_examples=60, deadline=None)
@given(text=texts)
def test_a_flag_takes_a_finite_value_in_range_or_refuses_naming_it(command, flag, kind, text):
    try:
        v = kind(text)
    except argparse.ArgumentTypeError as err:
        assert str(err)
        return
    assert isinstance(v, str) or (isinstance(v, int | float) and math.isfinite(v))  # a pattern-checked name, or a number


def _run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse refusing a flag
            rc = int(exc.code or 0)
    return rc, err.getvalue()


def _answers(rc: int, err: str) -> None:
    assert rc in (0, 2), err
    assert "Traceback" not in err and "a bug in Frenzy" not in err, err
    if rc == 2:
        assert "error:" in err, err


numbers = st.one_of(st.integers(-5, 70).map(str), st.sampled_from(["0", "1e9", "nan", "-inf", "0.5", "x"]))


@FEW
@given(margin=st.one_of(st.floats(-1, 1).map(repr), numbers), top=numbers, seq=numbers)
def test_plan_answers_any_flags(margin, top, seq):
    _answers(*_run("plan", TINY, "--margin", margin, "--top", top, "--seq-len", seq))


@FEW
@given(dp=numbers, tp=numbers, pp=numbers, mb=numbers)
def test_memory_answers_any_layout(dp, tp, pp, mb):
    _answers(*_run("memory", TINY, "--dp", dp, "--tp", tp, "--pp", pp, "--micro-batch", mb))


@FEW
@given(nodes=numbers, gpus=numbers, cpus=numbers)
def test_eval_plan_answers_any_shape(nodes, gpus, cpus):
    _answers(*_run("eval-plan", "--suite", "quick", "--nodes", nodes, "--gpus-per-node", gpus,
                   "--cpu-workers-per-node", cpus))


@FEW
@given(n=st.integers(-2, 12), load=st.one_of(st.floats(-1, 20).map(repr), numbers))
def test_simulate_answers_any_size_and_load(n, load):
    _answers(*_run("simulate", "--trace", f"newworkload:{n}", "--policy", "fcfs", "--load", load))


@FEW
@given(dp=numbers, pp=numbers, mb=numbers, steps=numbers, noise=numbers, worker=st.text(",0123456789.-x", max_size=8))
def test_stragglers_generate_answers_any_layout(tmp_path, dp, pp, mb, steps, noise, worker):
    out = tmp_path / "t.parquet"
    args = ["stragglers", "generate", str(out), "--dp", dp, "--pp", pp, "--microbatches", mb, "--steps", steps,
            "--noise", noise, "--overwrite"]
    _answers(*_run(*args, *(["--slow-worker", worker] if worker else [])))
