"""Flow run names: the flow's template (`submit-{request.job.name}`), except for a run a person named.

Prefect renames every run of a flow that has a `flow_run_name` when it starts, so the name typed into the UI's Run
form was replaced. A run a person started from a deployment (the form, `prefect deployment run`,
`run_deployment` outside a flow) keeps its name; a schedule's runs (auto-scheduled), a trigger's and a parent
flow's (both carry an idempotency key) and direct calls (`frenzy submit`) get the template.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def run_name(template: str) -> Callable[[], str]:
    """A `flow_run_name` callable: `template` formatted with the run's parameters, unless a person named the run."""

    def name() -> str:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        run = ctx.flow_run if ctx else None
        if run is None:
            return template
        if keeps_its_name(run.deployment_id is not None, run.auto_scheduled, run.idempotency_key):
            return run.name
        return template.format(**(ctx.parameters or {}))

    name.__qualname__ = f"run_name({template!r})"
    return name


def keeps_its_name(from_deployment: bool, auto_scheduled: bool, idempotency_key: str | None) -> bool:
    """Whether a run's name is one a person gave (see the module docstring)."""
    return from_deployment and not auto_scheduled and not idempotency_key


def submission_base() -> Path:
    """What a relative path in a flow's request is relative to: the data root when a deployment runs the flow (the
    request came from a form or a schedule, with no directory of its own; never the worker's working directory),
    else the directory of the process that runs it (the CLI's, a notebook's)."""
    from prefect.runtime import deployment

    from tasks.paths import data_root

    return data_root() if deployment.id else Path.cwd()
