"""Check red-team set 21 (issue 45, round 21: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam21/check_set.py

Set 16's rules run on this folder, as set 17 runs them: set 16's own module (which reaches the rules of sets 15, 14,
13 and 9), loaded fresh and pointed at this folder. Refuses (exit 1, one line per problem) a project in an earlier
set's `excluded_projects.txt` or manifest (sets 4 to 20), in the corpus, or in this set's `excluded_projects.txt`
beyond its own projects (compared lower-cased); a second log from one project; a `root_line` that is not a
substring of its log; a missing log; a manifest line without one of the fields of set 8; more than a third of the
logs being a single quoted line. Prints the counts by family and category when all is well.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_SPEC = importlib.util.spec_from_file_location("redteam16_check_set_for_21", HERE.parent / "redteam16" / "check_set.py")
SET16 = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(SET16)
SET16.HERE = HERE  # set 16's checks and its main take the set's folder from this name when not given one
excluded, one_line_logs, problems, main = SET16.excluded, SET16.one_line_logs, SET16.problems, SET16.main

if __name__ == "__main__":
    sys.exit(main())
