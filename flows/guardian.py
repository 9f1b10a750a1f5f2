"""A watcher for a `submit` flow run that a user's own process (the CLI, a notebook) runs against a Prefect server.

A flow run that a worker started is marked Crashed by the worker when its process dies. One that a user's process
runs has no such watcher: killed by SIGKILL or the kernel's out-of-memory killer, it stayed Running on the server for
good, in the UI and to every automation (red team 41i). `guarded()` starts a small process, in a session of its own
(a Ctrl-C or a `kill` of the submitter's process group does not reach it), that holds the read end of a pipe. The flow
tells it the flow run's id; the submitter writes `done` once the flow call has ended by any path Python sees (success,
failure, Ctrl-C, SIGTERM: Prefect sets those states itself). End of file without `done` means the process died
without ending its run: the guardian sets the flow run Crashed, saying so, unless it had already reached a final state.

    python -m flows.guardian PID    (stdin: `id <flow run id>` and `done` lines)
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

_guards: list[int] = []
"""Write ends of the pipes of this process's active guardians, newest last (`tell` writes to the newest)."""


def _server_url() -> str:
    """The Prefect server's API URL this process talks to; empty for the embedded API (it dies with the process,
    and its run with it) and inside a worker's flow process (the worker watches that one)."""
    if os.environ.get("PREFECT__FLOW_RUN_ID"):
        return ""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or ""


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Watch this process's flow run while the block runs (a no-op without a Prefect server)."""
    api = _server_url()
    if not api:
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
    _guards.append(w)
    try:
        yield
    finally:
        _guards.remove(w)
        with contextlib.suppress(OSError):
            os.write(w, b"done\n")
        os.close(w)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def tell(flow_run_id: object) -> None:
    """Give the newest guardian of this process the id of the flow run it watches (from inside the flow)."""
    if _guards and flow_run_id:
        with contextlib.suppress(OSError):
            os.write(_guards[-1], f"id {flow_run_id}\n".encode())


def crashed_message(pid: int) -> str:
    """What the flow run's Crashed state says."""
    return (f"the process that ran this flow (pid {pid} on {socket.gethostname()}) ended without ending its run: it was "
            "killed (SIGKILL, most often the kernel's out-of-memory killer or `kill -9`) or its interpreter crashed. "
            "The trainer it started commits its step and stops; its GPUs come back when the allocation's lease runs "
            "out (`--lease`). Run the same command again to resume from the newest committed checkpoint")


def read_until_end(stream: object) -> tuple[str | None, bool]:
    """The flow run id told, and whether `done` came, from the guardian's stdin, read until its end."""
    run_id, done = None, False
    for raw in stream:  # type: ignore[attr-defined]
        line = raw.decode(errors="replace").strip()
        if line.startswith("id "):
            run_id = line[3:].strip()
        elif line == "done":
            done = True
    return run_id, done


def main(argv: list[str]) -> int:
    pid = int(argv[1])
    run_id, done = read_until_end(sys.stdin.buffer)
    if done or run_id is None:
        return 0
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)  # type: ignore[arg-type]
        if run.state is not None and run.state.is_final():
            return 0
        client.set_flow_run_state(run_id, Crashed(message=crashed_message(pid)), force=True)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
