"""Prefect artifact keys that name one run, not one job name.

A key made from the job name alone is shared by every user's run of that name (alice's and bob's `exp` overwrite one
`report-exp`), and lowercasing plus mapping `.`/`_` to `-` makes distinct names collide (`Form.v1-x_Y` and
`form-v1-x-y`). A run is its checkpoint root, so a run's key is `<kind>-<name, slugged>-<8 hex digits>`, the digits a
hash of the exact job name and the checkpoint root URI (`file://` and a trailing `/` do not change it). The key stays
what Prefect accepts: lowercase letters, digits and dashes. The name is never shortened (a job name has at most 128
characters and Prefect's keys have no length limit): `<kind>-<name, slugged>-` is the key's prefix for every name, so
the search docs/prefect.md gives (`report-<job>`) finds a run's report whatever its length (red team 41g S02: a
128-character name was cut to 96 and the search found nothing).
"""

from __future__ import annotations

import hashlib
import re

from tasks.paths import place_key


def slug(text: str) -> str:
    """`text` as Prefect's key alphabet: lowercase ASCII letters, digits, single dashes."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def root_identity(root: str) -> str:
    """The spelling-independent form of a checkpoint root (tasks.paths.place_key, the one comparison of roots),
    without its `file://`."""
    return place_key(root).removeprefix("file://")


def run_key(kind: str, name: str, root: str) -> str:
    """The artifact key of `kind` (report, plans, eval, ...) for the run of job `name` at checkpoint root `root`."""
    digest = hashlib.sha256(f"{name}\0{root_identity(root)}".encode()).hexdigest()[:8]
    return "-".join(p for p in (slug(kind), slug(name), digest) if p)


def step_root(step_uri: str) -> str:
    """The checkpoint root of a step's URI (`<root>/step_00000020` -> `<root>`)."""
    return step_uri.rstrip("/").rsplit("/", 1)[0]
