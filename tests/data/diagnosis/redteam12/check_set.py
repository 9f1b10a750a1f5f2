"""Check red-team set 12 (long logs, round 12) before it is scored: set 10's rules, run on this folder.

    python tests/data/diagnosis/redteam12/check_set.py

Set 11's loader points set 10's checks at this folder, so the rules are the same as set 11's: refuses (exit 1,
one line per problem) a project in an earlier set's `excluded_projects.txt` or manifest, in the corpus, or in this
set's `excluded_projects.txt` beyond its own projects (compared lower-cased); a second log from one project; a
`root_line` that is not a substring of its log; a missing log; a manifest line without one of the fields of set 8;
a log of fewer than 100 newline-terminated lines. Prints the count of logs and their line counts when all is well.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def checks(here: Path = HERE) -> ModuleType:
    """Set 10's check module, pointed at `here` (this set unless a test passes another folder)."""
    spec = importlib.util.spec_from_file_location("redteam11_check_set", HERE.parent / "redteam11" / "check_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.set10_checks(here)


if __name__ == "__main__":
    sys.exit(checks().main())
