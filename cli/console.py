"""What `frenzy submit` and `frenzy demo` show on the terminal while the flow runs.

Prefect logs each failed task and flow with its traceback; the terminal gets the one line, and the traceback stays
where a person who needs it looks (the flow run's logs on the server, train.log for the trainer). The error the
command ends with is the cause, in one paragraph (flows/submit.py names it from the trainer's log).
"""

from __future__ import annotations

import logging
import os

from tasks.errors import FrenzyError
from tasks.pipeline.stopped import Stopped, SubmitInterrupted, stopped_at

STARTUP_VAR = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


class EphemeralStartError(FrenzyError, RuntimeError):
    """Prefect's embedded API server did not come up in time; names the setting and the server alternative."""


class OneLineFormatter(logging.Formatter):
    """Formats like `inner`, without the traceback or stack of the record."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        if not (record.exc_info or record.exc_text or record.stack_info):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:  # the other handlers (Prefect's API log) format the same record with its traceback
            return self.inner.format(record) + " (traceback in the flow run's logs)"
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def one_line_console() -> None:
    """Make every console handler of the process (Prefect's included) print log records without tracebacks."""
    import prefect.main  # noqa: F401 - Prefect configures its handlers on import; wrap them after

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            is_console = isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
            if is_console and not isinstance(h.formatter, OneLineFormatter):
                h.setFormatter(OneLineFormatter(h.formatter or logging.Formatter()))


def interrupted_message(command: str, checkpoint_uri: str, stopped: Stopped | None = None) -> str:
    """The one line Ctrl-C ends `command` with: where training stopped and how to go on (the record a Python caller
    gets in `SubmitInterrupted`, tasks/pipeline/stopped.py)."""
    return (stopped or stopped_at(checkpoint_uri)).line(f"frenzy {command}")


def embedded_server_outlives_ctrl_c() -> None:
    """Prefect starts its embedded API server as a child in the terminal's process group, so Ctrl-C killed it with
    the flow: the flow's last calls (the trainer's commit, the release, the run's final state) then failed on a dead
    server and retried for minutes, with connection tracebacks. Here the server starts in a session of its own: Ctrl-C
    reaches `frenzy` alone, which stops cleanly, and Prefect stops the server when `frenzy` exits."""
    import subprocess
    import types

    from prefect.server.api import server

    if getattr(server.subprocess, "frenzy_own_session", False):
        return

    class Popen(subprocess.Popen):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    names = {k: getattr(subprocess, k) for k in dir(subprocess) if not k.startswith("__") and k != "Popen"}
    server.subprocess = types.SimpleNamespace(**names, Popen=Popen, frenzy_own_session=True)  # type: ignore[assignment]


def run_submit(command: str, request: object) -> object | None:
    """Run the `submit` flow for `frenzy <command>`: an infeasible job is refused with MARP's message before the
    flow starts (nothing else printed first), tracebacks stay off the terminal, and Ctrl-C ends in one line (the
    flow has the trainer commit its step first). None when interrupted; SIGTERM prints the same line and exits 143."""
    import sys

    from cluster.inventory import load_cluster
    from tasks.pipeline.request import SubmitRequest
    from tasks.planning.calibration import load_observations
    from tasks.planning.plans import plan_resources

    assert isinstance(request, SubmitRequest)
    if request.executor == "local":  # raises InfeasibleJobError, which the CLI prints as the error (exit 2)
        plan_resources(request.job, load_cluster(request.cluster_spec), rank_by=request.rank_by, top=1,
                       observations=load_observations())
    one_line_console()
    from prefect.exceptions import TerminationSignal
    from prefect.settings import PREFECT_API_URL

    from flows.submit import submit  # Prefect and the trainer's modules: after the refusal, which needs neither

    if not PREFECT_API_URL.value():
        embedded_server_outlives_ctrl_c()
    def on_term(signum: int, _frame: object) -> None:  # Prefect's engine re-sends SIGTERM to this handler after
        raise TerminationSignal(signal=signum)             # its own clean-up: end with the line, not a silent death

    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    try:
        return submit(request)
    except RuntimeError as err:
        if "ephemeral Prefect API" not in str(err):
            raise
        raise EphemeralStartError(
            f"Prefect's embedded API did not start within {os.environ.get(STARTUP_VAR, '20')} s (a loaded machine): "
            f"run again with {STARTUP_VAR}=300, or start a server once (`prefect server start`) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api") from None
    except (KeyboardInterrupt, TerminationSignal) as err:  # Ctrl-C; SIGTERM (`kill`, a Prefect cancellation)
        logging.getLogger("prefect").setLevel(logging.WARNING)  # the embedded server's goodbye after the line: quiet
        stopped = err.stopped if isinstance(err, SubmitInterrupted) else None
        print(interrupted_message(command, request.job.training.checkpoint.uri, stopped), file=sys.stderr)
        if isinstance(err, TerminationSignal):
            raise SystemExit(128 + err.signal) from None  # 143: what a shell reports for a SIGTERMed command
        return None
