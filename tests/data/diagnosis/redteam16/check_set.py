"""Check red-team set 16 (issue 45, round 16: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam16/check_set.py

Set 15's rules, run on this folder: set 15's own functions (which reach those of sets 14, 13 and 9) with this folder
as their default. Refuses (exit 1, one line per problem) a project in an earlier set's `excluded_projects.txt` or
manifest (set 15's included), in the corpus, or in this set's `excluded_projects.txt` beyond its own projects
(compared lower-cased); a second log from one project; a `root_line` that is not a substring of its log; a missing
log; a manifest line without one of the fields of set 8; more than a third of the logs being a single quoted line.
Prints the counts by family and category when all is well.
"""

from __future__ import annotations

import collections
import json
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SET15 = runpy.run_path(str(HERE.parent / "redteam15" / "check_set.py"))


def _on_this_folder(name: str) -> Callable[..., object]:
    """Set 15's check `name`, whose last argument (the set's folder) defaults to this folder instead of set 15's."""
    check = SET15[name]
    arity = check.__code__.co_argcount

    def run(*args: object) -> object:
        return check(*args) if len(args) == arity else check(*args, HERE)

    run.__doc__ = check.__doc__
    return run


excluded = _on_this_folder("excluded")
one_line_logs = _on_this_folder("one_line_logs")
problems = _on_this_folder("problems")


def main() -> int:
    rows = [json.loads(ln) for ln in (HERE / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    found = problems(rows, excluded())
    if found:
        print(*found, sep="\n")
        return 1
    tallies = "; ".join(f"by {key} {dict(sorted(collections.Counter(r[key] for r in rows).items()))}"
                        for key in ("family", "category"))
    print(f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line; {tallies}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
