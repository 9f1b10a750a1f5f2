"""`python -m cli ...` is `frenzy ...`."""

import gc
import sys

from cli.main import main

code = main()
gc.freeze()  # as tasks/quickexit.py's exit_now (not imported: `frenzy --help` imports nothing of tasks/)
sys.exit(code)
