"""Pre-scoring check of red-team set 25 (issue 45): 30 held-out logs from committed files and issue threads.

    python tests/data/diagnosis/redteam25/check_set.py

Set 22's rules, reached through set 24's check and bound to this folder. Refused: a project found in the corpus, in
any other set's manifest or excluded list, or in this set's own list without being one of its projects (names
compared lower-cased); two logs from one project; a root_line its log does not contain; a missing log or field; a
category outside script/framework/infrastructure; one-line logs above a third of the set. Problems are printed one a
line with exit status 1; a clean set prints its size, its one-line and 100+-line logs and its counts by family and
category.
"""

from __future__ import annotations

import collections
import runpy
import sys
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
SET24 = runpy.run_path(str(HERE.parent / "redteam24" / "check_set.py"))
SET22 = SET24["SET22"]
LONG = SET24["LONG"]
# The shared rules bound to this folder; a caller may still pass `here=` to check another copy.
excluded = partial(SET22["excluded"], HERE)
one_line_logs = partial(SET22["one_line_logs"], here=HERE)
problems = partial(SET22["problems"], here=HERE)
long_logs = partial(SET24["long_logs"], here=HERE)


def summary(rows: list[dict]) -> str:
    """One line: the size of the set, its one-line and long logs, and its counts by family and category."""
    counts = {key: dict(sorted(collections.Counter(r[key] for r in rows).items())) for key in ("family", "category")}
    by = "; ".join(f"by {key} {tally}" for key, tally in counts.items())
    return f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line, {len(long_logs(rows))} of {LONG}+ lines; {by}"


def main() -> int:
    rows = SET22["_rows"](HERE / "manifest.jsonl")
    refusals = problems(rows, excluded())
    print("\n".join(refusals) if refusals else summary(rows))
    return 1 if refusals else 0


if __name__ == "__main__":
    sys.exit(main())
