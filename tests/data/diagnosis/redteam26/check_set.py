"""Pre-scoring check of red-team set 26 (issue 45): 31 held-out logs from committed files and issue threads.

    python tests/data/diagnosis/redteam26/check_set.py

Set 25's check, run against this folder: set 25's module is loaded fresh with `runpy` (it loads set 24's, which loads
set 22's rules), and the shared rules are re-bound here. Refused: a project found in the corpus, in any other set's
manifest or excluded list, or in this set's own list without being one of its projects (names compared lower-cased);
two logs from one project; a root_line its log does not contain; a missing log or field; a category outside
script/framework/infrastructure; one-line logs above a third of the set. Problems are printed one a line with exit
status 1; a clean set prints its size, its one-line and 100+-line logs and its counts by family and category.
"""

from __future__ import annotations

import collections
import runpy
import sys
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
SET25 = runpy.run_path(str(HERE.parent / "redteam25" / "check_set.py"))
SET24 = SET25["SET24"]
SET22 = SET25["SET22"]
LONG = SET25["LONG"]
KEYS = ("family", "category")
# The shared rules bound to this folder; a caller may still pass `here=` to check another copy.
excluded = partial(SET22["excluded"], HERE)
one_line_logs = partial(SET22["one_line_logs"], here=HERE)
problems = partial(SET22["problems"], here=HERE)
long_logs = partial(SET24["long_logs"], here=HERE)


def summary(rows: list[dict]) -> str:
    """The clean-set line: size, one-line and long logs, then the tallies by family and by category."""
    head = f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line, {len(long_logs(rows))} of {LONG}+ lines"
    tallies = [f"by {key} {dict(sorted(collections.Counter(r[key] for r in rows).items()))}" for key in KEYS]
    return "; ".join([head, *tallies])


def main() -> int:
    """Print the refusals (exit status 1) or the summary of a clean set (exit status 0)."""
    rows = SET22["_rows"](HERE / "manifest.jsonl")
    refusals = problems(rows, excluded())
    if refusals:
        print(*refusals, sep="\n")
        return 1
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
