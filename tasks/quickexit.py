"""Ending a process without the interpreter's last garbage collections over every module it imported.

A process that imported torch, its compiler stack and pandas (a trainer, an evaluation trial, `frenzy submit`) spent
2-3 s after its work was done, at one core, in the collections `Py_FinalizeEx` runs while it clears the modules: the
caller (a test, `frenzy submit` waiting for its trainer) waited for that exit. `gc.freeze()` first moves every object
alive at that moment out of the collector's view; objects are still freed by reference counting as the modules are
cleared, and the `atexit` handlers (logging's flush, `weakref.finalize`) still run. Measured in
benchmarks/results/test_suite.md. A leaf module: it imports nothing of the project."""

from __future__ import annotations

import gc
import sys
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    """`sys.exit(code)` for a `__main__` entry point whose work is done, without the final collections."""
    gc.freeze()
    sys.exit(code)
