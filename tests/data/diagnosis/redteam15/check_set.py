"""Check red-team set 15 (issue 45, round 15: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam15/check_set.py

Set 14's rules (set 13's functions, which take the folder as an argument), run on this folder: refuses (exit 1, one
line per problem) a project in an earlier set's `excluded_projects.txt` or manifest (set 14's included), in the
corpus, or in this set's `excluded_projects.txt` beyond its own projects (compared lower-cased); a second log from
one project; a `root_line` that is not a substring of its log; a missing log; a manifest line without one of the
fields of set 8; more than a third of the logs being a single quoted line. Prints the counts by family and category
when all is well.
"""

from __future__ import annotations

import collections
import json
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SET14 = runpy.run_path(str(HERE.parent / "redteam14" / "check_set.py"))


def excluded(here: Path = HERE) -> set[str]:
    """Every project the set must not draw from: earlier sets (14 included), the corpus, this set's list."""
    return SET14["excluded"](here)


def one_line_logs(rows: list[dict], here: Path = HERE) -> list[str]:
    """Ids of the logs that hold a single line."""
    return SET14["one_line_logs"](rows, here)


def problems(rows: list[dict], banned: set[str], here: Path = HERE) -> list[str]:
    """What breaks the rules, one line each (set 14's checks with `here` as the set's folder)."""
    return SET14["problems"](rows, banned, here)


def main() -> int:
    rows = [json.loads(ln) for ln in (HERE / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    found = problems(rows, excluded())
    counts = {key: dict(sorted(collections.Counter(r[key] for r in rows).items())) for key in ("family", "category")}
    print("\n".join(found) or f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line; "
          f"by family {counts['family']}; by category {counts['category']}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
