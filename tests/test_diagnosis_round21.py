"""Round 21 of issue 45: what carries to projects never seen. The learned fallback votes among its nearest labelled
logs (one odd neighbour no longer decides) and is trained on the red-team sets too
(benchmarks/results/diagnosis_round21.md)."""

from __future__ import annotations

from tasks.diagnosis.fallback import Example, Fallback, K, fit


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
