"""The one error type a user can act on. Every failure caused by the user's input or environment (a job file, a
path, a cluster file, a full disk) is a `FrenzyError` whose message names the input and the fix: the CLI prints it
and exits 2. Anything else that escapes a command is a bug: the CLI says so, writes the traceback to a file and
exits 1 (cli/output.py). A leaf module: it imports nothing of the project, so every layer may raise these."""

from __future__ import annotations


class FrenzyError(Exception):
    """A failure the user can fix; the message names the input (file, field, line) and the fix."""

