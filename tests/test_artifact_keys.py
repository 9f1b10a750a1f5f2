"""Artifact keys name a run (job name + checkpoint root), never a job name alone (red team 41c, S4b)."""

from __future__ import annotations

import ast
from pathlib import Path

from prefect.types.names import raise_on_name_alphanumeric_dashes_only

from tasks.artifactkey import run_key, step_root

ROOT = Path(__file__).resolve().parent.parent
GLOBAL_KEYS = {"frenzy-simulation", "frenzy-plans", "evaluate-pending"}
"""Keys of flows that have no run (a plan or a simulation request, the one scheduled pending pass)."""


def test_two_users_runs_of_one_name_get_two_keys():
    alice = run_key("report", "exp", "file:///home/alice/runs/exp/ckpt")
    bob = run_key("report", "exp", "file:///home/bob/runs/exp/ckpt")
    assert alice != bob and alice.startswith("report-exp-") and bob.startswith("report-exp-")


def test_names_that_slug_alike_do_not_collide():
    root = "file:///data/shared/ckpt"
    assert run_key("report", "Form.v1-x_Y", root) != run_key("report", "form-v1-x-y", root)


def test_the_spelling_of_a_root_does_not_change_the_key():
    a = run_key("report", "exp", "file:///d/ckpt")
    assert a == run_key("report", "exp", "/d/ckpt") == run_key("report", "exp", "file:///d/ckpt/")
    assert step_root("file:///d/ckpt/step_00000020") == "file:///d/ckpt"


def test_keys_are_what_prefect_accepts_even_for_odd_names():
    for name in ("Fr.ed-Run_2026.v1." + "b" * 110, "café", "___", "x"):
        k = run_key("eval-history-core", name, "s3://bucket/ckpt")
        assert raise_on_name_alphanumeric_dashes_only(k, "key") == k and "--" not in k


def test_the_documented_search_finds_the_report_of_a_name_at_the_length_limit():
    """Red team 41g S02: a 128-character name was cut in its keys, so the search docs/prefect.md gives
    (`report-<job>`, the name lowercased, other characters as `-`) matched nothing. The name is never cut now."""
    from tasks.jobspec import parse_job

    name = "n" * 40 + ".X_y-" + "z" * 83
    job = parse_job({"name": name, "model": {"preset": "gpt-tiny"}}, "job.yaml")  # the longest name a job may have
    assert len(job.name) == 128
    key = run_key("report", job.name, "file:///home/bob/ck")
    documented = "report-" + "n" * 40 + "-x-y-" + "z" * 83  # the rule of docs/prefect.md, by hand
    assert key.startswith(documented + "-") and len(key) == len(documented) + 9
    assert raise_on_name_alphanumeric_dashes_only(key, "key") == key
    assert run_key("report", job.name, "file:///home/kim/ck").startswith(documented + "-")  # every run of the name


def _keys(tree: ast.AST) -> list[ast.expr]:
    return [kw.value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")).startswith("create_")
            and getattr(node.func, "id", getattr(node.func, "attr", "")).endswith("_artifact")
            for kw in node.keywords if kw.arg == "key"]


def _is_run_key(value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and getattr(value.func, "id", "") == "run_key"


def test_every_artifact_key_in_the_flows_is_a_run_key_or_a_global_one():
    bad = []
    for path in sorted((ROOT / "flows").glob("*.py")):
        tree = ast.parse(path.read_text())
        bound = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _is_run_key(node.value)
                 for t in node.targets if isinstance(t, ast.Name)}  # `key = run_key(...)`, then `key=key`
        for value in _keys(tree):
            is_run_key = _is_run_key(value) or (isinstance(value, ast.Name) and value.id in bound)
            is_global = isinstance(value, ast.Constant) and value.value in GLOBAL_KEYS
            if not (is_run_key or is_global):
                bad.append(f"{path.name}:{value.lineno}: {ast.unparse(value)}")
    assert not bad, "artifact keys made from a job name alone (use tasks.artifactkey.run_key):\n" + "\n".join(bad)
    assert len([v for p in (ROOT / "flows").glob("*.py") for v in _keys(ast.parse(p.read_text()))]) >= 9
