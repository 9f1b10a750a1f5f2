"""`training.compile: true`: the blocks are compiled in place; training matches eager and its checkpoints are the
eager model's (a compiled run resumes eagerly and the other way round)."""

from __future__ import annotations

import math

import pytest

from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tests.trainer_util import run, tiny_job


@pytest.mark.slow  # inductor compiles every block: about half a minute on 2 cores
def test_a_compiled_run_matches_eager_and_resumes_eagerly(tmp_path):
    eager = run(tiny_job(f"file://{tmp_path}/e", 8, every=4), tmp_path / "e")
    uri = f"file://{tmp_path}/c"
    part = run(tiny_job(uri, 4, every=4, compile=True), tmp_path / "c", timeout=900)
    assert part["final_step"] == 4
    names = {e.name for s in ck.read_manifest(Storage(uri), 4).shards for e in s.tensors}
    assert not any("_orig_mod" in n for n in names)  # the eager model's parameter names
    done = run(tiny_job(uri, 8, every=4), tmp_path / "c", resume=True)  # eager, from the compiled run's commit
    assert done["resumed_from_step"] == 4
    assert math.isclose(done["last_loss"], eager["last_loss"], rel_tol=1e-3)
