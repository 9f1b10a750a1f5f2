"""Round 21 of issue 45: what carries to projects never seen. The learned fallback votes among its nearest labelled
logs (one odd neighbour no longer decides) and is trained on the red-team sets too; generic families state a
mechanism in any framework's or vendor's words (benchmarks/results/diagnosis_round21.md)."""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import diagnose
from tasks.diagnosis.fallback import Example, Fallback, K, fit
from tests.diagnosis_kit import assert_diagnosed


def _examples() -> tuple[list[Example], list[str]]:
    rows = [("CUDA out of memory. Tried to allocate 2 GiB", "framework", "CUDAOOM", "a"),
            ("CUDA out of memory. Tried to allocate 4 GiB; reserved by PyTorch", "framework", "CUDAOOM", "b"),
            ("CUDA out of memory. Tried to allocate 8 GiB; total capacity", "framework", "CUDAOOM", "c"),
            ("CUDA out of memory. Tried to allocate exactly what the user asked for", "script", "BatchTooLarge", "d"),
            ("connection refused by the store at port 29500", "infrastructure", "StoreRefused", "e")]
    return ([Example(t, c, ty, False, g) for t, c, ty, g in rows], [f"x/{g}" for *_, g in rows])


def test_the_vote_of_the_nearest_outweighs_one_odd_neighbour():
    ex, ids = _examples()
    query = "CUDA out of memory. Tried to allocate exactly what the user asked for"
    assert fit(ex, ids, k=1).vote(query)[1].category == "script"  # the single nearest: the odd one
    score, doc = fit(ex, ids, k=4).vote(query)
    assert doc is not None and doc.category == "framework" and doc.id in {"x/a", "x/b", "x/c"}
    assert 0 < score < 1  # neighbours that disagree say less than one that matches exactly


def test_a_vote_that_is_split_says_less_than_one_that_agrees():
    ex, ids = _examples()
    model = fit(ex, ids, k=4)
    agreed, _ = model.vote("CUDA out of memory. Tried to allocate 2 GiB")
    split, _ = model.vote("CUDA out of memory. Tried to allocate exactly what the user asked for")
    assert agreed > split


def test_the_shipped_fallback_votes_and_was_trained_beyond_the_tune_half():
    model = Fallback.load()
    assert model is not None and model.k == K > 1
    sets = {d.id.split("/")[0] for d in model.docs if d.id.startswith("redteam")}
    assert sets == {f"redteam{k}" for k in range(4, 18)}


# -- generic families: a mechanism in any framework's, allocator's or vendor's words --------------------------------

@pytest.mark.parametrize(("line", "type_", "category"), [
    # memory exhausted, a device's or the host's
    ("RuntimeError: cudaErrorMemoryAllocation: out of memory", "OutOfMemoryError", "framework"),
    ("E1127 10:01:02.000 77 bfc_allocator.cc:12] XPU device ran out of memory allocating 2 GiB", "OutOfMemoryError",
     "framework"),
    ("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "OutOfMemoryError", "framework"),
    ("RuntimeError: out of memory while allocating 512 MB on device 3", "OutOfMemoryError", "framework"),
    ("src/alloc.cc:88: hipMallocManaged returned: out of memory", "OutOfMemoryError", "framework"),
    ("E1127 10:01:02.000 77 alloc.cc:12] Out of memory: failed to allocate 1073741824 bytes", "HostOOM", "framework"),
    ("The instance ran out of memory and was terminated.", "HostOOM", "framework"),
    ("ERROR: worker 3 OOM while building the index", "HostOOM", "framework"),
    # a GPU lost or faulted
    ("RuntimeError: level_zero backend failed with error: 20 (ZE_RESULT_ERROR_DEVICE_LOST)", "NodeFailure",
     "infrastructure"),
    ("RuntimeError: XPU error: device lost", "NodeFailure", "infrastructure"),
    ("kernel: amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!", "NodeFailure", "infrastructure"),
    ("kernel: [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx timeout, signaled seq=1, emitted seq=3", "NodeFailure",
     "infrastructure"),
    ("kernel: amdgpu: [gfxhub] GPU page fault (src_id:0 ring:24 vmid:3 pasid:32770)", "NodeFailure", "infrastructure"),
    ("CUDA call failed: cudaErrorECCUncorrectable", "ECCError", "infrastructure"),
    ("XPU runtime: page fault on the device at address 0x7f00 (queue 2)", "NodeFailure", "infrastructure"),
])
def test_a_mechanism_in_any_runtimes_or_vendors_words(line, type_, category):
    assert assert_diagnosed(f"step 10 loss 2.0\n{line}\n", type_, category, root=line).line_no == 2


@pytest.mark.parametrize("line", [
    "WARNING: GPU memory almost full, this step may OOM",
    "Worker exit detail: potential root causes: (1) the process is killed by SIGKILL by OOM killer, (2) an error",
])
def test_a_line_that_guesses_or_warns_about_memory_is_not_an_oom(line):
    assert diagnose(f"step 10 loss 2.0\n{line}\n".encode(), use_fallback=False).type not in {"OutOfMemoryError",
                                                                                           "HostOOM"}


def test_a_workers_own_exception_outranks_the_launchers_report_of_it():
    # the worker's class ends in neither Error nor Exception: no rule names it, its shape does
    log = ("step 10 loss 2.1\nTraceback (most recent call last):\n"
           '  File "/work/data.py", line 12, in load_shard\n    raise ShardCorrupt("bad header")\n'
           "data.ShardCorrupt: shard 17 has a bad header\n"
           "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 4242) of "
           "binary: /usr/bin/python\n")
    assert assert_diagnosed(log, "UncaughtException", "script", root="data.ShardCorrupt").line_no == 5


def test_an_unknown_log_points_at_its_last_error_line():
    log = "step 1 loss 2.0\nthe reticulator failed to spline the batch\nretrying once\nstep 2 done\n"
    d = diagnose(log.encode(), use_fallback=False)
    assert d.category == "unknown" and (d.root_cause_line, d.line_no) == ("the reticulator failed to spline the batch", 2)
