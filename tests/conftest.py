"""Shared fixtures: one isolated Prefect test server per session (started only by tests that need it)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

# Each pytest process keeps its own Prefect home, Frenzy home (crash reports, taught rules) and default ledger, so a
# test never writes the user's ~/.frenzy and the two workers of `-n 2` (pytest-xdist, in addopts) never share a
# ledger or a Prefect database. A value the user gave is kept; a value the controller made here is made again, per
# worker, in each worker (they inherit the controller's environment).
_MADE = set(os.environ.get("FRENZY_TESTS_MADE", "").split())


def _own(var: str, make: Callable[[], str]) -> None:
    if var not in os.environ or (os.environ.get("PYTEST_XDIST_WORKER") and var in _MADE):
        os.environ[var] = make()
        _MADE.add(var)


_own("PREFECT_HOME", lambda: tempfile.mkdtemp(prefix="frenzy-prefect-"))
_own("FRENZY_HOME", lambda: tempfile.mkdtemp(prefix="frenzy-home-"))
_own("FRENZY_LEDGER", lambda: os.path.join(tempfile.mkdtemp(prefix="frenzy-ledger-"), "ledger.db"))
os.environ["FRENZY_TESTS_MADE"] = " ".join(sorted(_MADE))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
# One torch intra-op thread here and in every process a test starts (trainers, `frenzy` commands, evaluation trials):
# the tests run tiny models, which a second thread does not speed up, while on a loaded 2-core machine every parallel
# matmul or attention waits for that thread to be scheduled (test_decode's cached-vs-recompute test: 175 s with 2
# threads, 8.9 s with 1, same load; docs/development.md). Set before torch is imported; a value given is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(trylast=True)  # after pytest-xdist's, which registers `dsession` in the controller
def pytest_configure(config: pytest.Config) -> None:
    """Prefect binds its console log handler to the sys.stderr of the moment it sets up logging (on import of
    prefect.main). A test that first imports it under pytest's capture (an in-process `frenzy submit`) leaves the
    handler on a stream pytest closes after that test, and every later flow's log line fails ("I/O operation on closed
    file", then a RecursionError in the flow engine). Set it up here, on the session's stderr, once per process that
    runs tests: not in the `-n 2` controller, which runs none (1.2 CPU s at the start, beside the workers' own)."""
    if not config.pluginmanager.has_plugin("dsession"):
        import prefect.main  # noqa: F401


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Close this process's Prefect event client before a hypothesis test. Once a test here has run a flow, Prefect
    keeps a websocket to the test server open from its event loop thread, and the websocket library's keepalive ping
    (every 20 s) takes its payload from the global `random` module. A ping that lands during a hypothesis draw changes
    the global random state under the draw, and hypothesis reports it as a strategy that uses `random`
    (HypothesisDeprecationWarning; an error under pyproject's filter). The next event opens a new client."""
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False) and "prefect.events.worker" in sys.modules:
        from prefect.events.worker import EventsWorker

        EventsWorker.drain_all(timeout=10, at_exit=False)


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny_trained(tmp_path_factory) -> Path:
    """gpt-tiny trained once for the session by the real trainer (`tiny_job(uri, steps=20, every=10)`: checkpoints
    10 and 20 under `ckpt/`, the run directory `run/`). Read-only: a test that changes it, or whose records must name
    its own paths, works on `trainer_util.copy_trained(...)`. Each trainer start costs its torch import; five test
    files trained this same job."""
    from tests.trainer_util import train_shared

    d = tmp_path_factory.mktemp("tiny-trained")
    train_shared(d)
    return d


@pytest.fixture(scope="session")
def postgres_admin():
    """A PostgreSQL server on loopback for the whole session (see tests/pg_server.py); skipped, with the reason,
    where no server binaries are installed."""
    from tests.pg_server import PostgresUnavailable, postgres_server

    try:
        cm = postgres_server()
        url = cm.__enter__()
    except PostgresUnavailable as err:
        pytest.skip(str(err))
    try:
        yield url
    finally:
        cm.__exit__(None, None, None)
