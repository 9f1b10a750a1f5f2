"""Check red-team set 11 (long logs, round 11) before it is scored: set 10's rules, run on this folder.

    python tests/data/diagnosis/redteam11/check_set.py

Set 10's checks, unchanged, with this folder as the set: refuses (exit 1, one line per problem) a project in an
earlier set's `excluded_projects.txt` or manifest, in the corpus, or in this set's `excluded_projects.txt` beyond
its own projects (compared lower-cased); a second log from one project; a `root_line` that is not a substring of
its log; a missing log; a manifest line without one of the fields of set 8; a log of fewer than 100
newline-terminated lines (carriage returns of a progress bar do not count). Prints the count of logs and their
line counts when all is well.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def set10_checks(here: Path = HERE) -> ModuleType:
    """Set 10's check module, pointed at `here` (this set unless a test passes another folder)."""
    spec = importlib.util.spec_from_file_location("redteam10_check_set", HERE.parent / "redteam10" / "check_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.HERE = here
    return module


if __name__ == "__main__":
    sys.exit(set10_checks().main())
