"""`python -m cli ...` is `frenzy ...`."""

import sys

from cli.main import main

sys.exit(main())
