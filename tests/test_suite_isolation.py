"""The suite's own isolation (tests/conftest.py): tests never use the user's ~/.frenzy, and the two pytest-xdist
workers of the default `-n 2` each get their own Prefect home, Frenzy home and ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_this_session_writes_no_file_under_the_users_frenzy_home():
    from cluster.ledger import ledger_url

    home = Path.home() / ".frenzy"
    for var in ("FRENZY_HOME", "PREFECT_HOME", "FRENZY_LEDGER"):
        assert not Path(os.environ[var]).resolve().is_relative_to(home.resolve()), var
    assert ledger_url(None).endswith(os.environ["FRENZY_LEDGER"])


def test_two_xdist_workers_get_their_own_prefect_home_frenzy_home_and_ledger(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    probe = (
        "import json, os\n"
        "def _dump(n):\n"
        "    name = os.environ.get('PYTEST_XDIST_WORKER', 'none')\n"
        "    keys = ('PREFECT_HOME', 'FRENZY_HOME', 'FRENZY_LEDGER')\n"
        "    with open(os.path.join(os.environ['PROBE_OUT'], f'{name}-{n}.json'), 'w') as f:\n"
        "        json.dump({k: os.environ[k] for k in keys}, f)\n")
    probe += "".join(f"def test_{i}():\n    _dump({i})\n" for i in range(8))
    (tmp_path / "test_probe.py").write_text(probe)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "FRENZY_HOME", "FRENZY_LEDGER",
                                                           "FRENZY_TESTS_MADE", "PYTEST_XDIST_WORKER")}
    env |= {"PYTHONPATH": str(REPO), "PROBE_OUT": str(out)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    seen: dict[str, dict] = {}
    for f in out.iterdir():
        seen.setdefault(f.name.split("-")[0], json.loads(f.read_text()))
    assert set(seen) == {"gw0", "gw1"}, sorted(seen)
    for key in ("PREFECT_HOME", "FRENZY_HOME", "FRENZY_LEDGER"):
        assert seen["gw0"][key] != seen["gw1"][key], key
