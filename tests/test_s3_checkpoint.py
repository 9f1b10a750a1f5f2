"""Checkpoints to s3:// through s3fs against a real S3 endpoint on loopback (moto server), flaky included."""

from __future__ import annotations

import pytest

pytest.importorskip("moto.server")

from moto.server import ThreadedMotoServer  # noqa: E402

from tasks.training import checkpoint as ck  # noqa: E402
from tasks.training.storage import AlreadyExists, Storage, StorageError  # noqa: E402
from tests.s3_endpoint import FlakyProxy, free_port, s3_env  # noqa: E402
from tests.trainer_util import assert_bitwise_equal, final_state, progress, run, start, tiny_job, wait_for  # noqa: E402


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with FlakyProxy(port) as proxy, s3_env(proxy.port) as env:
        yield proxy, env
    server.stop()


def test_storage_roundtrip_create_only_and_retry_budget(s3):
    proxy, _ = s3
    st = Storage("s3://frenzy/unit", backoff_s=0.05)
    n, sha = st.write_stream("step_00000001/a.bin", lambda: [memoryview(b"x" * 1000), memoryview(b"y" * 24)])
    assert n == 1024 and st.read("step_00000001/a.bin") == b"x" * 1000 + b"y" * 24
    st.create("step_00000001/manifest.json", b"{}")
    with pytest.raises(AlreadyExists):
        st.create("step_00000001/manifest.json", b"{}")
    assert st.list_dirs() == ["step_00000001"]
    # an endpoint that never recovers exhausts the budget with an error naming the URI and the fix
    proxy.fail_for(3600)
    try:
        with pytest.raises(StorageError, match="s3://frenzy/unit/x.bin.*FRENZY_STORAGE_RETRIES"):
            no_inner_retries = {"retries": 1, "config_kwargs": {"retries": {"max_attempts": 1}}}
            Storage("s3://frenzy/unit", attempts=2, backoff_s=0.05, storage_options=no_inner_retries).write_stream(
                "x.bin", lambda: [memoryview(b"z")])
    finally:
        proxy.fail_for(0)



def test_s3_write_hashed_beside_the_upload_gives_the_sha256_of_the_bytes(s3):
    import hashlib

    st = Storage("s3://frenzy/pipeline", backoff_s=0.05)  # not unit/: its test lists that prefix's steps
    parts = [memoryview(bytes([i % 251]) * (300_000 + i)) for i in range(12)]  # several multipart-sized pieces
    n, sha = st.write_stream("step_00000002/rank00000.bin", lambda: iter(parts), threads=3)
    whole = b"".join(bytes(c) for c in parts)
    assert n == len(whole) and sha == hashlib.sha256(whole).hexdigest()
    assert st.read("step_00000002/rank00000.bin") == whole

@pytest.mark.slow  # training and evaluation on S3 (about 25 s each)
def test_training_to_s3_survives_an_endpoint_outage_and_matches_local(s3, tmp_path):
    proxy, env = s3
    steps = 40
    local = run(tiny_job(f"file://{tmp_path}/local", steps), tmp_path / "local")
    assert local["final_step"] == steps
    uri = "s3://frenzy/run1"
    run_dir = tmp_path / "s3run"
    p = start(tiny_job(uri, steps), run_dir, env=env)
    # once the first checkpoint is committed, the endpoint answers 503 SlowDown to everything for 6 s
    wait_for(lambda: any(r["event"] == "checkpoint" for r in progress(run_dir)) or p.poll() is not None,
             what="the first commit")
    failed_before = proxy.failed
    proxy.fail_for(6)
    assert p.wait(timeout=300) == 0, (run_dir / "train.log").read_text()[-3000:]
    assert proxy.failed > failed_before, "the outage never hit a request"
    commits = [r for r in progress(run_dir) if r["event"] == "checkpoint"]
    # a save that came due while the outage held every snapshot buffer was deferred, not lost: it committed a few
    # steps late and says by how much
    due = [r["step"] - r["deferred_steps"] for r in commits]
    assert all(d % 10 == 0 for d in due) and due == sorted(set(due)) and len(commits) >= 3
    assert commits[0]["step"] == 10 and commits[-1]["step"] == 40
    storage = Storage(uri)
    kept = ck.committed(storage)
    assert [m.step for m in kept] == [r["step"] for r in commits][::-1][:3]  # keep: 3
    for m in kept:
        ck.verify(storage, m)
    assert_bitwise_equal(final_state(uri, steps), final_state(f"file://{tmp_path}/local", steps))


@pytest.mark.slow  # training and evaluation on S3 (about 25 s each)
def test_evaluation_of_a_checkpoint_on_s3_preloads_it_and_loads_remotely(s3, tmp_path):
    from tasks.evaluation.runner import EvalOptions, evaluate
    from tests.test_evaluation import small_suite

    run(tiny_job("s3://frenzy/evalrun", steps=10, every=10), tmp_path / "run")
    suite = small_suite()
    el = evaluate("s3://frenzy/evalrun", suite, EvalOptions(out_dir=str(tmp_path / "el"), learn_priors=False,
                                                             shm_root=str(tmp_path / "shm")))
    assert el.uri == "s3://frenzy/evalrun/step_00000010" and el.scores["humaneval"]["pass@1"] == 1.0
    assert list((tmp_path / "shm").iterdir()) == []
    nv = evaluate(el.uri, suite, EvalOptions(schedule="naive", out_dir=str(tmp_path / "nv"), learn_priors=False))
    assert {t.load for t in nv.trials} == {"remote"}
    assert nv.scores["heldout-loss"]["loss"] == el.scores["heldout-loss"]["loss"]
