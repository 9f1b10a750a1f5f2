"""A watcher for a `submit` flow run that a user's own process (the CLI, a notebook) runs against a Prefect server.

A flow run that a worker started is marked Crashed by the worker when its process dies. One that a user's process
runs has no such watcher: killed by SIGKILL or the kernel's out-of-memory killer, it stayed Running on the server for
good, in the UI and to every automation (red team 41i). `guarded()` starts a small process, in a session of its own
(a Ctrl-C or a `kill` of the submitter's process group does not reach it), that holds the read end of a pipe. The flow
tells it the flow run's id; the submitter writes `done` once the flow call has ended by any path Python sees (success,
failure, Ctrl-C, SIGTERM: Prefect sets those states itself). End of file without `done` means the process died
without ending its run: the guardian sets the flow run Crashed, saying so, unless it had already reached a final state.

    python -m flows.guardian PID    (stdin: `id <flow run id>`, `phase <where the run is>` and `done` lines)

The flow tells its phase as it goes (tasks/pipeline/stopped.py's PHASES), so a Crashed message says what the killed
process held: a run killed while it waited in the queue held no GPUs and had no trainer (red team 41r).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_guards: dict[int, list[int]] = {}
"""Write ends of the pipes of this process's active guardians, per thread that runs a flow (a notebook may run two
submits at once in two threads: each flow tells its own guardian), newest last."""


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Watch this process's flow run while the block runs; without a Prefect server, see that the embedded one Prefect
    starts goes when this process does."""
    from prefect.settings import PREFECT_API_URL

    if os.environ.get("PREFECT__FLOW_RUN_ID"):  # a worker's flow process: the worker watches it
        yield
        return
    if not (api := PREFECT_API_URL.value()):  # the embedded API: its server must not outlive this process either
        embedded_server_outlives_ctrl_c()  # (a notebook's kernel SIGKILLed: red team 41k A5)
        yield
        return
    r, w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flows.guardian", str(os.getpid())], stdin=r,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PREFECT_API_URL": api})
    except OSError:  # no process to spare: the run is as it was before the guardian (a lapse, not an error)
        os.close(w)
        yield
        return
    finally:
        os.close(r)
    mine = _guards.setdefault(threading.get_ident(), [])
    mine.append(w)
    try:
        yield
    finally:
        mine.remove(w)
        with contextlib.suppress(OSError):
            os.write(w, b"done\n")
        os.close(w)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _tell(line: str) -> None:
    mine = _guards.get(threading.get_ident())
    if mine:
        with contextlib.suppress(OSError):
            os.write(mine[-1], f"{line}\n".encode())


def tell(flow_run_id: object) -> None:
    """Give the guardian of this thread's flow call the id of the flow run it watches (from inside the flow, which a
    sync flow runs in the caller's thread)."""
    if flow_run_id:
        _tell(f"id {flow_run_id}")


def tell_phase(phase: str) -> None:
    """Tell the guardian of this thread's flow call where the run is now (planning, queued, training, evaluating)."""
    _tell(f"phase {phase}")


_HELD = {
    "planning": "It had not asked for GPUs yet: nothing was queued, placed or trained. Run the same command again to "
                "start it",
    "queued": "It was waiting in the ledger's queue for GPUs: no trainer had started and it held no GPUs; its place in "
              "the queue lapses with its lease (`--lease`). Run the same command again to queue it again",
    "evaluating": "Its training had finished and its GPUs were released; only the wait for the evaluations and the "
                  "report was cut. Run the same command again to wait for the scores and write the report",
}
"""What the killed process held, by its phase; training (or a phase never told) is the default below."""


def crashed_message(pid: int, phase: str = "") -> str:
    """What the flow run's Crashed state says, for a run killed in `phase`."""
    held = _HELD.get(phase, "The trainer it started commits its step and stops; its GPUs come back when the "
                     "allocation's lease runs out (`--lease`). Run the same command again to resume from the newest "
                     "committed checkpoint")
    return (f"the process that ran this flow (pid {pid} on {socket.gethostname()}) ended without ending its run: it was "
            f"killed (SIGKILL, most often the kernel's out-of-memory killer or `kill -9`) or its interpreter crashed. "
            f"{held}")


@dataclass(frozen=True)
class Told:
    """What the guardian's stdin said before it ended: the flow run id, the run's last phase, whether `done` came."""

    run_id: str | None = None
    done: bool = False
    phase: str = ""


def read_until_end(stream: object) -> Told:
    """What the submitter told the guardian on its stdin, read until its end."""
    run_id, done, phase = None, False, ""
    for raw in stream:  # type: ignore[attr-defined]
        line = raw.decode(errors="replace").strip()
        if line.startswith("id "):
            run_id = line[3:].strip()
        elif line.startswith("phase "):
            phase = line[6:].strip()
        elif line == "done":
            done = True
    return Told(run_id, done, phase)


PATIENCE_S = 600.0
"""How long the guardian keeps trying a Prefect API that does not answer (a server restarted, a network cut) before it
gives up; FRENZY_GUARDIAN_PATIENCE_S sets another. Tries back off from 0.5 s to 10 s apart."""


def log_path() -> Path:
    """Where the guardian says what it could not do: `guardian.log` in PREFECT_HOME (default ~/.prefect)."""
    from prefect.settings import PREFECT_HOME

    return Path(PREFECT_HOME.value()) / "guardian.log"


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        path = log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {line}\n")


def _unreachable(exc: BaseException) -> bool:
    """The API did not answer (refused, reset, timed out, a 5xx while it starts), as opposed to answering no."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code in (408, 429)
    return isinstance(exc, (httpx.TransportError, OSError))


def _crash(run_id: str, pid: int, phase: str = "") -> str:
    """Set the run Crashed unless it has already ended; what was done."""
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)  # type: ignore[arg-type]
        if run.state is not None and run.state.is_final():
            return f"found {run.state.name}"
        client.set_flow_run_state(run_id, Crashed(message=crashed_message(pid, phase)), force=True)  # type: ignore[arg-type]
    return "marked Crashed"


def crash_until_answered(run_id: str, pid: int, patience_s: float, phase: str = "") -> bool:
    """Set the run Crashed, trying again while the API does not answer, for `patience_s` at most; False: gave up (and
    said so in the guardian's log). Red team 41q Z2: one try, and a submit killed with its server stayed Running."""
    start, pause, api = time.monotonic(), 0.5, os.environ.get("PREFECT_API_URL", "")
    while True:
        try:
            did = _crash(run_id, pid, phase)
        except Exception as exc:
            if not _unreachable(exc):
                raise
            waited = time.monotonic() - start
            if waited >= patience_s:
                _say(f"gave up after {waited:.0f} s: the Prefect API at {api} did not answer ({exc!r}); flow run "
                     f"{run_id} of the killed process {pid} stays Running on the server. Mark it Crashed in the UI, or "
                     f"run `prefect flow-run cancel {run_id}`")
                return False
            if pause == 0.5:
                _say(f"the Prefect API at {api} does not answer ({exc!r}): trying again for up to {patience_s:.0f} s "
                     f"to mark flow run {run_id} Crashed (process {pid} was killed)")
            time.sleep(min(pause, max(patience_s - waited, 0.0)))  # a backoff between tries, not a synchronisation
            pause = min(pause * 2, 10.0)
            continue
        if pause > 0.5:
            _say(f"flow run {run_id} {did} after {time.monotonic() - start:.0f} s: the API answers again")
        return True


def main(argv: list[str]) -> int:
    pid = int(argv[1])
    told = read_until_end(sys.stdin.buffer)
    if told.done or told.run_id is None:
        return 0
    os.environ["PREFECT_CLIENT_MAX_RETRIES"] = "0"  # the tries and their backoff are this loop's, bounded by patience
    patience = float(os.environ.get("FRENZY_GUARDIAN_PATIENCE_S") or PATIENCE_S)
    return 0 if crash_until_answered(told.run_id, pid, patience, told.phase) else 1


def embedded_server_outlives_ctrl_c() -> None:
    """Prefect starts its embedded API server as a child in the terminal's process group, so Ctrl-C killed it with
    the flow: the flow's last calls (the trainer's commit, the release, the run's final state) then failed on a dead
    server and retried for minutes, with connection tracebacks. Here the server starts in a session of its own: Ctrl-C
    reaches `frenzy` alone, which stops cleanly, and Prefect stops the server when `frenzy` exits. A `frenzy` killed
    outright (SIGKILL) stops nothing: the server, started from the main thread, gets SIGTERM when it dies (Linux's
    parent-death signal) instead of running on as an orphan (red team 41j S07: 13 minutes and counting)."""
    import types

    from prefect.server.api import server

    from tasks.training.launch import _libc

    if getattr(server.subprocess, "frenzy_own_session", False):
        return
    libc = _libc()

    def die_with_frenzy() -> None:  # in the child, before exec
        if libc is not None:
            with contextlib.suppress(Exception):
                libc.prctl(1, 15)  # type: ignore[attr-defined]  # PR_SET_PDEATHSIG, SIGTERM

    class Popen(subprocess.Popen):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("start_new_session", True)
            # the signal comes when the starting *thread* ends: only the main thread lives as long as `frenzy`
            if threading.current_thread() is threading.main_thread() and kwargs.get("preexec_fn") is None:
                kwargs["preexec_fn"] = die_with_frenzy
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    names = {k: getattr(subprocess, k) for k in dir(subprocess) if not k.startswith("__") and k != "Popen"}
    server.subprocess = types.SimpleNamespace(**names, Popen=Popen, frenzy_own_session=True)  # type: ignore[assignment]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
