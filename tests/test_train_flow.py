"""The train flow on a real Prefect test server: result, progress artifact, checkpoint events."""

from __future__ import annotations

import time

from tasks.artifactkey import run_key
from tests.trainer_util import tiny_job


def test_train_flow_emits_checkpoint_events_and_artifacts(prefect_server, tmp_path):
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter

    from flows.train import CHECKPOINT_EVENT, TrainRequest, train_flow

    job = tiny_job(f"file://{tmp_path}/ckpt", steps=20, every=10)
    job.name = "flowjob"
    job.training.trace_every_steps = 10
    result = train_flow(TrainRequest(job=job, run_dir=str(tmp_path / "run"), device="cpu"))
    assert result.final_step == 20 and result.resumed_from_step is None
    assert [c.step for c in result.checkpoints] == [10, 20]
    assert result.checkpoints[0].uri == f"file://{tmp_path}/ckpt/step_00000010"

    flt = EventFilter(event=EventNameFilter(name=[CHECKPOINT_EVENT]))
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 30
        while True:
            events = [e for e in client.read_events(filter=flt, limit=50).events if e.payload.get("run") == "flowjob"]
            if len(events) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sorted(e.payload["step"] for e in events) == [10, 20]
        assert {e.payload["uri"] for e in events} == {c.uri for c in result.checkpoints}
        arts = client.read_artifacts()
        progress = [a for a in arts if a.key == run_key("train", "flowjob", f"file://{tmp_path}/ckpt")]
        assert progress and progress[0].data == 100.0
        assert any(a.key == run_key("checkpoints", "flowjob", f"file://{tmp_path}/ckpt") for a in arts)
        # the straggler analysis ran on the run's op traces (one traced step every 10: steps 1 and 11)
        assert result.stragglers is not None and result.stragglers.slowdown > 0.5
        assert any((a.key or "").startswith("stragglers-flowjob-") for a in arts)

    # a second run of the same request resumes from the committed step instead of starting over
    job.training.steps = 30
    again = train_flow(TrainRequest(job=job, run_dir=str(tmp_path / "run"), device="cpu"))
    assert again.resumed_from_step == 20 and again.final_step == 30
