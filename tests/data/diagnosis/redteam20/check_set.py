"""Check red-team set 20 (issue 45, round 20: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam20/check_set.py

The rules of set 17, which runs set 16's rules (and through them those of sets 15, 14, 13 and 9), run on this
folder: set 17's module is run afresh and the set-16 module it loads is pointed at this folder. Refuses (exit 1, one
line per problem) a project in an earlier set's `excluded_projects.txt` or manifest (sets 9 to 17 included), in the
corpus, or in this set's `excluded_projects.txt` beyond its own projects (compared lower-cased); a second log from
one project; a `root_line` that is not a substring of its log; a missing log; a manifest line without one of the
fields of set 8; more than a third of the logs being a single quoted line. Prints the counts by family and category
when all is well.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SET17 = runpy.run_path(str(HERE.parent / "redteam17" / "check_set.py"), run_name="redteam17_check_set_for_set_20")
SET17["SET16"].HERE = HERE  # the set-16 checks read the set's folder from this name when not given one
excluded, one_line_logs, problems, main = (SET17[name] for name in ("excluded", "one_line_logs", "problems", "main"))

if __name__ == "__main__":
    sys.exit(main())
