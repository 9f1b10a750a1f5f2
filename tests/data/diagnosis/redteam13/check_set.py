"""Check red-team set 13 (issue 45, round 13: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam13/check_set.py

Set 9's rules with set 10's list of excluded projects, run on this folder: refuses (exit 1, one line per problem) a
project in an earlier set's `excluded_projects.txt` or manifest, in the corpus, or in this set's
`excluded_projects.txt` beyond its own projects (compared lower-cased); a second log from one project; a `root_line`
that is not a substring of its log; a missing log; a manifest line without one of the fields of set 8; and, as the
brief of this round asks, more than a third of the logs being a single quoted line. No length floor (sets 10 to 12
asked for 100+ lines; this round takes thread excerpts). Prints the counts when all is well.
"""

from __future__ import annotations

import collections
import json
import runpy
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def set10_checks(here: Path = HERE) -> ModuleType:
    """Set 10's check module pointed at `here`, as set 12's loader hands it out (its `excluded()`, set 9's rules)."""
    set12 = runpy.run_path(str(HERE.parent / "redteam12" / "check_set.py"))
    return set12["checks"](here)


def one_line_logs(rows: list[dict], here: Path = HERE) -> list[str]:
    """Ids of the logs that hold a single line (a quoted error line rather than a pasted log)."""
    count = set10_checks(here).line_count
    return [r["id"] for r in rows if count((here / "logs" / f"{r['id']}.log").read_text(encoding="utf-8")) <= 1]


def problems(rows: list[dict], banned: set[str], here: Path = HERE) -> list[str]:
    """What breaks the rules, one line each: set 9's checks, then the share of one-line logs."""
    out = set10_checks(here)._set9_checks().problems(rows, banned)
    if out:
        return out
    single = one_line_logs(rows, here)
    if 3 * len(single) > len(rows):
        out.append(f"{len(single)} of {len(rows)} logs are one line: more than a third ({', '.join(single)})")
    return out


def excluded(here: Path = HERE) -> set[str]:
    """Every project the set must not draw from (set 10's rule: earlier sets, the corpus, this set's list)."""
    return set10_checks(here).excluded()


def _summary(rows: list[dict]) -> str:
    families = collections.Counter(r["family"] for r in rows)
    categories = collections.Counter(r["category"] for r in rows)
    return (f"ok: {len(rows)} logs from {len(rows)} projects, {len(one_line_logs(rows))} of one line; "
            f"families {dict(sorted(families.items()))}; categories {dict(sorted(categories.items()))}")


def main() -> int:
    rows = [json.loads(ln) for ln in (HERE / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    found = problems(rows, excluded())
    print("\n".join(found) or _summary(rows))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
