"""Environment variables in a path, expanded as a shell would (tasks/paths.py's module docstring): below
tasks.paths so that readers the job model itself calls (tasks/hf/config.py) expand as every path field does."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tasks.errors import FrenzyError


class PathError(FrenzyError, ValueError):
    """A path in a request that may not be used as given."""


_VAR = re.compile(r"\$(?:\{([^}]*)\}?|([A-Za-z_][A-Za-z0-9_]*))")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_vars(path: str, field: str) -> str:
    """`path` with `$NAME` and `${NAME}` replaced by their values in this process's environment; an unset variable or
    a shell expression is refused naming `field`. A `$` not before a name stays as it is."""
    def value(m: re.Match) -> str:
        name = m.group(2) if m.group(2) is not None else m.group(1)
        if m.group(2) is None and (not m.group(0).endswith("}") or not _NAME.fullmatch(name)):
            raise PathError(f"{field} {path!r}: {m.group(0)!r} is a shell expression, which Frenzy does not evaluate "
                            "(it expands only $NAME and ${NAME}): write the path out, or set a variable and use ${NAME}")
        if name not in os.environ:
            raise PathError(f"{field} {path!r}: the environment variable ${name} is not set where the job is "
                            f"resolved (a path is never made with a literal ${name} in it): set {name}, or write "
                            "the path out (~ is your home)")
        return os.environ[name]

    return _VAR.sub(value, path) if "$" in path else path


def frenzy_home() -> Path:
    """`$FRENZY_HOME` (default ~/.frenzy), absolute: a worker started with a relative FRENZY_HOME keeps one place
    wherever its flows run from."""
    return Path(os.environ.get("FRENZY_HOME") or "~/.frenzy").expanduser().absolute()
