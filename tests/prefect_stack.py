"""A real Prefect stack on loopback for the integration tests: `prefect server start` (all its services: scheduler,
triggers) with its own PREFECT_HOME, a checkout-shaped directory deployed with `deployments/deploy.sh`, and a
process worker, exactly as the README tells a user to run them."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class PrefectStack:
    api_url: str
    ui_url: str
    workdir: Path
    """The deployed checkout: the working directory of every flow run (nothing may be written there)."""
    data: Path
    """The workers' data root ($FRENZY_DATA): where a run submitted from a form keeps its files."""
    env: dict[str, str]
    logs: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"prefect server did not come up at {url}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


@contextlib.contextmanager
def prefect_stack(tmp: Path, workers: int = 1, extra_env: dict[str, str] | None = None) -> Iterator[PrefectStack]:
    """Server + deployed checkout + `workers` process workers, each started in a directory of its own
    (`tmp/worker-N`, where no run may write); everything stopped and removed on exit. `extra_env` is the
    environment of the server, the deployment and the workers (a shared ledger, storage credentials)."""
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    workdir = tmp / "checkout"
    workdir.mkdir()
    for name in ("flows", "tasks", "cluster", "deployments"):  # the code as a checkout holds it
        (workdir / name).symlink_to(REPO / name)
    logs = tmp / "logs"
    logs.mkdir()
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_UI_API_URL": api,
           # services at test speed: the scheduler looks every 5 s, the worker polls every 2 s
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5", "PREFECT_WORKER_QUERY_SECONDS": "2",
           "PREFECT_WORKER_PREFETCH_SECONDS": "5", "FRENZY_LEDGER": str(tmp / "ledger.db"),
           "FRENZY_DATA": str(tmp / "data"),
           "FRENZY_CACHE": os.environ.get("FRENZY_CACHE", str(Path.home() / ".cache" / "frenzy")),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", **(extra_env or {})}
    procs: list[subprocess.Popen] = []
    try:
        server_log = logs / "server.log"
        server = subprocess.Popen(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  env=env, stdout=open(server_log, "wb"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        procs.append(server)
        _wait_http(f"{api}/health", server, server_log)
        dep = subprocess.run(["bash", str(workdir / "deployments" / "deploy.sh")], env=env, cwd=tmp,
                             capture_output=True, text=True, timeout=300)
        (logs / "deploy.log").write_text(dep.stdout + dep.stderr)
        if dep.returncode != 0:
            raise RuntimeError(f"deploy.sh failed:\n{dep.stdout[-2000:]}\n{dep.stderr[-2000:]}")
        for i in range(workers):
            where = tmp / f"worker-{i}"
            where.mkdir(exist_ok=True)
            log = logs / ("worker.log" if i == 0 else f"worker-{i}.log")
            procs.append(subprocess.Popen(["prefect", "worker", "start", "--pool", "frenzy", "--name", f"w{i}"], env=env,
                                          cwd=where, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                          start_new_session=True))
        yield PrefectStack(api_url=api, ui_url=f"http://127.0.0.1:{port}", workdir=workdir, data=tmp / "data", env=env,
                           logs=logs)
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, 9)
