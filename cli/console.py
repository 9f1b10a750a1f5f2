"""What `frenzy submit` and `frenzy demo` show on the terminal while the flow runs.

Prefect logs each failed task and flow with its traceback; the terminal gets the one line, and the traceback stays
where a person who needs it looks (the flow run's logs on the server, train.log for the trainer). The error the
command ends with is the cause, in one paragraph (flows/submit.py names it from the trainer's log).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from tasks.errors import FrenzyError
from tasks.pipeline.stopped import Stopped, SubmitInterrupted, stopped_at

if TYPE_CHECKING:
    from tasks.pipeline.request import SubmitRequest

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
    """Make every console handler of the process (Prefect's included) print log records without tracebacks, and
    print a message verbatim (no emoji for a `module:name:` in it)."""
    import prefect.main  # noqa: F401 - Prefect configures its handlers on import; wrap them after

    from flows.logs import console_handlers, verbatim

    for h in console_handlers():
        if not isinstance(h.formatter, OneLineFormatter):
            h.setFormatter(OneLineFormatter(h.formatter or logging.Formatter()))
        verbatim(h)


class ApiNotThere(FrenzyError, RuntimeError):
    """PREFECT_API_URL names no Prefect API: nothing answers, or a server answers 404 (the URL lacks `/api`)."""


PROBE_TIMEOUT_S = 5.0
"""The one request that checks PREFECT_API_URL before a run starts (Prefect's client would retry for many seconds)."""


def check_prefect_home() -> None:
    """Prefect's embedded API keeps its database in PREFECT_HOME (default ~/.prefect), which Prefect makes without its
    parents: under a HOME that does not exist (or cannot be written) the server never starts, and the wait for it
    ended in "did not start within 120 s (a loaded machine)", a wrong cause. Said at once, with the fix."""
    from pathlib import Path

    from prefect.settings import PREFECT_HOME

    home = Path(PREFECT_HOME.value()).expanduser()
    try:
        home.mkdir(exist_ok=True)
        usable = os.access(home, os.W_OK | os.X_OK)
        why = "is not writable"
    except OSError as err:
        usable, why = False, (f"cannot be made: {home.parent} does not exist" if not home.parent.exists()
                              else f"cannot be made ({err.strerror})")
    if not usable:
        raise EphemeralStartError(
            f"Prefect's home directory {home} {why}, so its embedded API cannot keep its database there: set HOME to "
            "an existing directory you can write, or PREFECT_HOME to one (or start a server once, `prefect server "
            "start`, and set PREFECT_API_URL=http://127.0.0.1:4200/api)")
    check_no_server_on(str(home))


def check_no_server_on(home: str) -> None:
    """Refuse an embedded API whose database (PREFECT_HOME's `prefect.db`) a running `prefect server` keeps too: the
    run would write into that server's database beside it (red team 41n ran so). Names the server and both fixes."""
    from prefect.settings import get_current_settings

    from tasks.procs import prefect_server_on

    url = get_current_settings().server.database.connection_url
    if url is not None and os.path.join(home, "prefect.db") not in url.get_secret_value():
        return  # a database of this command's own, not PREFECT_HOME's
    if (server := prefect_server_on(home)) is not None:
        raise EphemeralStartError(
            f"a Prefect server (pid {server.pid}, {server.api_url}) keeps its database in PREFECT_HOME={home}, which "
            "this command's embedded API would open too: submit through that server (export "
            f"PREFECT_API_URL={server.api_url}), or give this command another PREFECT_HOME")


def check_prefect_api(api: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One short request to the API's version endpoint (the one Prefect's client asks first): nothing answering (the
    connection refused or not made), or a server answering 404 Not Found, is said at once with what was found and the
    fix; any other answer, and a server slow to answer, is left to Prefect. A 404 is probed once more with `/api`
    added, to name the URL that answers."""
    import httpx
    from prefect.client.base import ServerType, determine_server_type

    from tasks.errors import api_not_found, nothing_answers

    if determine_server_type() == ServerType.CLOUD:  # Prefect Cloud has no version endpoint to ask; Prefect skips it
        return
    base = api.rstrip("/")
    tried = f"{base}/admin/version"
    try:
        status = httpx.get(tried, timeout=timeout_s).status_code
    except (httpx.ConnectError, httpx.ConnectTimeout) as err:  # refused, no route, no such host: nothing is there
        raise ApiNotThere(nothing_answers(api, err)) from None
    except httpx.HTTPError:  # connected, but slow to answer (a loaded server): left to Prefect's client and its retries
        return
    if status != 404:
        return
    answers = ""
    if not base.endswith("/api"):
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/api/admin/version", timeout=timeout_s).status_code == 200:
                answers = f"{base}/api"
    raise ApiNotThere(api_not_found(api, tried, answers))


def interrupted_message(command: str, checkpoint_uri: str, stopped: Stopped | None = None, ledger: str | None = None,
                        job: str = "") -> str:
    """The one line Ctrl-C ends `command` with: where training stopped and how to go on, or, once training had
    ended, that only the wait for the evaluations was cut (the record a Python caller gets in `SubmitInterrupted`,
    tasks/pipeline/stopped.py)."""
    return (stopped or stopped_at(checkpoint_uri, ledger, job)).line(f"frenzy {command}")


def refuse_before_the_flow(request: SubmitRequest) -> None:
    """What can be said before the flow's imports: a wrong API URL or an unusable Prefect home, and an infeasible job
    (MARP's InfeasibleJobError, which the CLI prints as the error, exit 2). Nothing else is printed first."""
    from prefect.settings import PREFECT_API_URL

    if api := PREFECT_API_URL.value():
        check_prefect_api(api)
    else:
        check_prefect_home()
        from flows.guardian import embedded_server_outlives_ctrl_c

        embedded_server_outlives_ctrl_c()
    from cluster.inventory import load_cluster
    from tasks.planning.calibration import load_observations
    from tasks.planning.plans import plan_resources

    if request.executor == "local":
        plan_resources(request.job, load_cluster(request.cluster_spec), rank_by=request.rank_by, top=1,
                       observations=load_observations())


def run_submit(command: str, request: object) -> object | None:
    """Run the `submit` flow for `frenzy <command>`: an infeasible job is refused with MARP's message before the
    flow starts (nothing else printed first), tracebacks stay off the terminal, and Ctrl-C ends in one line (the
    flow has the trainer commit its step first) that says where the run was: planning (these checks, the imports),
    queued, training or evaluating. None when interrupted; SIGTERM prints the same line and exits 143."""
    from tasks.pipeline.request import SubmitRequest
    from tasks.pipeline.stopped import reached

    assert isinstance(request, SubmitRequest)
    reached(request.job.name, "planning")  # until the flow's stages say more (flows/stages.py, FlowStages.reach)
    try:
        return _run_flow(request)
    except BaseException as err:
        if (signum := stop_signal(err)) is None:
            raise
        logs = sys.modules.get("flows.logs")  # not imported yet when the stop came during the checks or the imports
        logging.getLogger("prefect").setLevel(logging.WARNING)  # the embedded server's goodbye after the line: quiet
        stopped = err.stopped if isinstance(err, SubmitInterrupted) else None
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone: the line goes where it can
            print(interrupted_message(command, request.job.training.checkpoint.uri, stopped, request.ledger,
                                      request.job.name), file=sys.stderr)
        if signum:  # 143 (129 for SIGHUP, 141 for a reader gone): what a shell reports
            raise SystemExit(128 + (signal.SIGPIPE if logs and logs.PIPE_BROKEN.is_set() else signum)) from None
        return None
    finally:
        if (logs := sys.modules.get("flows.logs")) is not None:
            logs.on_broken_pipe = None  # a later broken pipe of this process (a notebook's) stops nothing


def stop_signal(err: BaseException) -> int | None:
    """The signal that `err` stops the command for: 0 for Ctrl-C, the number for SIGTERM/SIGHUP (raised as
    cli/output.py's `Signalled` before the flow's handler is set, as Prefect's TerminationSignal after); None when
    `err` is no stop."""
    from cli.output import Signalled

    if isinstance(err, Signalled):
        return err.signum
    if isinstance(err, KeyboardInterrupt):
        return 0
    prefect_exceptions = sys.modules.get("prefect.exceptions")
    if prefect_exceptions is not None and isinstance(err, prefect_exceptions.TerminationSignal):
        return int(err.signal)
    return None


def _run_flow(request: SubmitRequest) -> object:
    """The checks before the flow, then the flow, with SIGTERM and SIGHUP raising Prefect's TerminationSignal."""
    refuse_before_the_flow(request)
    one_line_console()
    from prefect.exceptions import TerminationSignal

    import flows.logs
    from flows.submit import submit  # the trainer's modules: after the refusal, which does not need them

    def on_term(signum: int, _frame: object) -> None:  # Prefect's engine re-sends SIGTERM to this handler after
        raise TerminationSignal(signal=signum)             # its own clean-up: end with the line, not a silent death

    if threading.current_thread() is threading.main_thread():
        # the reader of the output went away: stop as SIGTERM does (trainer commits, GPUs released), then exit 141
        flows.logs.PIPE_BROKEN.clear()
        flows.logs.on_broken_pipe = lambda: os.kill(os.getpid(), signal.SIGTERM)
        signal.signal(signal.SIGTERM, on_term)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # the terminal closed: as SIGTERM (not under nohup)
            signal.signal(signal.SIGHUP, on_term)  # red team 41h N23: it killed the flow, left Running, GPUs held
    try:
        return submit(request)
    except RuntimeError as err:
        if "ephemeral Prefect API" not in str(err):
            raise
        raise EphemeralStartError(
            f"Prefect's embedded API did not start within {os.environ.get(STARTUP_VAR, '20')} s (a loaded machine): "
            f"run again with {STARTUP_VAR}=300, or start a server once (`prefect server start`) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api") from None
