"""Check red-team set 24 (issue 45, round 24: held-out logs from committed files and issue threads) before scoring.

    python tests/data/diagnosis/redteam24/check_set.py

The rules are set 22's, applied to this folder through set 22's own functions (loaded fresh): a project named in any
other set's `excluded_projects.txt` or manifest, in the corpus, or in this set's list beyond its own projects is
refused (compared lower-cased), and so are a second log from one project, a `root_line` missing from its log, a
missing log or field, an unknown category, and more than a third of one-line logs. Exit 1 with one line per problem;
otherwise print the counts by family and category and how many logs have 100 lines or more.
"""

from __future__ import annotations

import collections
import runpy
import sys
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
SET22 = runpy.run_path(str(HERE.parent / "redteam22" / "check_set.py"))
LONG = SET22["LONG"]
# Set 22's functions bound to this folder; a caller may still pass `here=` to check another copy.
excluded = partial(SET22["excluded"], HERE)
one_line_logs = partial(SET22["one_line_logs"], here=HERE)
problems = partial(SET22["problems"], here=HERE)


def long_logs(rows: list[dict], here: Path = HERE) -> list[str]:
    """Ids whose log in `here` has LONG lines or more."""
    return [r["id"] for r in rows if len(SET22["_log"](r, here).read_text().splitlines()) >= LONG]


def main() -> int:
    rows = SET22["_rows"](HERE / "manifest.jsonl")
    refusals = problems(rows, excluded())
    for refusal in refusals:
        print(refusal)
    if refusals:
        return 1
    tally = "; ".join(f"by {key} {dict(sorted(collections.Counter(r[key] for r in rows).items()))}" for key in ("family", "category"))
    print(f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line, {len(long_logs(rows))} of {LONG}+ lines; {tally}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
