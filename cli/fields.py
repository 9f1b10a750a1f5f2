"""Command-line flags generated from the pydantic request models the Prefect forms are drawn from: one declaration per
setting. Each field becomes a flag (its name, a unit suffix `_s` dropped, underscores as dashes, unless the field's
`json_schema_extra` names one as `cli`), with the field's docstring as help, its default, its Literal choices, and
its constraints checked while the command line is parsed (a bad value is an exit-2 message naming the flag and the
allowed range). Flags left out are left out of the request: the model's own default applies."""

from __future__ import annotations

import argparse
import math
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from tasks.errors import FrenzyError


class ArgumentError(FrenzyError, ValueError):
    """A flag's value the request model refuses; the message names the flag."""


def _cli_extra(f: FieldInfo) -> dict[str, Any]:
    extra = f.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def flag(name: str, f: FieldInfo) -> str | None:
    """The flag of field `name` (None: the field is not on the command line)."""
    extra = _cli_extra(f)
    if "cli" in extra:
        return extra["cli"]
    return "--" + re.sub(r"_s$", "", name).replace("_", "-")


def _strip_optional(ann: Any) -> Any:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(ann) if a is not type(None)]
        return rest[0] if len(rest) == 1 else ann
    return ann


def _value_type(ann: Any, metadata: list[Any], what: str) -> Callable[[str], Any]:
    """An argparse type that validates one value as pydantic would, and refuses non-finite numbers."""
    adapter: TypeAdapter = TypeAdapter(Annotated[ann, *metadata] if metadata else ann)

    bounds = _bounds(metadata)

    def parse(text: str) -> Any:
        try:
            v = adapter.validate_python(text)
        except ValidationError as err:
            kind = err.errors()[0]["type"]
            if kind.startswith(("greater_than", "less_than")) and bounds:
                raise argparse.ArgumentTypeError(f"{text} is out of range: give {bounds}") from None
            raise argparse.ArgumentTypeError(f"{text!r}: {err.errors()[0]['msg']}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a finite number{' ' + bounds if bounds else ''}")
        return v

    parse.__name__ = what  # argparse names the type in its message
    return parse


def _bounds(metadata: list[Any]) -> str:
    """The allowed range from a field's constraints, in words: "0 to 20", "more than 0", "0 up to (not including)
    0.5"."""
    lo = hi = None
    lo_open = hi_open = False
    for m in metadata:
        for attr, is_lo, opened in (("ge", True, False), ("gt", True, True), ("le", False, False), ("lt", False, True)):
            if getattr(m, attr, None) is not None:
                if is_lo:
                    lo, lo_open = getattr(m, attr), opened
                else:
                    hi, hi_open = getattr(m, attr), opened
    if lo is not None and hi is not None:
        return f"{'more than ' if lo_open else ''}{lo} {'up to (not including)' if hi_open else 'to'} {hi}"
    if lo is not None:
        return f"{'more than' if lo_open else 'at least'} {lo}"
    return f"{'less than' if hi_open else 'at most'} {hi}" if hi is not None else ""


def _help(f: FieldInfo) -> str:
    text = " ".join((f.description or "").split()).replace("%", "%%")
    if not f.is_required() and f.default not in (None, [], "") and f.default_factory is None:
        shown = f.default if not isinstance(f.default, bool) else ("on" if f.default else "off")
        text += f" (default: {shown})"
    return text


def add_fields(sp: argparse.ArgumentParser, model: type[BaseModel], *, skip: Iterable[str] = (),
               positional: Iterable[str] = ()) -> None:
    """One argument per field of `model` except `skip`; fields in `positional` are positional arguments."""
    skip, positional = set(skip), set(positional)
    for name, f in model.model_fields.items():
        opt = flag(name, f)
        if name in skip or (opt is None and name not in positional):
            continue
        ann = _strip_optional(f.annotation)
        kw: dict[str, Any] = {"help": _help(f), "dest": name}
        if typing.get_origin(ann) is list:
            item = typing.get_args(ann)[0]
            kw["action"] = "append"
            ann = item
        if typing.get_origin(ann) is Literal:
            kw["choices"] = list(typing.get_args(ann))
        elif ann is bool:  # on by default: --x/--no-x; off by default: --x alone
            kw["action"] = argparse.BooleanOptionalAction if f.default else "store_true"
        elif ann is str and not f.metadata:
            kw["type"] = str
        else:
            kw["type"] = _value_type(ann, list(f.metadata), getattr(ann, "__name__", "value"))
        if "choices" not in kw and kw.get("action") not in (argparse.BooleanOptionalAction, "store_true"):
            kw["metavar"] = "SECONDS" if name.endswith("_s") else opt.lstrip("-").upper().replace("-", "_") if opt else None
        if name in positional:
            del kw["dest"]
            sp.add_argument(name, **kw)
        else:
            sp.add_argument(opt, default=argparse.SUPPRESS, **kw)


def given(args: argparse.Namespace, model: type[BaseModel], skip: Iterable[str] = ()) -> dict[str, Any]:
    """The fields of `model` the command line set."""
    return {n: getattr(args, n) for n in model.model_fields if n not in set(skip) and hasattr(args, n)}


M = typing.TypeVar("M", bound=BaseModel)


def build(model: type[M], data: dict[str, Any]) -> M:
    """`model` from the command line's values; what it refuses is an ArgumentError naming the flag."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            name = str(e["loc"][0]) if e["loc"] else ""
            f = model.model_fields.get(name)
            where = (flag(name, f) or name) if f is not None else name
            problems.append(f"{where}: {e['msg']}" if where else e["msg"])
        raise ArgumentError("; ".join(problems)) from None


def _nested_field(model: type[BaseModel], path: str) -> FieldInfo:
    *parents, leaf = path.split(".")
    for p in parents:
        model = _strip_optional(model.model_fields[p].annotation)
    return model.model_fields[leaf]


OVERRIDE = "override:"


def add_overrides(sp: argparse.ArgumentParser, model: type[BaseModel], paths: dict[str, str]) -> None:
    """Flags that override a field of the input file (`--steps` for the job's `training.steps`), with that field's
    help, type and range."""
    for opt, path in paths.items():
        f = _nested_field(model, path)
        text = " ".join((f.description or "").split()).replace("%", "%%")
        sp.add_argument(opt, dest=OVERRIDE + path, default=argparse.SUPPRESS, metavar=opt.lstrip("-").upper(),
                        type=_value_type(_strip_optional(f.annotation), list(f.metadata), "value"),
                        help=f"instead of the job's {path}: {text}")


def overridden(args: argparse.Namespace) -> dict[str, Any]:
    """The overrides the command line gave, by dotted path."""
    return {k.removeprefix(OVERRIDE): v for k, v in vars(args).items() if k.startswith(OVERRIDE)}


def apply_overrides(obj: M, overrides: dict[str, Any]) -> M:
    """`obj` with the dotted-path `overrides` set, validated again as a whole (a micro_batch that no longer divides
    the new global_batch is refused)."""
    if not overrides:
        return obj
    data = obj.model_dump()
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        node = data
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[leaf] = value
    try:
        return type(obj).model_validate(data)
    except ValidationError as err:
        raise ArgumentError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())) from None
