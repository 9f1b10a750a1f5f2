"""Check red-team set 19 (issue 45, round 19: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam19/check_set.py

Set 17's rules run on this folder: set 17's own module (which reaches set 16's, and through it the rules of sets 15,
14, 13 and 9), loaded fresh, with the folder that set 16's checks and main read pointed at this one. Refuses (exit 1,
one line per problem) a project in an earlier set's `excluded_projects.txt` or manifest (set 17's included), in the
corpus, or in this set's `excluded_projects.txt` beyond its own projects (compared lower-cased); a second log from
one project; a `root_line` that is not a substring of its log; a missing log; a manifest line without one of the
fields of set 8; more than a third of the logs being a single quoted line. Prints the counts by family and category
when all is well.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_SPEC = importlib.util.spec_from_file_location("redteam17_check_set", HERE.parent / "redteam17" / "check_set.py")
SET17 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(SET17)
SET17.SET16.HERE = HERE  # set 16's checks and its main take the set's folder from this name when not given one
excluded, one_line_logs, problems, main = SET17.excluded, SET17.one_line_logs, SET17.problems, SET17.main

if __name__ == "__main__":
    sys.exit(main())
