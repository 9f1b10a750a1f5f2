"""The deployments' forms in the Prefect UI (issue 30, point 11): one field per concept, no "Property is type None"
input under optional fields, and a run name a person typed is kept."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from flows.naming import keeps_its_name


def _schema(fn) -> dict[str, Any]:
    from prefect.utilities.callables import parameter_schema

    return parameter_schema(fn).model_dump()


def _properties(schema: dict[str, Any]) -> list[tuple[str, str, dict]]:
    models = [("<parameters>", schema)] + list(schema.get("definitions", {}).items())
    return [(model, name, prop) for model, d in models for name, prop in d.get("properties", {}).items()]


def _flows():
    from flows.evaluate import evaluate_checkpoint, evaluate_pending
    from flows.plan import plan
    from flows.simulate import simulate_flow
    from flows.stragglers import stragglers_flow
    from flows.submit import submit
    from flows.train import train_flow

    return [submit, train_flow, plan, evaluate_checkpoint, evaluate_pending, stragglers_flow, simulate_flow]


@pytest.mark.parametrize("fn", _flows(), ids=lambda f: f.name)
def test_no_optional_field_has_a_null_branch_on_the_form(fn):
    nulls = [f"{m}.{n}" for m, n, p in _properties(_schema(fn))
             if any(b.get("type") == "null" for b in p.get("anyOf", [])) or p.get("type") == "null"
             or ("default" in p and p["default"] is None)]
    assert nulls == []


def test_the_submit_form_has_one_field_per_label():
    titles = Counter(p.get("title", n) for _, n, p in _properties(_schema(_flows()[0])))
    assert [t for t, c in titles.items() if c > 1] == []
    assert "Evaluation mode" in titles and "Suite" in titles


def test_the_forms_defaults_still_validate():
    """What the UI sends for the default form (the deployment's parameters) passes the schema Prefect enforces."""
    import yaml
    from prefect.utilities.schema_tools.validation import validate

    deployments = yaml.safe_load(open("deployments/prefect.yaml"))["deployments"]
    by_entry = {d["entrypoint"].rsplit(":", 1)[1]: d.get("parameters", {}) for d in deployments}
    for fn in _flows():
        entry = {"submit": "submit", "train": "train_flow", "plan": "plan", "evaluate-checkpoint": "evaluate_checkpoint",
                 "evaluate-pending": "evaluate_pending", "stragglers": "stragglers_flow",
                 "simulate": "simulate_flow"}[fn.name]
        if entry in by_entry:
            validate(by_entry[entry], _schema(fn), raise_on_error=True, preprocess=True, ignore_required=False)


def test_submit_still_accepts_a_suite_from_the_command_line():
    from flows.submit import SubmitRequest
    from tasks.jobspec import JobSpec

    req = SubmitRequest(job=JobSpec(model={"preset": "gpt-tiny"}), suite="quick")
    assert req.suite == "quick" and "suite" not in _properties_of(SubmitRequest)


def _properties_of(model) -> dict:
    return model.model_json_schema()["properties"]


@pytest.mark.parametrize(("from_deployment", "auto", "key", "kept"), [
    (True, False, None, True),        # the UI's Run form, `prefect deployment run`: the name the person gave
    (True, True, None, False),        # the hourly schedule
    (True, False, "trigger-1", False),  # a trigger's or a parent flow's run
    (False, False, None, False),      # `frenzy submit` calling the flow
])
def test_a_run_a_person_named_keeps_its_name(from_deployment, auto, key, kept):
    assert keeps_its_name(from_deployment, auto, key) is kept


def test_a_direct_call_gets_the_flows_template_name(prefect_server):
    from prefect import flow
    from prefect.context import FlowRunContext

    from flows.naming import run_name

    @flow(flow_run_name=run_name("hello-{who}"))
    def hello(who: str) -> str:
        return FlowRunContext.get().flow_run.name

    assert hello("you") == "hello-you"


def test_an_api_caller_may_still_send_the_nulls_of_a_model_dump():
    """`run_deployment` with `job.model_dump()` sends `evaluation: None`, `rope_scaling: None`, `layers: None` ...:
    Prefect's server validates them against this schema (the notebook's deployment cell did, and got 409)."""
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    from tasks.jobspec import JobSpec

    schema = _schema(_flows()[0])
    job = JobSpec(name="nb", model={"preset": "gpt-tiny"}, training={"steps": 10})
    assert job.evaluation is None and job.model.rope_scaling is None
    validate({"request": {"job": job.model_dump(mode="json"), "cluster": "local"}}, schema, raise_on_error=True)
    with pytest.raises(ValidationError, match="evaluation"):  # still typed: a section is an object or nothing
        validate({"request": {"job": {**job.model_dump(mode="json"), "evaluation": "quick"}}}, schema,
                 raise_on_error=True)
