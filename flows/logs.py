"""Log lines print as they were written, on every console a flow logs to (the CLI's terminal, a worker's, a
notebook's): Prefect's console handler prints through rich, which replaces emoji shortcodes by default, so a plugin
named `badplug:factory` in a message came out as `badplug🏭`. Prefect has a setting for markup (PREFECT_LOGGING_MARKUP,
off by default) but none for emoji; its console's print is given `emoji=False`, rich's own switch."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

PIPE_BROKEN = threading.Event()
"""Set when a console's reader went away (`frenzy submit ... | grep -m1 ...`): the console prints nothing more."""

on_broken_pipe: Callable[[], None] | None = None
"""Called once, from the thread that logged, when PIPE_BROKEN is first set: the CLI stops the run there (as SIGTERM
does: the trainer commits, the GPUs are released) and exits 141, as `cat` does (red team 41h N22)."""


def verbatim(handler: logging.Handler) -> None:
    """Have `handler`, when it prints through a rich console (PrefectConsoleHandler), print messages verbatim."""
    console = getattr(handler, "console", None)
    print_ = getattr(console, "print", None)
    if print_ is None or getattr(print_, "frenzy_verbatim", False):
        return

    def print_verbatim(*objects: object, **kwargs: object) -> None:
        kwargs.setdefault("emoji", False)
        print_(*objects, **kwargs)

    print_verbatim.frenzy_verbatim = True  # type: ignore[attr-defined]
    console.print = print_verbatim  # type: ignore[union-attr]
    console.on_broken_pipe = lambda: _gone_quiet(console)  # type: ignore[union-attr]


def _gone_quiet(console: object) -> None:
    """The reader of `console`'s stream went away. rich's own answer, SystemExit(1) from whichever thread logged,
    ended a training submit as a crash (exit 1) 85 s later (red team 41h N22): instead the console goes quiet (its
    stream to /dev/null) and `on_broken_pipe` is told, once."""
    console.quiet = True  # type: ignore[attr-defined]
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, console.file.fileno())  # type: ignore[attr-defined]
        os.close(devnull)
    if not PIPE_BROKEN.is_set():
        PIPE_BROKEN.set()
        if on_broken_pipe is not None:
            on_broken_pipe()


def console_handlers() -> list[logging.Handler]:
    """Every handler of every logger of this process that writes to a stream other than a file."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


def verbatim_console() -> None:
    """Every console handler of this process prints log messages verbatim, and Prefect's "Error logging to API"
    ends its line (called as a flow starts)."""
    for h in console_handlers():
        verbatim(h)
    api_log_errors_on_their_own_line()


def api_log_errors_on_their_own_line() -> None:
    """Prefect's API log worker, when the API refuses a batch of log lines (a server restarting, down), writes
    `--- Error logging to API ---` and then the error with no newline, so the next line on the terminal ran into it
    (red team 41r: `All connection attempts failed` glued to submit's next log line). Here it says the same on one
    line of its own, with how many log lines the run's logs on the server lack."""
    from prefect.logging.handlers import APILogWorker

    if getattr(APILogWorker._handle_batch, "frenzy_own_line", False):
        return

    async def handle_batch(self: Any, items: list[dict[str, Any]]) -> None:
        try:
            await self._client.create_logs(items)
        except Exception as err:  # noqa: BLE001 - as Prefect's: a log line not sent never ends the run
            if logging.raiseExceptions and sys.stderr:
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(f"--- Error logging to API --- {len(items)} log line(s) not sent to the Prefect API "
                                     f"({type(err).__name__}: {err}); the run's logs on the server lack them\n")
                    sys.stderr.flush()

    handle_batch.frenzy_own_line = True  # type: ignore[attr-defined]
    APILogWorker._handle_batch = handle_batch  # type: ignore[method-assign]
