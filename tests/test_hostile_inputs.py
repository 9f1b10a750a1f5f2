"""Issue 32's hostile and broken inputs, each case as a user or an attacker meets it (tests/hostile_*.py): every one
must end clear, that is refused with exit 2 and a message naming the file, key or line and the fix, or give the
correct result; never a traceback, a hang, a silent wrong result or a lost file. `benchmarks/hostile.py` counts
them for the README's Guarantees."""

from __future__ import annotations

import pytest

from tests.hostile_kit import all_cases, run_case

pytest.importorskip("transformers")  # the model directories are made by save_pretrained

CASES = all_cases()
PRIVATE_MOUNTS = {"environment:data prepare onto a full disk", "environment:stragglers generate into a read-only directory",
                  "environment:submit with its --run-dir on a read-only mount",
                  "environment:evaluate with its --history-dir on a full disk"}


@pytest.fixture(scope="module")
def sandbox_isolated() -> bool:
    from tasks.evaluation.sandbox import run_python

    layers = set(run_python("print('ok')").isolation)
    return {"netns", "pidns"} <= layers and any(x.startswith("landlock") for x in layers)


@pytest.fixture(scope="module")
def private_mounts() -> bool:
    """Whether this machine lets a process mount a tmpfs or a read-only bind in a mount namespace of its own."""
    import os
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    cmd = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    return subprocess.run([*cmd, "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c.slow else c for c in CASES],
                         ids=[c.id for c in CASES])
def test_hostile_input(case, request):
    if case.surface == "sandbox" and not request.getfixturevalue("sandbox_isolated"):
        pytest.skip("this kernel offers no user namespaces or Landlock; the full sandbox needs them")
    if case.id in PRIVATE_MOUNTS and not request.getfixturevalue("private_mounts"):
        pytest.skip("this machine allows no private mount namespace (a full tmpfs, a read-only bind)")
    outcome, detail = run_case(case)
    assert outcome == "clear", f"{case.id}: {outcome}: {detail}"


def test_the_sweep_covers_every_surface_of_the_issue():
    surfaces = {c.surface for c in CASES}
    assert {"hf", "tokenizers", "data", "export", "lease", "oom", "sandbox", "diagnose", "readers", "results", "flags",
            "nonsense", "environment"} <= surfaces
    assert len(CASES) >= 250 and len({c.id for c in CASES}) == len(CASES)
    assert PRIVATE_MOUNTS <= {c.id for c in CASES}
