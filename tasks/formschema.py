"""The JSON schema the Prefect UI builds a deployment's form from, without the noise of optional fields.

Pydantic gives a field `X | None = None` the schema `anyOf: [X, null], default: null`; Prefect's form draws the
`null` branch as a second input reading "Property is type None" (about 20 of them on the `submit` form). The form
needs only X: a field left empty is left out of the parameters, and the model then takes its default (None). This
changes the schema only; validation of what a run receives is pydantic's as before.
"""

from __future__ import annotations

from typing import Any


def drop_null_branches(schema: dict[str, Any]) -> None:
    """`json_schema_extra` for a model: each optional property's schema becomes its non-null branch, with no
    `default: null` (which the form would send back as a null value)."""
    for prop in schema.get("properties", {}).values():
        branches = prop.get("anyOf")
        if not branches or not any(b.get("type") == "null" for b in branches):
            continue
        rest = [b for b in branches if b.get("type") != "null"]
        del prop["anyOf"]
        if len(rest) == 1:
            prop.update({k: v for k, v in rest[0].items() if k not in prop})
            if set(rest[0]) == {"$ref"}:  # an optional section: see optional_section
                prop["type"] = "object"
        else:
            prop["anyOf"] = rest
        if prop.get("default", 0) is None:
            del prop["default"]


def optional_section(schema: dict[str, Any]) -> None:
    """`json_schema_extra` for a model that is an optional field's type (`evaluation: EvaluationSpec | None`).

    Prefect validates a deployment's parameters against this schema, after its own preprocessing makes a property
    that has a `type`, no default and is not required accept null. The property of an optional section carries
    `type: object` beside its `$ref` (drop_null_branches), so it accepts null that way, and this model's schema leaves
    `type` out so that a null passes its `$ref` too (its other keywords apply to objects only): `run_deployment` with
    `job.model_dump()`, which holds `evaluation: None`, is accepted as before."""
    drop_null_branches(schema)
    schema.pop("type", None)
