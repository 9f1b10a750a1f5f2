"""A throwaway PostgreSQL server on loopback for the ledger tests (the real protocol, no mock).

Uses `$FRENZY_TEST_POSTGRES_URL` when set (an existing server; each test gets its own database). Otherwise it
runs `initdb` + `pg_ctl` from PATH or /usr/lib/postgresql/*/bin on a free 127.0.0.1 port in a temporary
directory. PostgreSQL refuses to run as root, so as root the server runs as the `postgres` (or `nobody`) user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True):
        return Path(cand).parent
    raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql; "
                              "install the postgresql package or set FRENZY_TEST_POSTGRES_URL")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and there is no 'postgres' or 'nobody' user to run PostgreSQL as")


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yield an admin URL `postgresql+psycopg://frenzy@127.0.0.1:PORT/postgres`; the server stops on exit."""
    ext = os.environ.get("FRENZY_TEST_POSTGRES_URL")
    if ext:
        yield ext
        return
    bindir, user = _bindir(), _run_as()
    root = Path(tempfile.mkdtemp(prefix="frenzy-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if user:
        pw = pwd.getpwnam(user)
        root.chmod(0o755)
        for p in (root, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    kw = {"user": user} if user else {}
    port = _free_port()
    try:
        subprocess.run([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "frenzy", "-E", "UTF8",
                        "--no-sync"], check=True, capture_output=True, cwd=root, **kw)
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c max_connections=200"
        subprocess.run([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w",
                        "-t", "60", "start"], check=True, capture_output=True, cwd=root, **kw)
    except subprocess.CalledProcessError as err:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailable(f"could not start PostgreSQL: {err.stderr.decode()[-500:]} {log[-500:]}") from None
    try:
        yield f"postgresql+psycopg://frenzy@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, cwd=root, **kw)
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(admin_url: str) -> str:
    """Create an empty database on the server and return its URL."""
    from sqlalchemy import create_engine, text

    name = f"t_{uuid.uuid4().hex[:12]}"
    eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    deadline = time.time() + 30
    while True:
        try:
            with eng.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    eng.dispose()
    return admin_url.rsplit("/", 1)[0] + "/" + name
