"""The submit pipeline as a state machine (tasks/pipeline/), driven with fake stages: placement, training outcomes,
recovery decisions, the release on every exit path, the watch over a trainer. No Prefect, no processes, no clock:
each test runs in milliseconds."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cluster.ledger import Allocation, LeaseLost, NodeAllocation
from tasks.diagnosis.diagnose import Diagnosis
from tasks.diagnosis.recovery import Action
from tasks.evaluation.record import EvalSummary
from tasks.jobspec import parse_job
from tasks.pipeline.drive import drive
from tasks.pipeline.request import Recovery, SubmitRequest
from tasks.pipeline.run import NEXT, Run, Stage, TrainFailure, TrainOutcome, TransitionError
from tasks.pipeline.summary import submit_result
from tasks.pipeline.watch import Controls, watch
from tasks.planning.layout import Layout
from tasks.planning.plans import ResourcePlan
from tasks.training.checkpoint import CheckpointRecord
from tasks.training.request import TrainResult


def plan(gpu_type: str, gpus: int, tp: int = 1) -> ResourcePlan:
    return ResourcePlan(gpu_type=gpu_type, gpus=gpus, min_gpu_memory_gib=10, acceptable_gpu_types=[gpu_type],
                        layout=Layout(dp=gpus // tp, tp=tp, micro_batch=2), predicted_device_gib=9,
                        predicted_allocated_gib=8, est_step_time_s=0.5, gpu_seconds_per_step=gpus * 0.5,
                        tokens_per_s=1000)


def alloc(i: int, gpus: int, gpu_type: str, node: str, plan_index: int = 0) -> Allocation:
    return Allocation(id=f"a{i}", job="j", plan_index=plan_index, gpus=gpus, min_mem_gib=10, lease_expiry=0,
                      nodes=[NodeAllocation(node=node, gpu_type=gpu_type, gpu_indices=list(range(gpus)))])


def result(step: int = 100) -> TrainResult:
    return TrainResult(job="j", final_step=step, resumed_from_step=None, last_loss=1.0, tokens_per_s=1000, trace=None,
                       run_dir="/runs/j", checkpoint_uri="file:///c",
                       checkpoints=[CheckpointRecord(step=step, uri=f"file:///c/step_{step:08d}", blocked_s=0,
                                                     persist_s=0, bytes=1)])


def diagnosis(type_: str, category: str, restartable: bool = True, line: str = "the cause") -> Diagnosis:
    return Diagnosis(log="train.log", category=category, type=type_, root_cause_line=line, line_no=3, rank=0,
                     node="n0", restartable=restartable, mitigation="do the thing", evidence=[], lines=10, kept_lines=3,
                     compression_ratio=3.0, templates=[])


def summary(step: int) -> EvalSummary:
    return EvalSummary(uri=f"file:///c/step_{step:08d}", run="j", step=step, suite="quick", scores={"x": {"acc": 1.0}},
                       makespan_s=1, predicted_makespan_s=1, result="r.json", history_plot=None)


@dataclass
class Fake:
    """Stages that replay scripted outcomes and record what the driver asked for."""

    plans: list[ResourcePlan]
    allocations: list[Allocation]
    outcomes: list[TrainOutcome | BaseException]
    diagnoses: list[Diagnosis] = field(default_factory=list)
    replans: list[list[ResourcePlan]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    report_error: BaseException | None = None

    def plan(self, run: Run) -> tuple[list[ResourcePlan], str]:
        self.calls.append("plan")
        return self.plans, "test-cluster"

    def place(self, run: Run) -> Allocation:
        self.calls.append(f"place {[p.gpu_type for p in run.candidates]}")
        return self.allocations.pop(0)

    def log_size(self, run: Run) -> int:
        return 100 * len([c for c in self.calls if c.startswith("place")])

    def train(self, run: Run) -> TrainOutcome:
        self.calls.append(f"train on {run.attempt.allocation.id}")
        out = self.outcomes.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    def release(self, run: Run) -> None:
        self.released.append(run.attempt.allocation.id)

    def diagnose(self, run: Run, failure: TrainFailure) -> Diagnosis:
        self.calls.append(f"diagnose from byte {run.attempt.log_offset}")
        return self.diagnoses.pop(0)

    def announce(self, run: Run, recovery: Recovery) -> None:
        self.calls.append(f"announce {recovery.action.kind}")

    def check_nodes(self, run: Run) -> None:
        self.calls.append(f"check nodes of {run.attempt.allocation.id}")

    def replan(self, run: Run, d: Diagnosis) -> list[ResourcePlan]:
        self.calls.append("replan")
        return self.replans.pop(0)

    def evaluations(self, run: Run) -> tuple[list[EvalSummary], list]:
        return run.evaluations, run.evaluation_failures  # in-flow: what training's attempts scored or could not

    def analyse(self, run: Run) -> None:
        return None

    def report(self, run: Run) -> str:
        if self.report_error:
            raise self.report_error
        return "/runs/j/report.html"

    def record(self, run: Run) -> None:
        self.stages.append(run.stage)


def new_run(**request: object) -> Run:
    job = parse_job({"name": "j", "model": {"preset": "gpt-tiny"}, "training": {"seq_len": 64, "global_batch": 8}}, "t")
    return Run(request=SubmitRequest(job=job, **request), run_dir="/runs/j", suite="quick")


def ticks() -> object:
    t = [0.0]

    def clock() -> float:
        t[0] += 1.0
        return t[0]
    return clock


FAILED = TrainOutcome(failure=TrainFailure(message="trainer exited with code 1", returncode=1))


def test_a_clean_run_visits_every_stage_once_and_gives_its_gpus_back():
    f = Fake(plans=[plan("A100", 2)], allocations=[alloc(1, 2, "A100", "n0")],
             outcomes=[TrainOutcome(result=result(), evaluations=[summary(50), summary(100)])])
    run = drive(new_run(), f, ticks())
    assert f.stages == [Stage.PLANNED, Stage.PLACED, Stage.TRAINING, Stage.TRAINED, Stage.RELEASED, Stage.EVALUATED,
                        Stage.REPORTED]
    assert f.released == ["a1"] and not run.held
    res = submit_result(run)
    assert res.released and res.report == "/runs/j/report.html" and [e.step for e in res.evaluations] == [50, 100]
    assert {"plan", "queue", "train+evaluate", "evaluate", "stragglers", "total"} <= set(res.timings_s)


def test_an_infrastructure_failure_releases_checks_the_nodes_and_places_again():
    f = Fake(plans=[plan("A100", 2)], allocations=[alloc(1, 2, "A100", "n0"), alloc(2, 2, "A100", "n1")],
             outcomes=[FAILED, TrainOutcome(result=result())],
             diagnoses=[diagnosis("NCCLTimeoutError", "infrastructure")])
    run = drive(new_run(), f, ticks())
    assert run.stage is Stage.REPORTED and f.released == ["a1", "a2"]
    assert f.calls[:6] == ["plan", "place ['A100']", "train on a1", "diagnose from byte 0", "announce resume",
                           "check nodes of a1"]
    assert f.calls[6:] == ["place ['A100']", "train on a2"]
    [rec] = run.recoveries
    assert rec.action.kind == "resume" and rec.action.node_check
    assert rec.relayout is not None and not rec.relayout.changed and "NCCLTimeoutError on n0" in rec.relayout.why
    assert run.attempt.log_offset == 100  # the log size before the second placement: its diagnosis reads only its part


def test_an_out_of_memory_places_the_replanned_plans_and_the_report_says_where_the_job_went():
    bigger = [plan("A100-80GB", 2, tp=2)]
    f = Fake(plans=[plan("A100", 2)], allocations=[alloc(1, 2, "A100", "n0"), alloc(2, 2, "A100-80GB", "n2")],
             outcomes=[FAILED, TrainOutcome(result=result())],
             diagnoses=[diagnosis("OutOfMemoryError", "framework")], replans=[bigger])
    run = drive(new_run(), f, ticks())
    assert "replan" in f.calls and "place ['A100-80GB']" in f.calls
    assert run.plans == bigger and run.attempt.plan == bigger[0]  # the report's table is the plans it ran on
    assert "-> 2 x A100-80GB (dp 1 x tp 2)" in run.recoveries[0].line()


def test_an_out_of_memory_with_no_bigger_plan_fails_naming_the_fixes():
    f = Fake(plans=[plan("A100", 2)], allocations=[alloc(1, 2, "A100", "n0")], outcomes=[FAILED],
             diagnoses=[diagnosis("OutOfMemoryError", "framework")], replans=[[]])
    run = drive(new_run(), f, ticks())
    assert run.stage is Stage.FAILED and "no plan has more memory per GPU" in run.error and "recompute" in run.error
    assert f.released == ["a1"]


def test_a_script_error_stops_at_once_with_the_cause_not_a_restart():
    f = Fake(plans=[plan("A100", 2)], allocations=[alloc(1, 2, "A100", "n0")], outcomes=[FAILED],
             diagnoses=[diagnosis("FileNotFoundError", "script", restartable=False, line="No such file: data.bin")])
    run = drive(new_run(), f, ticks())
    assert run.stage is Stage.FAILED and "No such file: data.bin" in run.error and "/runs/j/train.log" in run.error
    assert [c for c in f.calls if c.startswith("place")] == ["place ['A100']"] and f.released == ["a1"]


def test_the_trainers_own_message_is_the_cause_when_it_names_one():
    named = TrainOutcome(failure=TrainFailure(message="data.path ./corpus.txt does not exist", returncode=2))
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(1, 1, "A100", "n0")], outcomes=[named],
             diagnoses=[diagnosis("DataError", "script", restartable=False)])
    run = drive(new_run(), f, ticks())
    assert run.error.startswith("j: data.path ./corpus.txt does not exist (the trainer stopped on it")


def test_restarts_stop_at_max_restarts():
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(i, 1, "A100", f"n{i}") for i in range(3)],
             outcomes=[FAILED, FAILED, FAILED], diagnoses=[diagnosis("ECCError", "infrastructure")] * 3)
    run = drive(new_run(max_restarts=2), f, ticks())
    assert run.stage is Stage.FAILED and len(run.recoveries) == 3
    assert [r.action.kind for r in run.recoveries] == ["resume", "resume", "stop"]
    assert "2 restart(s) already, the limit is 2" in run.error and f.released == ["a0", "a1", "a2"]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), LeaseLost("lease lost"), RuntimeError("a bug")])
def test_the_gpus_are_released_whatever_ends_the_run(error: BaseException):
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(1, 1, "A100", "n0")], outcomes=[error])
    with pytest.raises(type(error)):
        drive(new_run(), f, ticks())
    assert f.released == ["a1"]


def test_a_report_that_fails_after_the_release_does_not_release_twice():
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(1, 1, "A100", "n0")],
             outcomes=[TrainOutcome(result=result())], report_error=OSError("disk full"))
    with pytest.raises(OSError):
        drive(new_run(), f, ticks())
    assert f.released == ["a1"]


def test_evaluations_of_earlier_attempts_are_kept_and_a_steps_newest_one_wins():
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(1, 1, "A100", "n0"), alloc(2, 1, "A100", "n0")],
             outcomes=[FAILED.model_copy(update={"evaluations": [summary(50)]}),
                       TrainOutcome(result=result(), evaluations=[summary(100)])],
             diagnoses=[diagnosis("SegFault", "framework")])
    run = drive(new_run(), f, ticks())
    assert [e.step for e in run.evaluations] == [50, 100]


def test_an_in_flow_evaluation_failure_reaches_the_result_unless_a_later_attempt_scored_that_step():
    from tasks.pipeline.evaluations import EvalFailure

    bad = EvalFailure(step=50, cause="qa.jsonl:2:1: not JSON")
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(1, 1, "A100", "n0"), alloc(2, 1, "A100", "n0")],
             outcomes=[FAILED.model_copy(update={"evaluation_failures": [bad]}),
                       TrainOutcome(result=result(), evaluations=[summary(50)],
                                    evaluation_failures=[bad.model_copy(update={"step": 100})])],
             diagnoses=[diagnosis("SegFault", "framework")])
    run = drive(new_run(), f, ticks())
    assert [e.step for e in run.evaluations] == [50]
    assert [(x.step, x.cause) for x in run.evaluation_failures] == [(100, "qa.jsonl:2:1: not JSON")]


def test_the_machine_refuses_a_transition_it_does_not_have():
    run = new_run()
    with pytest.raises(TransitionError):
        run.to(Stage.TRAINING, 0.0)
    assert run.to(Stage.FAILED, 0.0).stage is Stage.FAILED  # any stage may fail
    reachable = {Stage.SUBMITTED} | {s for targets in NEXT.values() for s in targets}
    assert reachable | {Stage.FAILED} == set(Stage)


def test_recovery_lines_read_as_the_report_shows_them():
    rec = Recovery(diagnosis=diagnosis("Hang", "infrastructure"), action=Action(kind="resume", reason="hung"))
    assert rec.line() == "Hang (infrastructure): resume, hung"


class Trainer:
    """A trainer behind the watch's Handle: done after `runs` polls; each wait moves the fake clock."""

    def __init__(self, runs: int, clock: list[float]) -> None:
        self.runs, self.clock, self.stopped = runs, clock, False

    def done(self) -> bool:
        return self.runs <= 0 or self.stopped

    def wait(self, timeout_s: float | None) -> None:
        self.clock[0] += timeout_s or 0.0
        self.runs -= 1


def controls(t: Trainer, sizes: list[int], lost: list[bool] | None = None, **kw: object) -> tuple[Controls, list[str]]:
    said: list[str] = []

    def stop() -> None:
        said.append("stop")
        t.stopped = True
    return Controls(progress_size=lambda: sizes[min(len(said), len(sizes) - 1)] if sizes else 0,
                    kill=lambda why: said.append(f"kill: {why}"), stop=stop,
                    lease_lost=lambda: bool(lost and lost.pop(0)), **kw), said


def test_the_watch_kills_a_trainer_that_writes_no_progress_for_hang_s():
    now = [0.0]
    t = Trainer(runs=20, clock=now)
    sizes = iter([10, 10, 20])  # the last attempt's records, then this one's first record, then nothing more
    said: list[tuple[str, float]] = []
    c = Controls(progress_size=lambda: next(sizes, 20), kill=lambda why: said.append((why, now[0])), stop=lambda: None,
                 lease_lost=lambda: False)
    watch(t, c, "j", hang_s=9, clock=lambda: now[0], poll_s=2.0)
    assert said and said[0] == ("no progress record for 9 s", 12.0)  # 9 s after its record at 2 s, polled every 2 s


def test_the_watch_gives_a_starting_trainer_the_start_up_allowance_not_hang_s():
    from tasks.pipeline.watch import STARTUP_S

    now = [0.0]
    t = Trainer(runs=int(STARTUP_S) // 2 + 20, clock=now)
    c, said = controls(t, sizes=[10])  # no record of its own yet: still importing, building, reading a checkpoint
    kills: list[float] = []
    c.kill = lambda why: (said.append(why), kills.append(now[0]))
    watch(t, c, "j", hang_s=9, clock=lambda: now[0], poll_s=2.0)
    assert said[0] == f"no progress record for {STARTUP_S:.0f} s since it started"
    assert STARTUP_S < kills[0] <= STARTUP_S + 2


def test_the_watch_leaves_a_trainer_alone_while_its_progress_grows():
    now = [0.0]
    t = Trainer(runs=20, clock=now)
    grow = iter(range(1000))
    said: list[str] = []
    c = Controls(progress_size=lambda: next(grow), kill=lambda why: said.append(why), stop=lambda: said.append("stop"),
                 lease_lost=lambda: False)
    watch(t, c, "j", hang_s=3, clock=lambda: now[0], poll_s=2.0)
    assert said == []


def test_after_an_evaluators_turn_as_long_as_a_poll_the_watch_looks_again_at_once():
    now = [0.0]
    waits: list[float | None] = []

    class Timed(Trainer):
        def wait(self, timeout_s: float | None) -> None:
            waits.append(timeout_s)
            super().wait(timeout_s)

    turns = iter([15.0, 0.1, 0.0])  # an evaluation, then a look that found nothing new, then nothing

    def on_poll() -> None:
        now[0] += next(turns, 0.0)

    t = Timed(runs=4, clock=now)
    c, said = controls(t, sizes=[], on_poll=on_poll)
    watch(t, c, "j", hang_s=100, clock=lambda: now[0], poll_s=2.0)
    assert waits == [0.0, 2.0, 2.0, 2.0] and said == []


def test_a_lost_lease_stops_the_trainer_after_its_commit_and_raises():
    now = [0.0]
    t = Trainer(runs=20, clock=now)
    c, said = controls(t, sizes=[1, 2, 3], lost=[False, True])
    with pytest.raises(LeaseLost):
        watch(t, c, "j", hang_s=100, clock=lambda: now[0])
    assert said == ["stop"]


def test_ctrl_c_in_the_watch_asks_the_trainer_to_commit_first():
    now = [0.0]
    t = Trainer(runs=20, clock=now)

    def interrupt() -> None:
        raise KeyboardInterrupt
    c, said = controls(t, sizes=[1], on_poll=interrupt)
    with pytest.raises(KeyboardInterrupt):
        watch(t, c, "j", hang_s=100, clock=lambda: now[0])
    assert said == ["stop"]


def test_a_name_whose_run_only_waits_for_its_evaluations_is_free_and_each_run_stays_its_own(tmp_path):
    """Red team 41n A3, as docs/pipeline.md says: a second root's `exp` is refused while another `exp` holds GPUs or
    waits for them, and accepted once that run's GPUs are back (it may still wait for its evaluations); the ledger
    keeps both runs, the newest answering for the bare name."""
    from cluster.ledger import Ledger, RunRecord
    from tasks.pipeline.summary import name_taken

    req = new_run().request.model_copy(update={"job": new_run().request.job.model_copy(deep=True)})
    req.job.training.checkpoint.uri = "file:///nb/ck"
    alice = RunRecord(job=req.job.name, owner="hosta:7", stage="training", checkpoint_root="file:///alice/ck",
                      run_dir="/alice/runs/exp", history_dir="/alice/evals")
    assert "hosta:7" in name_taken([alice], req, {req.job.name})  # her allocation holds the name
    waiting = alice.model_copy(update={"stage": Stage.RELEASED.value})
    assert name_taken([waiting], req, set()) is None  # released, waiting for its evaluations: the name is free
    ledger = Ledger(str(tmp_path / "l.db"))
    ledger.record_run(waiting)
    nb = waiting.model_copy(update={"owner": "hostn:9", "checkpoint_root": "file:///nb/ck", "run_dir": "/nb/runs/exp"})
    ledger.record_run(nb)
    assert ledger.run(req.job.name).owner == "hostn:9"  # the bare name: the newest run
    assert ledger.run(req.job.name, "file:///alice/ck").owner == "hosta:7"  # each root: its own run
    assert sorted(r.owner for r in ledger.runs(req.job.name)) == ["hosta:7", "hostn:9"]


def test_a_job_name_another_running_job_holds_is_refused_and_a_finished_one_is_reported():
    from cluster.ledger import RunRecord
    from tasks.pipeline.summary import already_finished, name_taken

    req = new_run().request.model_copy(update={"job": new_run().request.job.model_copy(deep=True)})
    req.job.training.checkpoint.uri = "file:///alice/ckpt"
    other = RunRecord(job="j", owner="hostb:42", stage="training", checkpoint_root="file:///bob/ckpt", run_dir="/b",
                      history_dir="/b/evals")
    assert "another run of this name is running (hostb:42" in name_taken([other], req, {"j"})
    assert name_taken([other], req, set()) is None  # it ended (or its lease ran out): the name is free again
    assert name_taken([other.model_copy(update={"checkpoint_root": "file:///alice/ckpt"})], req, {"j"}) is None  # rerun
    # the same root spelled as a plain path (a job's `uri: /alice/ckpt/`) is this very run too
    assert name_taken([other.model_copy(update={"checkpoint_root": "/alice/ckpt/"})], req, {"j"}) is None
    # Alice's own earlier run is the newest record of the name, Bob's unfinished one still holds the name
    mine = other.model_copy(update={"checkpoint_root": "file:///alice/ckpt", "stage": "reported", "owner": "hosta:1"})
    assert "hostb:42" in name_taken([mine, other], req, {"j"})
    assert name_taken([mine, other.model_copy(update={"stage": "failed"})], req, {"j"}) is None  # Bob's ended
    # a finished run is reported, not trained again, only while its final step is still committed
    done = other.model_copy(update={"stage": "reported", "checkpoint_root": "file:///alice/ckpt", "result": "{}"})
    assert already_finished(done, req) is None  # no committed step 1000 under /alice/ckpt


def test_steps_left_unscored_when_the_wait_ran_out_are_named_in_the_summary(tmp_path):
    """Red team 41f S20: `--eval-timeout 45` on a paused pool printed `scores by checkpoint: (none)` and no reason."""
    import torch

    from tasks.pipeline.summary import unscored_note
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    root = f"file://{tmp_path}/ck"
    c = ck.AsyncCheckpointer(Storage(root), 0, 1, run="j", keep=2)
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    for step in (10, 20, 30):  # keep=2: retention removes step 10 (not waited for, not named)
        c.save(step, [("w", torch.zeros(2))], fields)
    c.close()
    res = result(30).model_copy(update={"checkpoint_uri": root, "checkpoints": [
        CheckpointRecord(step=s, uri=f"{root}/step_{s:08d}", blocked_s=0, persist_s=0, bytes=1) for s in (10, 20, 30)]})
    run = new_run(eval_timeout_s=45.0).model_copy(update={"mode": "deployment", "result": res,
                                                          "evaluations": [summary(30)]})
    note = unscored_note(run)
    assert note is not None and note.startswith("no score for step(s) 20 within eval_timeout_s (45 s")
    # red team 41q G3: it promised "their evaluation runs score them when a worker takes them" of a run nothing ran
    assert "when a worker takes them" not in note and f"`frenzy evaluate {root}/step_00000020 --suite " in note, note
    assert unscored_note(run.model_copy(update={"evaluations": [summary(20), summary(30)]})) is None
    assert unscored_note(run.model_copy(update={"mode": "in-flow"})) is None


class StubbornTrainer(Trainer):
    """A trainer that does not stop when asked (its step runs long, it is rolling back): only a kill ends it."""

    def __init__(self, clock: list[float], interrupt_at_wait: int | None) -> None:
        super().__init__(runs=10**6, clock=clock)
        self.killed, self.waits, self.interrupt_at_wait = False, 0, interrupt_at_wait

    def done(self) -> bool:
        return self.killed

    def wait(self, timeout_s: float | None) -> None:
        self.waits += 1
        if self.waits == self.interrupt_at_wait:  # the signal lands while the watch waits for the commit
            raise KeyboardInterrupt
        super().wait(timeout_s)


@pytest.mark.parametrize(("interrupt_at_wait", "why"), [
    (None, "asked to stop, still running after 120 s"),  # a trainer that ignores the stop
    (2, "asked to stop, still running after 120 s"),  # the same stop signalled twice (`timeout`): still its commit
    (5, "interrupted again while it committed its step")])  # someone insisting, 8 s later
def test_an_interrupted_watch_returns_only_when_the_trainer_is_gone(interrupt_at_wait: int | None, why: str):
    """Red team 41g S08b: a second SIGTERM while the trainer committed let the GPUs be released while it trained on.
    Whatever happens while it stops (a second signal, a trainer that ignores the stop), the watch ends it first."""
    now = [0.0]
    t = StubbornTrainer(now, interrupt_at_wait)
    said: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    c = Controls(progress_size=lambda: 1, kill=lambda why: (said.append(f"kill: {why}"), setattr(t, "killed", True)),
                 stop=lambda: said.append("stop"), lease_lost=lambda: False, on_poll=interrupt)
    with pytest.raises(KeyboardInterrupt):
        watch(t, c, "j", hang_s=100, clock=lambda: now[0])
    assert t.done() and said == ["stop", f"kill: {why}"]


def test_a_rerun_of_a_finished_job_marks_its_old_evaluation_failures_as_the_earlier_runs(tmp_path):
    """Red team 41g S07: a rerun of a finished job whose evaluations had failed repeated the old causes as if current
    and did not say how to have the steps evaluated again. A step scored since drops its failure."""
    import torch

    from cluster.ledger import RunRecord
    from tasks.evaluation import history
    from tasks.pipeline.evaluations import EvalFailure
    from tasks.pipeline.summary import already_finished
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    root = f"file://{tmp_path}/ck"
    c = ck.AsyncCheckpointer(Storage(root), 0, 1, run="j", keep=2)
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    for step in (10, 20):
        c.save(step, [("w", torch.zeros(2))], fields)
    c.close()
    run = new_run(history_dir=str(tmp_path / "evals"))
    run.request.job.training.steps, run.request.job.training.checkpoint.uri = 20, root
    old = [EvalFailure(step=10, cause="TypeError: factory() takes 0 positional arguments"),
           EvalFailure(step=20, cause="TypeError: factory() takes 0 positional arguments")]
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(1, 1, "A100", "n0")],
             outcomes=[TrainOutcome(result=result(20), evaluation_failures=old)])
    done = drive(run, f, clock=ticks())
    assert [x.line() for x in submit_result(done).evaluation_failures][0] == (
        "evaluation of step 10 FAILED: TypeError: factory() takes 0 positional arguments")  # the run's own: current
    # red team 41r S4: a step lost for good names the command that scores it later
    note = [n for n in submit_result(done).notes if n.startswith("step(s) 10, 20: no score")]
    uri = done.result.checkpoint_uri.rstrip("/")
    assert note and f"`frenzy evaluate {uri}/step_00000010 --suite " in note[0] and "(one per step)" in note[0], note
    rec = RunRecord(job="j", stage="reported", checkpoint_root=root, run_dir="/runs/j", history_dir=str(tmp_path / "evals"),
                    suite="quick", result=submit_result(done).model_dump_json())
    history.append(tmp_path / "evals", "j", 20, f"{root}/step_00000020", "quick", {"x": {"acc": 0.5}})  # scored since
    again = already_finished(rec, run.request, "quick")
    assert again is not None and [e.step for e in again.evaluations] == [20]
    assert [x.line() for x in again.evaluation_failures] == [
        "evaluation of step 10 FAILED in the earlier run (not tried again by this one): TypeError: factory() takes 0 "
        "positional arguments"]
    [note] = again.notes
    assert note.startswith("step(s) 10: their evaluation (or some of its datasets) failed in an earlier evaluation of j")
    assert "not tried again by this run" in note and "from then" in note
    assert f"`frenzy evaluate {root}/step_00000010 --suite quick`" in note and "evaluate-pending" in note
    # red team 41r S19: the report a rerun names is rewritten with today's scores and every failure
    from tasks.pipeline.summary import rerun_report
    from tasks.report import markdown

    text = markdown(rerun_report(again, run.request, "local"))
    assert "- evaluation of step 10 FAILED in the earlier run" in text, text
    assert "| metric | step 20 |" in text and "| x acc | 0.5 |" in text, text
    # red team 41q Y4: a later pass (evaluate-pending) scored step 10 but for one dataset: said as earlier, with the note
    history.append(tmp_path / "evals", "j", 10, f"{root}/step_00000010", "quick", {"x": {"acc": 0.4}},
                   failed={"hangs": "hung while loading"})
    again = already_finished(rec, run.request, "quick")
    assert again is not None and [e.step for e in again.evaluations] == [10, 20] and not again.evaluation_failures
    assert [line for e in again.evaluations for line in e.failed_lines()] == [
        "step 10: hangs FAILED in an earlier evaluation (not tried again by this run): hung while loading"]
    [note] = again.notes
    assert note.startswith("step(s) 10: ") and f"`frenzy evaluate {root}/step_00000010 --suite quick`" in note


def test_a_second_signal_while_the_stop_is_asked_still_asks_it():
    """Red team 41g S08b, reproduced: `timeout`'s two SIGTERMs, the second landing while the watch wrote the stop
    request, left no stop request: the flow ended, its task runner waited on a trainer that trained on."""
    now = [0.0]
    t = Trainer(runs=10**6, clock=now)
    asked: list[str] = []

    def stop() -> None:
        asked.append("stop")
        if len(asked) == 1:
            raise KeyboardInterrupt  # the second signal, before the request was written
        t.stopped = True

    def interrupt() -> None:
        raise KeyboardInterrupt
    c = Controls(progress_size=lambda: 1, kill=lambda why: asked.append(f"kill: {why}"), stop=stop,
                 lease_lost=lambda: False, on_poll=interrupt)
    with pytest.raises(KeyboardInterrupt):
        watch(t, c, "j", hang_s=100, clock=lambda: now[0])
    assert t.done() and asked == ["stop", "stop"]


def test_a_lost_lease_names_its_cause_from_the_ledger_released_or_lapsed(tmp_path):
    """Red team 41j S09: an allocation released by hand while submit and its trainer both ran was reported as "the
    lease lapsed ... both were stopped"; the watch now says what the ledger records: released (with the id), or
    lapsed when nobody renewed it."""
    from cluster.has import GpuRequest
    from cluster.inventory import load_cluster
    from cluster.ledger import Ledger
    from tasks.training.allocation import lost_cause

    now = [1000.0]
    led = Ledger(f"sqlite:///{tmp_path}/l.db", clock=lambda: now[0])
    led.sync(load_cluster("phoebe"))
    released, lapsed = (led.allocate(j, [GpuRequest(1, 1)], lease_s=30) for j in ("rel", "lap"))
    led.release(released.id)
    now[0] += 60  # past lap's lease: the next transaction expires it
    led.sync(load_cluster("phoebe"))
    t = Trainer(runs=20, clock=[0.0])
    c, said = controls(t, sizes=[1, 2, 3], lost=[True],
                       lost_cause=lambda: lost_cause(led, led.url, released.id, 30, "its trainer"))
    with pytest.raises(LeaseLost) as err:
        watch(t, c, "rel", hang_s=100, clock=lambda: 0.0)
    assert str(err.value).startswith(f"rel: allocation {released.id} in the ledger {led.url} was released by hand "
                                     "while its trainer ran"), str(err.value)
    assert said == ["stop"] and "committing its step" in str(err.value)
    said_lapsed = lost_cause(led, led.url, lapsed.id, 30, "its trainer")
    assert f"allocation {lapsed.id}" in said_lapsed and "lapsed: its lease ran out at" in said_lapsed, said_lapsed
    assert "nor its trainer" in said_lapsed


def test_a_trial_a_metric_process_and_an_evaluation_run_say_how_they_ended_in_one_wording():
    """One function (`tasks.procs.exit_words`) says how a process ended for the trial errors, the metric processes'
    and `submit`'s crashed evaluation runs (three copies before): an exit status, a signal by name or number, and the
    usual senders of SIGKILL where the caller names them."""
    from tasks.evaluation.runner import ended
    from tasks.pipeline.evaluations import crash_cause
    from tasks.procs import exit_words

    assert [exit_words(rc) for rc in (0, 3, -15, -9, -77)] == [
        "exit status 0", "exit status 3", "killed by SIGTERM", "killed by SIGKILL", "killed by signal 77"]
    assert exit_words(-9, lambda sig: "the OOM killer" if sig == "SIGKILL" else "") == "killed (SIGKILL: the OOM killer)"
    assert exit_words(-15, lambda sig: "the OOM killer" if sig == "SIGKILL" else "") == "killed by SIGTERM"
    assert [ended(rc) for rc in (1, -15, -77)] == ["exited with status 1", "was killed by SIGTERM",
                                                   "was killed by signal 77"]
    assert ended(-9) == "was killed (SIGKILL: most often the kernel's out-of-memory killer; see `dmesg`)"
    said = crash_cause("Process exited with status code: -15. Cancelled", "r")
    assert said.startswith("its evaluation process (flow run r) was killed (SIGTERM: a signal sent to it); "), said


def test_a_crashed_evaluation_run_killed_by_a_signal_is_named_as_a_killed_evaluation_process():
    """Red team 41m B3: `submit` reported a killed evaluation run with Prefect's guess only (`Process exited with
    status code: -9 ... exceeding memory limits, or by manual cancellation`). The message is built here as Prefect's
    runner builds it, from the exit status of a real process killed by a real SIGKILL."""
    import subprocess
    import sys

    from prefect._internal.infrastructure_exit_codes import get_infrastructure_exit_info

    from tasks.pipeline.evaluations import EvalFailure, crash_cause

    proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.killpg(0, signal.SIGKILL)"],
                            start_new_session=True)
    rc = proc.wait()
    assert rc == -9
    prefect_says = f"Process exited with status code: {rc}. {get_infrastructure_exit_info(rc).explanation}"
    line = EvalFailure(step=10, cause=crash_cause(prefect_says, "lurking-sheep")).line()
    assert line.startswith("evaluation of step 10 FAILED: its evaluation process (flow run lurking-sheep) was "
                           "killed (SIGKILL: a dataset plugin that kills its own process group"), line
    assert "`prefect flow-run logs lurking-sheep`" in line and line.endswith(prefect_says)
    assert crash_cause("Flow run infrastructure went away", "x") == "Flow run infrastructure went away"
    assert crash_cause(None, "x") == "the run x ended Crashed"


def test_submit_says_why_it_runs_an_evaluation_again_stuck_pending_is_not_called_a_crash():
    """An evaluation run left PENDING (its process SIGSTOPped as it spawned) was named after FRENZY_EVAL_STUCK_S and
    run again, but submit's line read "crashed (its worker or process died)" though the process was alive and stopped
    and the worker up; the cause `_reap` records reached only the run's state. The rerun line carries that cause."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from flows.stages import TriggeredEvaluations
    from tasks.pipeline.evaluations import rerun_line

    set_states = []
    client = SimpleNamespace(set_flow_run_state=lambda rid, state, force: set_states.append((rid, state.type.value)))
    t = TriggeredEvaluations("file:///c", datetime.now(UTC), warn=lambda _: None)
    why = t._reap(client, SimpleNamespace(id="r1", name="lurking-sheep"), 20.2)
    assert set_states == [("r1", "CANCELLING")]
    line = rerun_line(20, why)
    assert line.startswith("the evaluation run of step 20 ended without a score: the evaluation run lurking-sheep was "
                           "claimed by a worker and never started (20 s PENDING"), line
    assert "its process is stopped or stuck" in line and line.endswith("; running it again")
    assert "died" not in line
    # the control: a run whose cause the server did not give is still called a crash
    assert rerun_line(20, "") == "the evaluation run of step 20 crashed (its worker or process died): running it again"


def test_a_running_evaluation_silent_for_three_heartbeats_is_gone_and_a_quiet_live_one_is_not():
    """Red team 41q G3: an evaluation run whose process was SIGKILLed with its worker stayed Running, and submit waited
    it out until eval_timeout_s. The decision from the server's records (seconds before now), and what it costs."""
    from tasks.pipeline.liveness import Liveness, heartbeat_period, process_gone, worth_reading

    period = heartbeat_period({"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"})
    assert period == 30.0 and heartbeat_period({"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": 10}) == 30.0  # Prefect's least
    assert heartbeat_period({}) is None and heartbeat_period({"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "0"}) is None
    assert heartbeat_period({"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "often"}) is None
    killed = Liveness(running_s=120, quiet_s=115, beat_s=115)  # G3: one heartbeat at its start, killed 5 s in
    why = process_gone(killed, period, "evaluate-ck-20", "92f1")
    assert why is not None and "sent no heartbeat for 115 s" in why and "logged nothing for 115 s" in why
    assert "its process is gone" in why and "`prefect flow-run logs 92f1`" in why
    assert process_gone(Liveness(running_s=900, quiet_s=900, beat_s=12), period, "r", "i") is None  # quiet, beating
    assert process_gone(Liveness(running_s=900, quiet_s=20, beat_s=400), period, "r", "i") is None  # logs: alive
    assert process_gone(Liveness(running_s=80, quiet_s=80, beat_s=None), period, "r", "i") is None  # too early
    never = process_gone(Liveness(running_s=100, quiet_s=100, beat_s=None), period, "r", "i")
    assert never is not None and "sent no heartbeat since it started" in never
    assert process_gone(killed, None, "r", "i") is None  # a deployment without heartbeats: nothing tells
    # the cost: heartbeats are read only for a run quiet past 3 periods, and then once a period
    assert not worth_reading(90, period, None) and worth_reading(91, period, None)
    assert not worth_reading(500, period, 29) and worth_reading(500, period, 30) and not worth_reading(500, None, None)


def test_a_pool_is_unattended_once_every_worker_missed_three_heartbeats_and_a_worker_between_polls_is_alive():
    """Issue 41: with no worker on the evaluation pool, submit waited eval_timeout_s (1800 s) for runs no worker would
    take. The decision, on fake worker records: alive until three heartbeats are missed (its own period, or Prefect's
    30 s), so a worker between two polls is never taken for gone; with none alive, how long none has been seen."""
    from tasks.pipeline.liveness import WorkerSeen, fenced, no_worker_words, unattended_s, worker_alive

    between = WorkerSeen(name="w-between", beat_s=85.0)  # 30 s period: 2.8 periods since its last heartbeat
    slow = WorkerSeen(name="w-slow", beat_s=170.0, interval_s=60)  # its own 60 s period: alive until 180 s
    dead = WorkerSeen(name="w-dead", beat_s=95.0)
    older = WorkerSeen(name="w-older", beat_s=4000.0)
    assert worker_alive(between) and worker_alive(slow) and not worker_alive(dead)
    assert not worker_alive(WorkerSeen(name="w-never", beat_s=None))
    assert unattended_s([between, dead], watched_s=0.0) is None and unattended_s([slow], 0.0) is None
    assert unattended_s([dead, older], watched_s=5.0) == 95.0  # since the newest heartbeat, however long watched
    assert unattended_s([], watched_s=42.0) == 42.0  # none ever started: as long as submit has watched
    words = no_worker_words("frenzy", [older, dead])
    assert "no worker polls the work pool frenzy" in words and "w-dead, last polled 95 s ago" in words
    assert "`prefect worker start --pool frenzy`" in words and "--evaluation in-flow" in words
    assert "no worker ever polled it" in no_worker_words("frenzy", [])
    assert fenced("RUNNING", "r") is None and fenced("CANCELLING", "r") is None and fenced(None, "r") is None
    assert "its run r is Crashed on the server" in (fenced("CRASHED", "r") or "")


def commit_steps(root: str, steps: tuple[int, ...]) -> None:
    """Committed checkpoints of a 2-float model at `steps` under `root` (what `already_finished` looks for)."""
    import torch

    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    c = ck.AsyncCheckpointer(Storage(root), 0, 1, run="j", keep=5)
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    for step in steps:
        c.save(step, [("w", torch.zeros(2))], fields)
    c.close()


def test_a_finished_job_submitted_again_is_reported_with_the_historys_scores_and_fewer_steps_are_named(tmp_path):
    """What test_submit's whole-pipeline test asked of three more submits of its finished 60-step job: the same job
    is reported and trains nothing; edited to fewer steps (red team 41c S9) it is still the 60-step run, said so; a
    score that landed after the run was reported counts. The flow's early return is the evaluation-off test's third
    submit (tests/test_submit.py)."""
    from cli.submit import _human
    from cluster.ledger import RunRecord
    from tasks.evaluation import history
    from tasks.pipeline.summary import already_finished

    root, hist = f"file://{tmp_path}/ck", str(tmp_path / "evals")
    commit_steps(root, (20, 40, 60))
    run = new_run(history_dir=hist)
    run.request.job.training.steps, run.request.job.training.checkpoint.uri = 60, root
    trained = result(60).model_copy(update={"checkpoint_uri": root, "checkpoints": [
        CheckpointRecord(step=s, uri=f"{root}/step_{s:08d}", blocked_s=0, persist_s=0, bytes=1) for s in (20, 40, 60)]})
    f = Fake(plans=[plan("A100", 1)], allocations=[alloc(1, 1, "A100", "n0")],
             outcomes=[TrainOutcome(result=trained, evaluations=[summary(20), summary(40), summary(60)])])
    res = submit_result(drive(run, f, clock=ticks()))
    rec = RunRecord(job="j", stage="reported", checkpoint_root=root, run_dir="/runs/j", history_dir=hist, suite="quick",
                    result=res.model_dump_json(), report=res.report)
    done = already_finished(rec, run.request, "quick")
    assert done is not None and done.already_finished and done.train == res.train and done.report == res.report
    assert done.evaluations == res.evaluations and done.notes == [] and "nothing trained again" in _human(done, 1.0)
    fewer = run.request.model_copy(update={"job": run.request.job.model_copy(deep=True)})
    fewer.job.training.steps = 40
    edited = already_finished(rec, fewer, "quick")
    assert edited is not None and edited.already_finished and edited.train.final_step == 60
    [note] = edited.notes
    assert "j now asks for 40 steps, but its run" in note and "holds 60" in note, note
    assert "new name or a new training.checkpoint.uri" in note and f"note: {note}" in _human(edited, 1.0)
    # reported before step 60's score landed (an evaluation run that ended later): the history's score counts
    early = res.model_copy(update={"evaluations": res.evaluations[:2]}).model_dump_json()
    assert [e.step for e in already_finished(rec, run.request, "quick").evaluations] == [20, 40, 60]
    # control: no score of step 60 anywhere yet, so it was never evaluated: the submit evaluates it, reports nothing
    assert already_finished(rec.model_copy(update={"result": early}), run.request, "quick") is None
    history.append(hist, "j", 60, f"{root}/step_00000060", "quick", {"x": {"acc": 0.5}})
    again = already_finished(rec.model_copy(update={"result": early}), run.request, "quick")
    assert again is not None and [e.step for e in again.evaluations] == [20, 40, 60]


def test_a_rerun_that_trains_nothing_reports_the_training_that_committed_its_final_step(tmp_path):
    """The ledger has no word of a finished run (another ledger, or stopped while it waited for its evaluations): the
    trainer resumes at the final step and trains nothing, and the run reports the earlier training (its loss,
    throughput, checkpoints and trace, for the straggler analysis), its result.json put back. What the whole-pipeline
    test's sixth submit checked; the real trainer's path through it is the evaluation-off test's second submit."""
    import math

    from tasks.pipeline.rerun import Earlier

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    earlier = result(60).model_copy(update={"last_loss": 2.5, "tokens_per_s": 1234.0, "trace": "/runs/j/traces"})
    (run_dir / "result.json").write_text(text := earlier.model_dump_json())
    before = Earlier(run_dir)  # read before the trainer replaces it
    nothing = result(60).model_copy(update={"resumed_from_step": 60, "checkpoints": [], "last_loss": math.nan,
                                            "tokens_per_s": 0.0, "trace": None})
    (run_dir / "result.json").write_text(nothing.model_dump_json())
    kept = before.carried_over(nothing)
    assert kept == earlier.model_copy(update={"resumed_from_step": 60})
    assert (run_dir / "result.json").read_text() == text
    # controls: a resume that trained, a result of another checkpoint root, no earlier result: this run's own
    trained = result(80).model_copy(update={"resumed_from_step": 60})
    assert before.carried_over(trained) is trained
    elsewhere = nothing.model_copy(update={"checkpoint_uri": "file:///elsewhere"})
    assert before.carried_over(elsewhere) is elsewhere
    assert Earlier(tmp_path / "none").carried_over(nothing) is nothing


def test_device_cuda_on_an_allocation_without_a_cuda_gpu_trains_on_the_cpu_and_says_so():
    """Red team 41g S15: `--device cuda` on a machine without CUDA trained on the CPU and said nothing. The trainer's
    request is for the CPU, the warning names the allocation's node, and the summary says where it trained. A GPU
    allocation and `--device cpu` say nothing. (test_submit's device test reads the same lines of a real run.)"""
    import socket
    from pathlib import Path

    from cli.submit import _human
    from tasks.pipeline.attempt import cpu_fallback, training_request

    host = socket.gethostname()
    req = new_run(device="cuda").request
    on_cpu = alloc(1, 1, "cpu", host)
    treq = training_request(req, on_cpu, plan("cpu", 1), Path("/runs/j"))
    assert treq.device == "cpu" and not treq.gpu_indices
    assert cpu_fallback(req, treq, on_cpu) == (
        f"--device cuda, but the allocation on {host} holds no CUDA GPU: training runs on the CPU (give a cluster "
        "with GPUs, or --device cpu to say so)")
    assert cpu_fallback(req.model_copy(update={"device": "cpu"}), treq, on_cpu) is None
    on_gpu = alloc(2, 2, "A100", host)
    gtreq = training_request(req, on_gpu, plan("A100", 2), Path("/runs/j"))
    assert gtreq.device == "cuda" and gtreq.gpu_indices == [0, 1] and cpu_fallback(req, gtreq, on_gpu) is None
    f = Fake(plans=[plan("cpu", 1)], allocations=[on_cpu], outcomes=[TrainOutcome(result=result(10))])
    said = _human(submit_result(drive(new_run(), f, ticks())), 1.0)
    assert said.startswith(f"j: 10 steps on 1 x cpu (dp=1 tp=1 pp=1 mb=2), placed on {host}[0]; "), said


def test_an_in_flow_fallback_names_the_dataset_plugins_this_process_lacks():
    """Red team 41r (fix41p's note): once no worker had polled the pool, submit evaluated the steps left in-flow, and a
    dataset whose `module:factory` plugin only the workers had failed there with no word that the workers had it. The
    fallback's warning names each such plugin and how to score it where it is installed; a suite whose datasets are
    all here gets no such line."""
    from tasks.evaluation.suite import Suite
    from tasks.pipeline.evaluations import lacking_here

    here = {"name": "heldout-loss", "examples": 8, "mode": "ppl", "infer_s_per_example": 0.004}
    theirs = {"name": "theirs", "dataset": "nosuchmod_rt41r:factory", "examples": 2, "mode": "gen",
              "infer_s_per_example": 0.1}
    assert lacking_here(Suite.model_validate({"name": "mine", "datasets": [here]})) is None
    said = lacking_here(Suite.model_validate({"name": "worker-only", "datasets": [here, theirs]}))
    assert said is not None and "dataset 'theirs': plugin nosuchmod_rt41r:factory: no module 'nosuchmod_rt41r' here" in said
    assert "heldout-loss" not in said and "the others are scored" in said
    assert "`prefect worker start --pool frenzy`" in said and "`prefect deployment run evaluate-pending/evaluate-pending`" in said
