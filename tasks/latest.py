"""Post the newest of a stream of values in the background: `LatestOnly`. The trainer's progress records were relayed
to the Prefect API one synchronous artifact update each; on a loaded server (or one restarting) each took seconds, the
relay fell minutes behind the trainer, and the run released its GPUs minutes after training ended (red team 41h N15,
N23: the printed step lagged the trainer by 1-3.5 min). Only the newest value matters for a progress bar, so the
caller never waits: a value posted while the previous post is still in flight replaces any value not yet posted. No
Prefect here: the post is a callable."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LatestOnly(Generic[T]):
    """`put(v)` returns at once; a daemon thread calls `post` with the newest value not yet posted. A post that raises
    is passed to `on_error` (once per failure) and the next value is posted as usual. `close(timeout_s)` posts what is
    left and stops the thread, waiting at most `timeout_s` (a stuck API does not hold the caller)."""

    def __init__(self, post: Callable[[T], None], on_error: Callable[[BaseException], None] = lambda _: None) -> None:
        self.post, self.on_error = post, on_error
        self._cv = threading.Condition()
        self._value: T | None = None
        self._pending = False
        self._closed = False
        self.posted = 0
        self.dropped = 0
        """Values replaced before they were posted (a slow API): the relay did not wait for them."""
        ctx = contextvars.copy_context()  # the caller's settings (a Prefect API URL set in a context) hold in the thread
        self._thread = threading.Thread(target=ctx.run, args=(self._run,), name="latest-only", daemon=True)
        self._thread.start()

    def put(self, value: T) -> None:
        with self._cv:
            if self._pending:
                self.dropped += 1
            self._value, self._pending = value, True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                value, self._pending = self._value, False
            try:
                self.post(value)  # type: ignore[arg-type]
                self.posted += 1
            except Exception as err:  # noqa: BLE001 - a progress bar the API did not take is not the run's failure
                self.on_error(err)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Post what is left and stop; True when the thread ended within `timeout_s`."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
