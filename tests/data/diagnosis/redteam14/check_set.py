"""Check red-team set 14 (issue 45, round 14: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam14/check_set.py

Set 13's rules, run on this folder through set 13's own functions (which take the folder as an argument): refuses
(exit 1, one line per problem) a project in an earlier set's `excluded_projects.txt` or manifest (set 13's
included), in the corpus, or in this set's `excluded_projects.txt` beyond its own projects (compared lower-cased);
a second log from one project; a `root_line` that is not a substring of its log; a missing log; a manifest line
without one of the fields of set 8; more than a third of the logs being a single quoted line. Prints the counts
by family and category when all is well.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def set13_checks() -> ModuleType:
    """Set 13's check module (set 9's rules, set 10's exclusion list, the one-line share), loaded fresh."""
    spec = importlib.util.spec_from_file_location("redteam13_check_set", HERE.parent / "redteam13" / "check_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def problems(rows: list[dict], banned: set[str], here: Path = HERE) -> list[str]:
    """What breaks the rules, one line each (set 13's checks with `here` as the set's folder)."""
    return set13_checks().problems(rows, banned, here)


def excluded(here: Path = HERE) -> set[str]:
    """Every project the set must not draw from: earlier sets (13 included), the corpus, this set's list."""
    return set13_checks().excluded(here)


def one_line_logs(rows: list[dict], here: Path = HERE) -> list[str]:
    """Ids of the logs that hold a single line."""
    return set13_checks().one_line_logs(rows, here)


def main() -> int:
    rows = [json.loads(ln) for ln in (HERE / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    found = problems(rows, excluded())
    if found:
        print("\n".join(found))
        return 1
    by_family = dict(sorted(collections.Counter(r["family"] for r in rows).items()))
    by_category = dict(sorted(collections.Counter(r["category"] for r in rows).items()))
    print(f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line; by family {by_family}; "
          f"by category {by_category}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
