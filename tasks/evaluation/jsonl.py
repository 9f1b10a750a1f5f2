"""A user's JSONL dataset: one JSON object per line, checked for the fields its mode reads. Light (no torch), so
that a suite is checked, every row of it, when it is loaded: before training, not after it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.errors import FrenzyError
from tasks.userfiles import LIMITS, json_loads, read_text


class DatasetError(FrenzyError, ValueError):
    """A dataset that cannot be found or used; names the fix."""


_NEEDS = {"gen": ("prompt", "answer"), "ppl": ("prompt", "choices", "label"), "exec": ("prompt", "test", "entry_point")}


def _jsonl_row(row: Any, mode: str, where: str) -> dict:
    """One row of a user's JSONL dataset, checked for what `mode` reads from it."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: a row is a JSON object {{{', '.join(_NEEDS[mode])}}}, not {type(row).__name__}")
    missing = [k for k in _NEEDS[mode] if k not in row]
    if missing:
        raise DatasetError(f"{where}: a {mode} row needs {', '.join(_NEEDS[mode])}; missing {', '.join(missing)}")
    if not isinstance(row["prompt"], str):
        raise DatasetError(f"{where}: prompt must be a string")
    if mode == "ppl":
        choices, label = row["choices"], row["label"]
        if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
            raise DatasetError(f"{where}: choices must be a non-empty list of strings")
        if not (isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(choices)):
            raise DatasetError(f"{where}: label must be the index of the right choice, 0 to {len(choices) - 1}; "
                               f"got {label!r}")
    if mode == "exec" and not all(isinstance(row[k], str) for k in ("test", "entry_point")):
        raise DatasetError(f"{where}: test and entry_point must be strings")
    return row



def read_rows(path: str | Path, mode: str) -> list[dict]:
    """Every row of the JSONL file at `path`, each checked for what `mode` reads; the first bad line is named."""
    rows = []
    for n, line in enumerate(read_text(path, "dataset file", LIMITS["jsonl"]).splitlines(), 1):
        if line.strip():
            rows.append(_jsonl_row(json_loads(line, str(path), line=n), mode, f"{path}:{n}"))
    if not rows:
        raise DatasetError(f"{path} has no rows; give one JSON object per line")
    return rows
