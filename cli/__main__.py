"""`python -m cli ...` is `frenzy ...`."""

import sys

from cli.main import entry

sys.exit(entry())
