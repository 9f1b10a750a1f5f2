"""How every `frenzy` command answers: one JSON document on stdout under `--json`, else a table or text; errors
on stderr with exit status 2 and the fix. Library chatter (solver banners, Ray, child processes) never reaches
the JSON document: while a `--json` command runs, stdout (the Python object and file descriptor 1) points at
stderr, and the document is written to the real stdout only after the command has finished."""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_UNSET = object()


class _Document:
    """The one JSON document a `--json` command produced (set by `emit`, printed by `run`)."""

    def __init__(self) -> None:
        self.doc: Any = _UNSET


_document: contextvars.ContextVar[_Document | None] = contextvars.ContextVar("frenzy_json_document", default=None)


def table(rows: list[dict[str, Any]], cols: Sequence[str] | None = None) -> str:
    """A plain fixed-width table."""
    if not rows:
        return "(none)"
    cols = list(cols or rows[0].keys())
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*cols), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in cells])


def emit(args: argparse.Namespace, doc: Any, human: Callable[[], str]) -> None:
    """The command's answer: `doc` as JSON under --json (printed once the command returns), else `human()`."""
    if not args.json:
        print(human())
        return
    holder = _document.get()
    if holder is None:  # called outside `run` (a test calling a command function directly)
        print(json.dumps(doc, indent=2, default=str))
        return
    if holder.doc is not _UNSET:
        raise RuntimeError("a --json command emitted two documents; it must print exactly one")
    holder.doc = doc


def progress(msg: str) -> None:
    """A progress line for a person: stderr, so it never mixes with the answer."""
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Point stdout (sys.stdout and fd 1, which C libraries and child processes write to) at stderr."""
    sys.stdout.flush()
    saved_obj = sys.stdout
    try:
        saved_fd = os.dup(1)
    except OSError:  # no fd 1 (a closed stdout): only the Python object can be redirected
        saved_fd = None
    try:
        if saved_fd is not None:
            os.dup2(2, 1)
        sys.stdout = sys.stderr
        yield
    finally:
        sys.stdout = saved_obj
        if saved_fd is not None:
            with contextlib.suppress(OSError):
                sys.stderr.flush()
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _error(command: str, err: BaseException) -> int:
    """A clear message on stderr, exit status 2, for errors whose message says what to fix."""
    if isinstance(err, OSError) and type(err) in _OS_WHAT:
        print(f"frenzy {command}: error: {err.filename or err}: {_OS_WHAT[type(err)]}", file=sys.stderr)
    else:
        print(f"frenzy {command}: error: {err}", file=sys.stderr)
    return 2


_OS_WHAT = {IsADirectoryError: "is a directory; give a file", NotADirectoryError: "is a file; give a directory",
            FileExistsError: "exists and is not a directory", PermissionError: "is not accessible"}

# ValueError covers JobSpecError, InventoryError, CatalogError, InfeasibleJobError, LedgerError and TraceError (all
# its subclasses: importing them here cost every command half a second); RuntimeError covers checkpoint and storage
# errors (and Ray's executor errors); TimeoutError is the queue's "no plan fitted within --max-wait", whose message
# names the fix
USER_ERRORS = (ValueError, RuntimeError, IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError,
               TimeoutError)


def _leave_ray() -> None:
    """Disconnect from Ray while stdout still points at stderr: its shutdown and dead-raylet banners (several KB
    after a node was lost) would otherwise land after the JSON document."""
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        with contextlib.suppress(Exception):
            ray.shutdown()


def run(args: argparse.Namespace) -> int:
    """Run the parsed command `args.fn`: its exit status; under --json exactly one document on stdout."""
    if not getattr(args, "json", False):
        try:
            return args.fn(args)
        except USER_ERRORS as err:
            return _error(args.command, err)
    holder = _Document()
    token = _document.set(holder)
    try:
        with _stdout_to_stderr():
            try:
                rc = args.fn(args)
            finally:
                _leave_ray()
    except USER_ERRORS as err:
        return _error(args.command, err)
    finally:
        _document.reset(token)
    if holder.doc is not _UNSET:
        sys.stdout.write(json.dumps(holder.doc, indent=2, default=str) + "\n")
        sys.stdout.flush()
    return rc
