"""One declaration per setting: the flags of the form-backed commands are generated from the request models the Prefect
forms are drawn from (cli/fields.py), so a flag's name, default, choices, range and help cannot drift from the
form's; and docs/commands.md names every flag of every command."""

from __future__ import annotations

import argparse
import json
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from cli.fields import ArgumentError, apply_overrides, build, flag
from cli.main import COMMANDS, build_parser, main
from tasks.evaluation.request import EvaluateRequest
from tasks.jobspec import load_job
from tasks.pipeline.request import SubmitRequest
from tasks.planning.request import PlanRequest

REPO = Path(__file__).resolve().parents[1]
FORM_BACKED: dict[str, tuple[type[BaseModel], set[str]]] = {
    "submit": (SubmitRequest, {"job"}),
    "plan": (PlanRequest, {"job"}),
    "evaluate": (EvaluateRequest, set()),
}


def _parser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser(command)._actions if a.dest == "command")
    return sub.choices[command]


@pytest.mark.parametrize("command", sorted(FORM_BACKED))
def test_every_field_of_the_form_is_a_flag_with_its_default_choices_and_help(command: str) -> None:
    model, skip = FORM_BACKED[command]
    actions = {a.dest: a for a in _parser(command)._actions}
    for name, f in model.model_fields.items():
        if name in skip or (flag(name, f) is None and name not in actions):
            continue
        a = actions[name]
        assert a.default is argparse.SUPPRESS or a.option_strings == [], name  # unset: the model's default applies
        ann = typing.get_args(f.annotation)[0] if typing.get_origin(f.annotation) is list else f.annotation
        if typing.get_origin(ann) is typing.Literal:
            assert list(a.choices) == list(typing.get_args(ann)), name
        doc = " ".join((f.description or "").split())
        assert doc and a.help.replace("%%", "%").startswith(doc), name
        if f.default not in (None, [], "") and not f.is_required():
            shown = {True: "on", False: "off"}.get(f.default, f.default) if isinstance(f.default, bool) else f.default
            assert f"(default: {shown})" in a.help, name


def test_a_flag_left_out_takes_the_forms_default() -> None:
    ns = _parser("submit").parse_args([str(REPO / "examples" / "jobs" / "tiny.yaml"), "--hang", "60"])
    from cli.fields import given

    assert given(ns, SubmitRequest, skip={"job"}) == {"hang_s": 60.0}
    req = build(SubmitRequest, {"job": load_job(ns.job), **given(ns, SubmitRequest, skip={"job"})})
    assert req.hang_s == 60.0 and req.max_wait_s == SubmitRequest.model_fields["max_wait_s"].default


@pytest.mark.parametrize("argv,words", [
    (["submit", "JOB", "--max-wait", "-1"], ["--max-wait", "-1 is out of range: give more than 0"]),
    (["submit", "JOB", "--max-restarts", "99"], ["--max-restarts", "99 is out of range: give 0 to 20"]),
    (["submit", "JOB", "--lease", "nan"], ["--lease"]),
    (["submit", "JOB", "--hang", "inf"], ["--hang"]),
    (["plan", "JOB", "--top", "-1"], ["--top", "-1 is out of range: give 1 to 100000"]),
    (["plan", "JOB", "--seq-len", "0"], ["--seq-len", "0 is out of range: give 1 to 4194304"]),
    (["plan", "JOB", "--margin", "0.5"], ["--margin", "0.5 is out of range: give 0 up to (not including) 0.5"]),
    (["evaluate", "URI", "--gpus-per-node", "65"], ["--gpus-per-node", "65 is out of range: give 1 to 64"]),
    (["evaluate", "URI", "--schedule", "fast"], ["--schedule", "invalid choice"]),
])
def test_a_value_the_model_refuses_is_an_exit_2_naming_the_flag(argv: list[str], words: list[str], capsys) -> None:
    argv = [str(REPO / "examples" / "jobs" / "tiny.yaml") if a == "JOB" else a for a in argv]
    with pytest.raises(SystemExit) as ex:
        main(argv)
    err = capsys.readouterr().err
    assert ex.value.code == 2 and all(w in err for w in words), err


def test_overrides_of_the_job_are_validated_with_the_whole_job() -> None:
    job = load_job(str(REPO / "examples" / "jobs" / "tiny.yaml"))
    assert apply_overrides(job, {"training.steps": 7}).training.steps == 7
    with_mb = job.model_copy(update={"training": job.training.model_copy(update={"micro_batch": 4})})
    with pytest.raises(ArgumentError, match="micro_batch 4 does not divide global_batch 6"):
        apply_overrides(with_mb, {"training.global_batch": 6})


def test_build_names_the_flag_of_a_refused_field() -> None:
    with pytest.raises(ArgumentError, match="--max-wait: Input should be greater than 0"):
        build(SubmitRequest, {"job": load_job(str(REPO / "examples" / "jobs" / "tiny.yaml")), "max_wait_s": 0})


def _section(text: str, command: str) -> str:
    """The part of docs/commands.md about `frenzy COMMAND` (from its heading to the next command's)."""
    heads = [m for m in re.finditer(r"^## .*$", text, re.M)]
    parts = [text[m.start(): heads[i + 1].start() if i + 1 < len(heads) else len(text)] for i, m in enumerate(heads)
             if re.search(rf"`frenzy {re.escape(command)}\b", m.group(0))]
    return "\n".join(parts)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_docs_name_every_flag_of_every_command(command: str) -> None:
    text = (REPO / "docs" / "commands.md").read_text()
    section = _section(text, command)
    assert section, f"docs/commands.md has no section for `frenzy {command}`"
    flags = {o for a in _parser(command)._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    missing = sorted(f for f in flags if not re.search(rf"{re.escape(f)}\b", section))
    assert not missing, f"docs/commands.md does not mention {missing} under `frenzy {command}`"


def test_the_demos_time_agrees_in_the_readme_the_banner_and_the_benchmark() -> None:
    from cli.submit import DEMO_TIME

    measured = json.loads((REPO / "benchmarks" / "results" / "pipeline.json").read_text())["demo_wall_s"]
    lo, hi = (int(x) for x in re.search(r"; (\d+)-(\d+) s on 2 cores", (REPO / "README.md").read_text()).groups())
    assert (lo, hi) == (round(min(measured)), round(max(measured)))
    banner = float(DEMO_TIME.split()[0])
    assert hi <= banner <= 1.25 * hi  # the banner rounds the measured time up, not to something else
