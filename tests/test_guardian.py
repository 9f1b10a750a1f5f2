"""The guardian of a flow run that a user's process runs against a Prefect server (flows/guardian.py): that process
killed outright (SIGKILL) leaves its run Crashed with the cause, not Running for good; a process that ends its run
normally leaves the state to Prefect. Real processes, a real server on loopback (the session's test server)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.guardian import Told, read_until_end

ROOT = Path(__file__).resolve().parents[1]

_TWO_THREADS = """
import os, signal, sys, threading
from flows import guardian
entered, told = threading.Barrier(2), threading.Barrier(3)
def one(run_id):
    with guardian.guarded():
        entered.wait()  # both guardians started before either flow tells its id (as two cells started at once)
        guardian.tell(run_id)
        told.wait()
        threading.Event().wait()  # runs until the process is killed
for run_id in sys.argv[1:3]:
    threading.Thread(target=one, args=(run_id,), daemon=True).start()
told.wait()
os.kill(os.getpid(), signal.SIGKILL)
"""

_USER = """
import os, signal, sys
from flows import guardian
with guardian.guarded():
    guardian.tell(sys.argv[1])
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or `kill -9` does: no finally runs
print("ended", flush=True)
"""


def _running_run(client) -> object:
    from prefect import flow
    from prefect.states import Running

    @flow(name="guarded")
    def guarded_flow() -> None:
        return None

    run = client.create_flow_run(guarded_flow)
    client.set_flow_run_state(run.id, Running(), force=True)
    return run


def _user_process(*args: object, script: str = _USER) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value()}
    env.pop("PREFECT__FLOW_RUN_ID", None)
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=120)


def _wait_crashed(client, run_id: object) -> object:
    deadline = time.monotonic() + 60
    while (state := client.read_flow_run(run_id).state).type.value != "CRASHED":  # the guardian's own time
        assert time.monotonic() < deadline, f"still {state.type.value}: {state.message}"
        time.sleep(0.2)
    return state


def test_a_killed_process_leaves_its_run_crashed_with_the_cause(prefect_server):
    from prefect import get_client

    with get_client(sync_client=True) as client:
        killed, ended = _running_run(client), _running_run(client)
        r = _user_process(killed.id, "kill")
        assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
        # the negative control: ended normally (its guardian has exited when it returns), the state is Prefect's
        ok = _user_process(ended.id, "end")
        assert ok.returncode == 0 and "ended" in ok.stdout, ok.stderr[-2000:]
        state = _wait_crashed(client, killed.id)
        assert "killed (SIGKILL" in state.message and "Run the same command again" in state.message, state.message
        assert client.read_flow_run(ended.id).state.type.value == "RUNNING"


def test_the_guardian_reads_the_id_and_done_until_its_pipe_ends():
    import io

    assert read_until_end(io.BytesIO(b"id 1234\n")) == Told("1234", False)
    assert read_until_end(io.BytesIO(b"id 1234\ndone\n")) == Told("1234", True)
    assert read_until_end(io.BytesIO(b"")) == Told(None, False)
    assert read_until_end(io.BytesIO(b"id 1234\nphase planning\nphase queued\n")) == Told("1234", False, "queued")


def test_two_submits_in_two_threads_of_one_killed_process_both_end_crashed(prefect_server):
    """Red team 41k A7: two `submit(...)` calls at once in threads of one notebook kernel, the kernel SIGKILLed: one
    run ended Crashed, the other stayed Running (each flow told its id to the newest guardian). Each thread's flow now
    tells its own."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        a, b = _running_run(client), _running_run(client)
        r = _user_process(a.id, b.id, script=_TWO_THREADS)
        assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
        for run in (a, b):
            assert "killed (SIGKILL" in _wait_crashed(client, run.id).message


def _forward(conn, upstream: tuple[str, int]) -> None:
    import socket
    import threading

    up = socket.create_connection(upstream)

    def pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    threading.Thread(target=pump, args=(up, conn), daemon=True).start()
    pump(conn, up)


def _guardian(api_url: str, home: Path, run_id: object, patience_s: float, phase: str = "") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home),
           "FRENZY_GUARDIAN_PATIENCE_S": str(patience_s)}
    proc = subprocess.Popen([sys.executable, "-m", "flows.guardian", "4242"], stdin=subprocess.PIPE, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.stdin.write(f"id {run_id}\n".encode())  # then the pipe ends without `done`: the submitter died
    if phase:  # what the submit flow tells as it goes (flows/stages.py, FlowStages.reach)
        proc.stdin.write(f"phase planning\nphase {phase}\n".encode())
    proc.stdin.close()
    return proc


def _wait_for_line(path: Path, text: str, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while text not in (log := path.read_text() if path.exists() else ""):
        assert proc.poll() is None, f"the guardian ended ({proc.returncode}) before saying {text!r}: {log}"
        assert time.monotonic() < deadline, log
        time.sleep(0.05)
    return log


HELD = {
    "training": "The trainer it started commits its step and stops; its GPUs come back when the allocation's lease",
    "queued": "It was waiting in the ledger's queue for GPUs: no trainer had started and it held no GPUs",
    "planning": "It had not asked for GPUs yet: nothing was queued, placed or trained",
}


@pytest.mark.parametrize("phase", ["training", "queued", "planning"])
def test_a_run_killed_with_its_server_is_crashed_once_the_server_answers_again(prefect_server, tmp_path, phase):
    """Red team 41q Z2: a submit SIGKILLed while its server was down stayed Running for good (the guardian tried the
    API once). Here the API's port refuses (bound, not listening) until the guardian has said it will try again; then
    the port answers, forwarding to the real server, and the run ends Crashed. Red team 41r: one killed while it
    waited in the queue was said to hold a trainer and GPUs; the message says what the run held in its phase."""
    import socket
    import threading
    from urllib.parse import urlsplit

    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    real = urlsplit(PREFECT_API_URL.value())
    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # not listening: a connection is refused, as by a stopped server
    api = f"http://127.0.0.1:{port.getsockname()[1]}{real.path}"
    with get_client(sync_client=True) as client:
        run = _running_run(client)
        proc = _guardian(api, tmp_path, run.id, patience_s=120, phase=phase)
        log = _wait_for_line(tmp_path / "guardian.log", "does not answer", proc)
        assert "ConnectError" in log and "up to 120 s" in log, log
        assert client.read_flow_run(run.id).state.type.value == "RUNNING"
        port.listen()

        def serve() -> None:
            while True:
                try:
                    conn, _ = port.accept()
                except OSError:
                    return
                threading.Thread(target=_forward, args=(conn, (real.hostname, real.port)), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        try:
            assert proc.wait(timeout=90) == 0, proc.stderr.read().decode()[-2000:]
        finally:
            port.close()
        said = client.read_flow_run(run.id).state.message
        assert "killed (SIGKILL" in said and HELD[phase] in said, said
        assert [p for p, text in HELD.items() if text in said] == [phase], said  # nothing another phase held
        assert "marked Crashed after" in (tmp_path / "guardian.log").read_text()


def test_a_guardian_that_gives_up_says_so_in_its_log(prefect_server, tmp_path):
    import socket

    from prefect import get_client

    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    with get_client(sync_client=True) as client:
        run = _running_run(client)
        proc = _guardian(f"http://127.0.0.1:{port.getsockname()[1]}/api", tmp_path, run.id, patience_s=1)
        assert proc.wait(timeout=60) == 1, proc.stderr.read().decode()[-2000:]
    port.close()
    log = (tmp_path / "guardian.log").read_text()
    assert "gave up after" in log and f"{run.id} of the killed process 4242 stays Running" in log, log
    assert f"prefect flow-run cancel {run.id}" in log
