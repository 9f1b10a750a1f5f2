"""The shared service's scenario, timed: three users at once on one Prefect server, a Postgres ledger and S3 on
loopback, with two workers in directories of their own (tests/test_shared_service.py, which asserts what must hold).
This runs that test and records its wall time.

    python benchmarks/shared_service.py        # writes benchmarks/results/shared_service.{json,md}
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="frenzy-team-") as d:
        env = {**os.environ, "FRENZY_TEST_ARTIFACTS": d, "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow",
                            "tests/test_shared_service.py"], cwd=REPO, env=env)
        if r.returncode != 0:
            raise SystemExit(f"the scenario failed (exit {r.returncode}): nothing recorded")
        doc = json.loads((Path(d) / "shared-service.json").read_text())
    doc.update(machine=f"{platform.machine()}, {os.cpu_count()} cores, no GPU", date=f"{datetime.now(UTC):%Y-%m-%d}",
               command="python benchmarks/shared_service.py")
    out = REPO / "benchmarks" / "results" / "shared_service"
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(
        f"# Three users on one shared service ({doc['date']}, {doc['machine']}, shared with other work)\n\n"
        f"`{doc['command']}` (tests/test_shared_service.py): a real `prefect server`, a Postgres ledger, S3 on "
        "loopback, two process workers in directories of their own; Alice (`frenzy submit`, checkpoints on S3), Bob "
        "(a notebook through the `submit` deployment) and Carol (`frenzy submit`, a suite whose dataset plugin the "
        "workers lack) at once, each with relative paths in a job file in their own directory.\n\n"
        f"| | seconds |\n|---|---|\n| all three done | {doc['wall_s']} |\n| Alice's `frenzy submit` exits (0) | "
        f"{doc['alice_s']} |\n| Carol's `frenzy submit` exits (2, her evaluations' cause named) | {doc['carol_s']} |\n\n"
        "The three jobs share this machine's one device through the ledger's queue, so they train one after the "
        "other; their evaluations run on the workers.\n")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
