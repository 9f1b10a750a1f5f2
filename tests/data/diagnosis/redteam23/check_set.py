"""Check red-team set 23 (issue 45, round 23: fresh held-out logs from issue threads and committed files) before it is
scored.

    python tests/data/diagnosis/redteam23/check_set.py

Set 22's rules, run on this folder: set 22's own functions, loaded fresh, with this folder in place of theirs.
Refuses (exit 1, one line per problem): a project named in another set's `excluded_projects.txt` or manifest, in the
corpus, or in this set's `excluded_projects.txt` beyond this set's own projects (compared lower-cased); a second log
from one project; a `root_line` that is not a substring of its log; a missing log; a manifest line without one of the
fields of set 8 or with an unknown category; more than a third of the logs being one quoted line. Prints the counts
by family and category and the number of long logs (100 lines or more) when all is well.
"""

from __future__ import annotations

import collections
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SET22 = runpy.run_path(str(HERE.parent / "redteam22" / "check_set.py"))
LONG = SET22["LONG"]


def excluded(here: Path = HERE) -> set[str]:
    """Set 22's rule on `here`: every other set's list and manifest, the corpus, and this list less its own projects."""
    return SET22["excluded"](here)


def one_line_logs(rows: list[dict], here: Path = HERE) -> list[str]:
    """The ids whose log in `here` is one line (a reporter's quoted error line)."""
    return SET22["one_line_logs"](rows, here)


def problems(rows: list[dict], banned: set[str], here: Path = HERE) -> list[str]:
    """What breaks set 22's rules in `here`, one line each."""
    return SET22["problems"](rows, banned, here)


def main() -> int:
    rows = SET22["_rows"](HERE / "manifest.jsonl")
    found = problems(rows, excluded())
    if found:
        print(*found, sep="\n")
        return 1
    lengths = [len(SET22["_log"](r, HERE).read_text().splitlines()) for r in rows]
    counts = {key: dict(sorted(collections.Counter(r[key] for r in rows).items())) for key in ("family", "category")}
    print(
        f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line, {sum(n >= LONG for n in lengths)} of {LONG}+"
        f" lines; by family {counts['family']}; by category {counts['category']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
