"""The `submit` flow's stages as Prefect tasks: the collaborator (`tasks.pipeline.drive.Stages`) the state machine
drives. Each method is one stage: it calls the stage's task (retries, artifacts, events are the task's) and turns
what came back into the record the transition takes."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prefect import get_client, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event
from prefect.futures import PrefectFuture
from prefect.settings import PREFECT_API_URL

from cluster.inventory import Cluster
from cluster.ledger import Allocation, LeaseKeeper, LeaseLost, Ledger, LedgerError
from flows import guardian
from flows.evaluate import evaluate_task
from flows.place import place
from flows.plan import plan_resources, plans_markdown
from flows.stragglers import stragglers_task
from flows.train import train_task
from tasks.artifactkey import run_key
from tasks.diagnosis.agent import config_from_env
from tasks.diagnosis.diagnose import Diagnosis, diagnose
from tasks.evaluation import warmstart
from tasks.evaluation.request import EvaluateRequest
from tasks.evaluation.suite import load_suite
from tasks.evaluation.summary import EvalSummary
from tasks.paths import path_like, place_key
from tasks.pipeline import attempt as at
from tasks.pipeline.evaluations import (
    EvalFailure,
    InFlowEvaluator,
    Verdict,
    api_outage_cause,
    collect_scores,
    crash_cause,
    lacking_here,
    rerun_line,
    retired_steps,
    scored,
    step_uri,
)
from tasks.pipeline.liveness import (
    NO_WORKER_S,
    Liveness,
    WorkerSeen,
    heartbeat_period,
    no_worker_words,
    process_gone,
    unattended_s,
    worth_reading,
)
from tasks.pipeline.outage import CommitTimes, Outages, commit_times
from tasks.pipeline.request import Recovery, SubmitRequest
from tasks.pipeline.rerun import Earlier
from tasks.pipeline.run import Run, TrainFailure, TrainOutcome
from tasks.pipeline.stopped import reached, trainer_ended
from tasks.pipeline.summary import committed_steps, run_record, run_report
from tasks.pipeline.watch import Controls, watch
from tasks.planning.calibration import load_observations
from tasks.planning.plans import ResourcePlan
from tasks.planning.request import PlanRequest
from tasks.report import RunReport, markdown, render_html
from tasks.stragglers.request import StragglerReport, StragglerRequest
from tasks.training.allocation import lost_cause, released_at_end
from tasks.training.elastic import replan_after_oom, tune_auto
from tasks.training.launch import TrainFailed, request_kill, request_stop

EVAL_DEPLOYMENT = "evaluate-checkpoint/evaluate-on-checkpoint"


def evaluation_mode(request: SubmitRequest, say: Callable[[str], None] = lambda _: None) -> str:
    """in-flow, deployment or off: `auto` is deployment when a Prefect server has the evaluate-on-checkpoint
    deployment (the ephemeral API runs no workers) and a worker polls its work pool, else in-flow. No worker polling
    the pool is said (`say`) at once: in `auto`, as the reason to evaluate in-flow; with `deployment`, as what the
    runs wait for, and what this submit does when none comes."""
    if request.evaluation in ("in-flow", "off"):
        return request.evaluation
    if request.evaluation == "deployment":
        if why := unattended_pool():
            say(f"{why}; the evaluation runs wait for one, and after {no_worker_s():.0f} s with none this submit "
                "evaluates the steps left itself")
        return "deployment"
    if not PREFECT_API_URL.value():
        return "in-flow"
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(EVAL_DEPLOYMENT)
    except Exception:  # noqa: BLE001 - no such deployment (or no server): evaluate here
        return "in-flow"
    if why := unattended_pool():
        say(f"{why}; evaluating in this run (in-flow) instead")
        return "in-flow"
    return "deployment"


def no_worker_s() -> float:
    """How long no worker may poll the evaluation pool before a waiting submit evaluates the steps left itself:
    `FRENZY_EVAL_NO_WORKER_S` when set, else NO_WORKER_S."""
    return float(os.environ.get("FRENZY_EVAL_NO_WORKER_S", NO_WORKER_S))


def pool_workers(client: Any, pool: Any, now: datetime) -> list[WorkerSeen] | None:
    """The workers of the work pool `pool` as of `now`; None where workers say nothing (no pool, a paused one, said
    apart; a push or managed pool, which has none)."""
    if pool is None or pool.is_paused or pool.type.endswith(":push") or pool.type.startswith("prefect:"):
        return None
    return [WorkerSeen(name=w.name, interval_s=w.heartbeat_interval_seconds,
                       beat_s=None if w.last_heartbeat_time is None else (now - w.last_heartbeat_time).total_seconds())
            for w in client.read_workers_for_work_pool(pool.name)]


def unattended_pool() -> str | None:
    """Why no worker would take the evaluation deployment's runs now (its pool has no live worker), with the fixes;
    None when one polls it, or the server cannot say (no server, no such deployment or pool)."""
    try:
        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name(EVAL_DEPLOYMENT)
            pool = client.read_work_pool(dep.work_pool_name) if dep.work_pool_name else None
            seen = pool_workers(client, pool, datetime.now(UTC))
    except Exception:  # noqa: BLE001 - nothing known: the wait names a late run as before
        return None
    if seen is None or unattended_s(seen, 0.0) is None:
        return None
    return no_worker_words(pool.name, seen)


def _watched(handle: _Future, controls: Controls, job: str, hang_s: float) -> LeaseLost | None:
    """`watch`; a lost lease is returned (the trainer has stopped by then) for the caller to say with the step."""
    try:
        watch(handle, controls, job, hang_s)
    except LeaseLost as err:
        return err
    return None


class _Future:
    """A submitted train task as the watch's Handle."""

    def __init__(self, fut: PrefectFuture) -> None:
        self.fut = fut

    def done(self) -> bool:
        # the task's thread, not its state on the server: that is an API call per poll (red team 41n B3)
        wrapped = getattr(self.fut, "wrapped_future", None)
        return wrapped.done() if wrapped is not None else self.fut.state.is_final()

    def wait(self, timeout_s: float | None) -> None:
        self.fut.wait(timeout=timeout_s)


STUCK_S = 180.0
"""An evaluation run PENDING this long was claimed by a worker and never started (its process stopped, or the worker
did): its worker is asked to end its process (Cancelling) and it is run again. One SCHEDULED this long waits for a
worker: said, once, with the fix. `FRENZY_EVAL_STUCK_S` sets another value (`stuck_s`)."""


def stuck_s() -> float:
    """How long an evaluation run may stay PENDING: `FRENZY_EVAL_STUCK_S` when set, else STUCK_S."""
    return float(os.environ.get("FRENZY_EVAL_STUCK_S", STUCK_S))

ORPHAN_S = 120.0
"""A committed step with neither a score nor an evaluation run this long after submit first looked for one (its commit
event reached the server, but no run was created): submit starts its run itself."""


class DeploymentGone(Exception):  # noqa: N818 - a condition, not a failure: the waiting submit evaluates in-flow
    """The evaluate-on-checkpoint deployment is not on the server (deleted while submit waited)."""

    fix = "`bash deployments/deploy.sh` deploys it again"


class NoWorker(DeploymentGone):
    """No worker has polled the deployment's work pool for `no_worker_s` while its runs waited, none running: the
    waiting submit evaluates the steps left in-flow. Their runs stay queued: a worker started later takes them, finds
    the steps scored (their lock, `reevaluate: false`) and evaluates nothing again."""

    fix = "their runs stay queued: a worker started later finds those steps scored and evaluates nothing again"


CANCEL_POLL_S = 10.0
"""How often a running submit asks the server whether its flow run was cancelled from the UI or API
(`FRENZY_CANCEL_POLL_S` sets another period)."""


def cancel_poll_s() -> float:
    """The period of the cancel poll: `FRENZY_CANCEL_POLL_S` when set, else CANCEL_POLL_S."""
    return float(os.environ.get("FRENZY_CANCEL_POLL_S", CANCEL_POLL_S))


START_TRIES = 5
"""How many polls (about 2 s apart, each after the Prefect client's own retries) a step's evaluation run is tried to be
started, or run again, while the API answers with an error (a server restarting answers 503); then that step's
evaluation is failed with the API's answer as its cause, and the wait goes on for the others (red team 41h N15)."""

QUIET_S = 300.0
"""An evaluation run RUNNING that has logged nothing this long (a stopped or stuck process: the evaluation logs each
piece of work it finishes) is named, once, with the command that shows its logs; it is still waited for."""


def _ready_ahead(device: str) -> threading.Thread:
    """In a daemon thread: import the evaluation stack (torch among it) into this process, then start the first
    evaluation's processes (`warmstart.start_next`). Called as an in-flow run's training starts, so that the first
    checkpoint's evaluation begins when it commits rather than with seconds of imports (importing it again later
    waits for this thread's import to finish)."""

    def ready() -> None:
        import tasks.evaluation.record  # noqa: F401

        warmstart.start_next(device)

    t = threading.Thread(target=ready, name="evaluation-ahead", daemon=True)
    t.start()
    return t


class TriggeredEvaluations:
    """The evaluate-on-checkpoint runs that the commits under `root` triggered since `since`, as the server sees
    them: which steps' newest run ended without a score (and how), and a way to run a step again. Says what it waits
    for, once a minute."""

    def __init__(self, root: str, since: datetime, warn: Callable[[str], None],
                 info: Callable[[str], None] = lambda _: None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC), earlier: frozenset[int] = frozenset(),
                 waited: frozenset[int] | None = None, outages: Outages | None = None,
                 committed_at: Callable[[], CommitTimes] = CommitTimes, watched: datetime | None = None) -> None:
        """`earlier`: steps an earlier invocation committed (a resumed run): their runs count from any time.
        `waited`: the steps the submit waits for (None: every step with a run); the once-a-minute line names only
        these (red team 41l D1: it listed `step 40 Submitting`, a step retention had removed and that was not
        waited for). `outages`: when the API was unreachable (shared with the training's polls), and
        `committed_at`: when each step committed (epoch seconds): a step committed before an outage ended with no run
        is started as soon as the server answers again. `watched`: since when the pool's workers have been watched
        (the submit's start, where no worker was said first): the time with none counts from there."""
        self.root, self.since, self.warn, self.info, self.now = root.rstrip("/"), since, warn, info, now
        self.outages, self.committed_at = outages or Outages(slack_s=ORPHAN_S), committed_at
        self.lost: dict[int, str] = {}
        """Steps whose commit event was lost in a server outage: why, as said when their run was started."""
        self.waited = waited
        self.earlier, self.key = earlier, place_key(root)
        self.params: dict[int, dict] = {}
        self.read_ok = False
        self.unseen: dict[int, datetime] = {}
        self.warned = False
        self.pool_said, self.pool, self.gone_said = False, "", False
        self.balked: dict[int, int] = {}
        """Per step: the API errors so far starting its run (reset when one starts)."""
        self.unstarted: dict[int, str] = {}
        """Steps whose run could not be started START_TRIES times: their evaluation failed, with the API's answer."""
        self.completed: set[int] = set()
        """Steps whose newest run completed (it wrote the scores its own parameters asked for)."""
        self.said_at = 0.0
        self.late_said: set[int] = set()
        self.quiet_said: set[int] = set()
        self.quiet: dict[int, tuple[float, float]] = {}
        """Per RUNNING step: seconds since it started running, seconds since its newest log line (or its start)."""
        self.reaped: dict[Any, tuple[str, datetime]] = {}
        """Runs found stuck PENDING and set Cancelling (so their worker kills the process): why, and when."""
        self.period: float | None = None
        """The heartbeat period of the deployment's runs (None: they send none); `_gone` reads their heartbeats."""
        self.newest: dict[int, Any] = {}
        """Per step: its newest run, as last read."""
        self.beats: dict[Any, tuple[datetime, datetime | None]] = {}
        """Per quiet RUNNING run: when its heartbeats were last read, and its newest heartbeat then."""
        self.watched = watched
        """Since when the pool's workers have been watched (their first read, unless given)."""
        self.unattended: tuple[float, str] | None = None
        """How long no worker has polled the pool, and why (with the fixes); None while one does (or none can say)."""
        self.unattended_said = False

    def ended_without_score(self) -> dict[int, tuple[Verdict, str]]:
        """Steps whose newest run ended failed or crashed; {} (and one warning) when the server cannot say."""
        from prefect.exceptions import ObjectNotFound

        try:
            return {**self._ended(), **{s: ("failed", why) for s, why in self.unstarted.items()}}
        except ObjectNotFound as err:
            raise DeploymentGone(f"the {EVAL_DEPLOYMENT} deployment is not on the server (deleted?)") from err
        except DeploymentGone:
            raise
        except Exception as err:  # noqa: BLE001 - the scores still arrive; only the early failure report is lost
            self.outages.failed(self.now().timestamp())
            if not self.warned:
                self.warn(f"cannot read the evaluation runs' states ({type(err).__name__}: {err}); waiting for the scores alone")
                self.warned = True
            return {s: ("failed", why) for s, why in self.unstarted.items()}

    def _ended(self) -> dict[int, tuple[Verdict, str]]:
        from prefect.client.schemas.filters import (
            DeploymentFilter,
            DeploymentFilterId,
            FlowRunFilter,
            FlowRunFilterExpectedStartTime,
        )
        from prefect.client.schemas.sorting import FlowRunSort

        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name(EVAL_DEPLOYMENT)
            self._attended(client, self._paused(client, dep))
            self.period = heartbeat_period((dep.job_variables or {}).get("env") or {})
            after = None if self.earlier else FlowRunFilterExpectedStartTime(after_=self.since)
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
                flow_run_filter=FlowRunFilter(expected_start_time=after), sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                limit=200)  # the server's most per page
            newest: dict[int, Any] = {}
            for fr in sorted(runs, key=lambda fr: fr.created or self.since):
                uri = str((fr.parameters.get("request") or {}).get("uri", ""))
                m = re.fullmatch(re.escape(self.key) + r"/step_(\d+)", place_key(uri)) if uri else None
                if m and (int(m.group(1)) in self.earlier or (fr.expected_start_time or self.since) >= self.since):
                    newest[int(m.group(1))] = fr
                    self.params[int(m.group(1))] = fr.parameters
            self.completed = {step for step, fr in newest.items() if fr.state is not None and fr.state.type.value == "COMPLETED"}
            out = {step: v for step, fr in newest.items() if (v := self._verdict(client, step, fr)) is not None}
            self._crash_unreaped(client)
        self.newest = newest
        self._fall_back(newest)
        self.read_ok = True
        self.outages.answered(self.now().timestamp())
        self._say(newest)
        return out

    def _verdict(self, client: Any, step: int, fr: Any) -> tuple[Verdict, str] | None:
        """How the run `fr` of `step` ended without a score, or None while it may still give one."""
        st = fr.state
        if st is None:
            return None
        waited = (self.now() - st.timestamp).total_seconds()
        if fr.id in self.reaped:  # stuck PENDING: its Cancelling and Cancelled are this submit's, not a person's
            return "crashed", self.reaped[fr.id][0]
        if st.type.value in ("FAILED", "CRASHED", "CANCELLED"):  # a cancelled one (a person's stop) is not rerun
            if st.type.value == "CRASHED":  # a killed evaluation process said so, not as Prefect's guess
                return "crashed", crash_cause(st.message, fr.name)
            if st.type.value == "FAILED" and (outage := api_outage_cause(st.message, fr.name)):  # worth one more run
                return "crashed", outage
            return "failed", st.message or f"the run {fr.name} ended {st.name}"
        if st.type.value == "PENDING" and waited > stuck_s():  # claimed, and its process stopped, or its worker
            return "crashed", self._reap(client, fr, waited)
        if (st.type.value == "SCHEDULED" and waited > stuck_s() and step not in self.late_said and not self.pool_said
                and self.unattended is None):  # no worker at all is said once, with the pool's workers
            self.late_said.add(step)
            self.warn(f"the evaluation run of step {step} ({fr.name}) has waited {waited:.0f} s for a worker: "
                      + self._no_worker_hint())
        if st.type.value == "RUNNING":
            self._watch_running(client, step, fr)
            if (why := self._gone(client, step, fr)) is not None:
                return "crashed", why
        return None

    def _reap(self, client: Any, fr: Any, waited: float) -> str:
        """Set the stuck PENDING run `fr` Cancelling: its worker (Prefect 3.8 cancels a never-started run itself)
        kills its process, which else lingers, stopped, on the worker (red team 41n C5); the cause."""
        from prefect.states import Cancelling

        why = (f"the evaluation run {fr.name} was claimed by a worker and never started ({waited:.0f} s PENDING, more "
               f"than FRENZY_EVAL_STUCK_S={stuck_s():g}: its process is stopped or stuck, or its worker stopped); its "
               "worker was asked to end it")
        client.set_flow_run_state(fr.id, Cancelling(message=why), force=True)
        self.reaped[fr.id] = (why, self.now())
        return why

    def _gone(self, client: Any, step: int, fr: Any) -> str | None:
        """For a RUNNING run quiet longer than `late_after` (its logs read by `_watch_running`), its newest heartbeat,
        read at most once a period: when none came for as long either, its process is gone (killed with its worker:
        red team 41q G3) and the run is marked Crashed with the cause, which is returned (it is run again once)."""
        from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter
        from prefect.states import Crashed

        running_s, quiet_s = self.quiet[step]
        now, (read_at, _) = self.now(), self.beats.get(fr.id, (None, None))
        if not worth_reading(quiet_s, self.period, None if read_at is None else (now - read_at).total_seconds()):
            return None
        since = fr.state.timestamp - timedelta(seconds=60)  # the worker's clock may be behind the server's
        page = client.read_events(EventFilter(
            occurred=EventOccurredFilter(since=since, until=now + timedelta(hours=1)),
            event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{fr.id}"])), limit=1)
        beat = page.events[0].occurred if page.events else None
        self.beats[fr.id] = (now, beat)
        seen = Liveness(running_s=running_s, quiet_s=quiet_s, beat_s=None if beat is None else (now - beat).total_seconds())
        if (why := process_gone(seen, self.period, fr.name, str(fr.id))) is not None:
            client.set_flow_run_state(fr.id, Crashed(message=why), force=True)
        return why

    def left(self, steps: list[int]) -> str:
        """The runs of `steps` as last read, with their states: `step 20: run NAME (ID) Scheduled` (or no run)."""
        return "; ".join(f"step {s}: run {fr.name} ({fr.id}) {self._state_words(s, fr).removeprefix(f'step {s} ')}"
                         if (fr := self.newest.get(s)) is not None else f"step {s}: no evaluation run" for s in steps)

    def _crash_unreaped(self, client: Any) -> None:
        """A run set Cancelling as stuck that no worker ended within `stuck_s` (its worker stopped: nothing can end
        its process from here) is marked Crashed, not left Cancelling in the UI."""
        from prefect.states import Crashed

        for rid, (why, since) in list(self.reaped.items()):
            if (self.now() - since).total_seconds() <= stuck_s():
                continue
            st = client.read_flow_run(rid).state
            if st is not None and st.type.value == "CANCELLING":
                client.set_flow_run_state(rid, Crashed(message=why + "; no worker ended it (is the worker running?)"),
                                          force=True)
            del self.reaped[rid]

    def _no_worker_hint(self) -> str:
        """What to check when no worker takes the runs: the deployment's pool, or, for a deployment with none (served
        by a process, or its pool deleted: a worker makes a new pool the deployment is not bound to), both causes."""
        if self.pool:
            return f"is one running on the deployment's work pool? (`prefect worker start --pool {self.pool}`)"
        return (f"the deployment {EVAL_DEPLOYMENT} has no work pool: if a process serves it, is that process running? "
                "if its work pool was deleted, deploy it again (`bash deployments/deploy.sh`)")

    def _attended(self, client: Any, pool: Any) -> None:
        """Whether a worker polls the pool `pool` (None: paused, deleted, or not made yet: said apart): none alive
        (none ever started, or every one missed three heartbeats) sets `unattended`."""
        now = self.now()
        self.watched = self.watched or now
        seen = pool_workers(client, pool, now)
        gap = None if seen is None else unattended_s(seen, (now - self.watched).total_seconds())
        self.unattended = None if gap is None else (gap, no_worker_words(pool.name, seen or []))

    def _fall_back(self, newest: dict[int, Any]) -> None:
        """NoWorker when no worker has polled the pool for `no_worker_s` and none of the runs waited for is taken
        (RUNNING, PENDING or CANCELLING: its process may still give a score, and is waited for as before); until
        then, no worker is said once (again should it recur after one polled), with the fixes."""
        if self.unattended is None:
            self.unattended_said = False
            return
        gap, words = self.unattended
        taken = [s for s, fr in newest.items() if (self.waited is None or s in self.waited) and fr.state is not None
                 and fr.state.type.value in ("RUNNING", "PENDING", "CANCELLING")]
        if gap >= no_worker_s() and not taken:
            raise NoWorker(f"{words}; none for {gap:.0f} s")
        if not self.unattended_said:
            self.unattended_said = True
            self.warn(f"{words}; the evaluation runs wait for one, and after {no_worker_s():.0f} s with none this "
                      "submit evaluates the steps left itself")

    def _paused(self, client: Any, dep: Any) -> Any:
        """Say when the deployment or its work pool is paused (its runs wait until it is resumed), with the fix, and
        when the pool it was bound to is deleted while submit waits (no worker takes its runs any more). Read at every
        poll: a pause said once may be lifted, or turn into a deletion."""
        from prefect.exceptions import ObjectNotFound

        had, self.pool = self.pool, dep.work_pool_name or ""
        if had and not self.pool and not self.gone_said:
            self.gone_said = True
            self.warn(f"the work pool {had} was deleted: the deployment {EVAL_DEPLOYMENT} has no work pool now and no "
                      "worker takes its runs; deploy it again (`bash deployments/deploy.sh`)")
        try:
            pool = client.read_work_pool(self.pool) if self.pool else None
        except ObjectNotFound:  # a pool not made yet: the first worker makes it (not the deployment gone)
            pool = None
        paused = bool(dep.paused or (pool is not None and pool.is_paused))
        if paused and not self.pool_said:
            what, fix = ((f"the work pool {pool.name}", f"prefect work-pool resume {pool.name}") if pool is not None
                         and pool.is_paused else (f"the deployment {EVAL_DEPLOYMENT}", f"prefect deployment resume {EVAL_DEPLOYMENT}"))
            self.warn(f"{what} is paused: the evaluation runs wait until it is resumed (`{fix}`)")
        self.pool_said = paused or self.gone_said
        return None if dep.paused else pool

    def other_suite(self, unscored: set[int], suite: str, history_dir: str) -> list[tuple[int, str]]:
        """The steps of `unscored` whose newest run completed for another suite or history directory (the job was
        resubmitted with a new suite while the old runs were queued): [(step, the suite that run evaluated)]. Each
        needs a run of its own with `suite`; once started, that run is the newest and the step leaves this list."""
        def same(a: str, b: str) -> bool:
            return (place_key(a) == place_key(b)) if path_like(a) and path_like(b) else a == b

        out = []
        for step in sorted(unscored & self.completed):
            req = self.params.get(step, {}).get("request") or {}
            theirs, where = str(req.get("suite", "")), str(req.get("history_dir", ""))
            if not same(theirs, suite) or (where and not same(where, history_dir)):
                out.append((step, theirs if not same(theirs, suite) else f"{theirs} into {where}"))
        return out

    def orphans(self, unscored: set[int]) -> list[int]:
        """The steps of `unscored` with no evaluation run: at once, those committed before a server outage ended (the
        server is answering again and has no run for them: their commit events were lost with it); the others once
        they have had none for ORPHAN_S since first seen without one (their commit event made no run, the last
        resort). [] while the server's runs cannot be read."""
        if not self.read_ok or self.outages.down_since is not None:
            return []
        now = self.now()
        unscored = unscored - set(self.unstarted)
        for step in unscored - set(self.params):
            self.unseen.setdefault(step, now)
        runless = {s for s in unscored if s not in self.params}
        return sorted({s for s, t in self.unseen.items() if s in runless and (now - t).total_seconds() >= ORPHAN_S}
                      | self._lost(runless))

    def _lost(self, runless: set[int]) -> set[int]:
        """The steps of `runless` committed before an outage of the server ended; each noted in `lost` with why."""
        at = self.committed_at() if self.outages.seen else CommitTimes()
        for step in sorted(runless - set(self.lost)):
            if (t := at.of(step)) is not None and (o := self.outages.covering(t)) is not None:
                self.lost[step] = (f"its commit event was lost: the Prefect server was unreachable {o.words()} and "
                                   "has no evaluation run for it")
        return runless & set(self.lost)

    def _watch_running(self, client: Any, step: int, fr: Any) -> None:
        """How long the RUNNING run `fr` has run and been quiet (no log line: its process may be stopped); a run
        quiet for QUIET_S is named once, with the command that shows its logs."""
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
        from prefect.client.schemas.sorting import LogSort

        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id])), limit=1,
                                sort=LogSort.TIMESTAMP_DESC)
        started = fr.state.timestamp
        last = max([started, *(log.timestamp for log in logs)])
        running_s, quiet_s = ((self.now() - t).total_seconds() for t in (started, last))
        self.quiet[step] = (running_s, quiet_s)
        if quiet_s > QUIET_S and step not in self.quiet_said:
            self.quiet_said.add(step)
            self.warn(f"the evaluation run of step {step} ({fr.name}) has been Running {running_s:.0f} s and logged "
                      f"nothing for {quiet_s:.0f} s: is its process stopped or stuck? see `prefect flow-run logs "
                      f"{fr.id}` (it is waited for until eval_timeout_s; cancel it with `prefect flow-run cancel "
                      f"{fr.id}`)")

    def _say(self, newest: dict[int, Any], every_s: float = 60.0) -> None:
        """Once a minute, the states of the runs waited for."""
        now = time.monotonic()
        newest = {s: fr for s, fr in newest.items() if self.waited is None or s in self.waited}
        if now - self.said_at < every_s or not newest:
            return
        self.said_at = now
        self.info(f"waiting for the evaluation runs: {', '.join(self._state_words(s, fr) for s, fr in sorted(newest.items()))}")

    def _state_words(self, step: int, fr: Any) -> str:
        """`step 20 Running` with, for a RUNNING run, how long it ran and how long it has been quiet."""
        words = f"step {step} {fr.state.name if fr.state else '?'}"
        if step in self.lost:
            words += " (started by submit: its commit event was lost in a server outage)"
        if fr.state is None or fr.state.type.value != "RUNNING" or step not in self.quiet:
            return words
        running_s, quiet_s = self.quiet[step]
        return f"{words} {running_s:.0f} s (last log {quiet_s:.0f} s ago)"

    def rerun(self, step: int) -> bool:
        """Start a run of `step` with its newest run's parameters: True when the server made it. An API error (a server
        restarting answers 503) is this step's alone: said, and tried again at the next poll (the caller asks again);
        after START_TRIES the step's evaluation is failed with the API's answer (`unstarted`)."""
        from prefect.deployments import run_deployment
        from prefect.exceptions import ObjectNotFound

        try:
            run_deployment(EVAL_DEPLOYMENT, parameters=self.params[step], timeout=0, as_subflow=False)
        except ObjectNotFound as err:
            raise DeploymentGone(f"the {EVAL_DEPLOYMENT} deployment is not on the server (deleted?)") from err
        except Exception as err:  # noqa: BLE001 - the API failing one start fails that step's evaluation, not the run
            n = self.balked[step] = self.balked.get(step, 0) + 1
            answer = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:400]
            if n >= START_TRIES:
                self.unstarted[step] = (f"its evaluation run could not be started: the Prefect API answered {answer} "
                                        f"{n} times; evaluate it later with `frenzy evaluate {step_uri(self.root, step)}`")
            else:
                self.warn(f"the evaluation run of step {step} could not be started ({answer}): trying again "
                          f"({n}/{START_TRIES})")
            return False
        self.balked.pop(step, None)
        return True

    def start(self, step: int, suite: str, history_dir: str) -> None:
        """Run the evaluation of `step` that no commit event started (an earlier invocation's, stopped first). When
        the API fails it, the step is left as it was, so that the next poll starts it again."""
        had = self.params.get(step)
        self.params[step] = {"request": {"uri": step_uri(self.key, step), "suite": suite, "history_dir": history_dir,
                                         "reevaluate": False}}
        if not self.rerun(step):
            if had is None:
                del self.params[step]
            else:
                self.params[step] = had


class FlowStages:
    """The stages of one `submit` run, as Prefect tasks on this worker."""

    def __init__(self, request: SubmitRequest, ledger: Ledger, cluster: Cluster) -> None:
        self.request, self.ledger, self.cluster = request, ledger, cluster
        trainer_ended(request.job.name, None)  # an earlier submit of this name in this process (a notebook's) is over
        self.log = get_run_logger()
        self.started = datetime.now(UTC)
        self.device = "cpu"
        self._cancel_checked = 0.0
        self.outages = Outages(slack_s=ORPHAN_S)
        """When this run found the Prefect API unreachable (its polls while training and waiting)."""
        self.ledger_lost = ""
        """Set when the ledger file vanished while this run used it (red team 41g S13): said once, and nothing more
        is written to that path (writing would create an empty ledger there, silently)."""

    def ledger_gone(self, run: Run) -> bool:
        """Whether the ledger file this run holds its allocation in was deleted or replaced; said once, as a warning
        naming the path and the allocation."""
        if not self.ledger_lost and (why := self.ledger.vanished()):
            held = f"allocation {run.attempt.allocation.id} of {run.job}" if run.attempt else f"the records of {run.job}"
            self.ledger_lost = (f"{why}: {held} is no longer recorded (another job may be placed on its GPUs); "
                                "nothing was recreated there: make the ledger again with `frenzy cluster init --ledger "
                                f"{self.ledger.url.split(':///', 1)[-1]} --cluster ...` before the next submit")
            self.log.warning(self.ledger_lost)
        return bool(self.ledger_lost)

    def cancelled(self) -> None:
        """A cancel of this flow run from the Prefect UI or API. A run a worker started gets SIGTERM from it; one a
        CLI or a notebook started gets nothing, so its state is read here (at most every CANCEL_POLL_S) and the run
        ends as SIGTERM ends it: the trainer commits its step, the GPUs are released, the one line is printed."""
        now = time.monotonic()
        if now - self._cancel_checked < cancel_poll_s():
            return
        self._cancel_checked = now
        import signal

        from prefect.exceptions import TerminationSignal
        from prefect.runtime import flow_run

        try:
            with get_client(sync_client=True) as client:
                fr = client.read_flow_run(flow_run.get_id())
        except Exception:  # noqa: BLE001 - the server unreachable for a moment: the next poll asks again
            self.outages.failed(time.time())
            return
        self.outages.answered(time.time())
        if fr.deployment_id is not None:  # a worker runs it: its cancellation arrives as SIGTERM, with Prefect's intent
            return
        state = fr.state
        if state is not None and state.type.value in ("CANCELLING", "CANCELLED"):
            self.log.warning("this run was cancelled from the Prefect UI or API: stopping (the trainer commits its "
                             "step first)")
            raise TerminationSignal(signal=signal.SIGTERM)

    def reach(self, phase: str) -> None:
        """The run is now in `phase` (tasks/pipeline/stopped.py's PHASES): what a stop's line and, should this process
        be killed outright, the guardian's Crashed message say about it."""
        reached(self.request.job.name, phase)
        guardian.tell_phase(phase)

    def plan(self, run: Run) -> tuple[list[ResourcePlan], str]:
        self.reach("planning")
        job, spec = self.request.job, self.request.cluster_spec
        plans = plan_resources(PlanRequest(job=job, cluster=spec, rank_by=self.request.rank_by, top=1000),
                               load_observations(), self.cluster)
        runnable = [p for p in plans if p.layout.pp == 1]  # the trainer runs data x tensor parallel layouts
        if not runnable:
            raise at.PipelineError(f"{job.name}: every plan needs pipeline parallelism (pp > 1), which the trainer "
                                   "does not run yet; add GPUs with more memory or enable recompute / zero_stage 3")
        create_markdown_artifact(plans_markdown(PlanRequest(job=job, cluster=spec), runnable[:10]),
                                 key=run_key("plans", job.name, job.training.checkpoint.uri or ""),
                                 description="MARP resource plans, best first")
        return runnable, self.cluster.name

    def place(self, run: Run) -> Allocation:
        self.reach("queued")
        r = self.request
        if r.executor != "local":  # nothing is placed on a node Ray already knows is gone
            from cluster.ray_health import sync_ledger

            sync_ledger(self.ledger, None if r.executor == "ray" else r.executor)
        alloc = place(r.job.name, run.candidates, ledger_url=r.ledger, timeout_s=r.max_wait_s, lease_s=r.lease_s,
                      precision=r.job.training.precision, steps=r.job.training.steps)
        chosen = run.candidates[alloc.plan_index]
        self.log.info("placed on %s: plan %d (%d x %s, %s)", ", ".join(f"{n.node}{n.gpu_indices}" for n in alloc.nodes),
                      run.plans.index(chosen) + 1 if chosen in run.plans else alloc.plan_index + 1, chosen.gpus,
                      chosen.gpu_type, chosen.layout.label())
        return alloc

    def log_size(self, run: Run) -> int:
        log = Path(run.run_dir) / "train.log"
        return log.stat().st_size if log.exists() else 0

    def train(self, run: Run) -> TrainOutcome:
        assert run.attempt is not None
        self.reach("training")
        a, r, run_dir = run.attempt, self.request, Path(run.run_dir)
        with LeaseKeeper(self.ledger, a.allocation.id, r.lease_s) as keeper:
            if r.executor != "local":  # every node must see the files this run writes, before it trains
                at.check_shared_paths(r, a.allocation, run_dir)
            treq = at.training_request(r, a.allocation, a.plan, run_dir, r.suite_spec if run.suite else "")
            # the trainer renews the allocation too: its GPUs stay allocated while it uses them (red team 41i N21)
            from tasks.training.request import AllocationHold  # it imports torch: only once a job trains

            treq.allocation = AllocationHold(ledger=self.ledger.url, allocation_id=a.allocation.id, lease_s=r.lease_s)
            tune_auto(treq.job, self.ledger, a.plan, a.allocation, len(run.recoveries), self.log)
            self.log.info("evaluation: %s%s", run.mode, f" on suite {run.suite}" if run.suite else "")
            self.device = "cuda" if treq.gpu_indices else "cpu"  # where evaluations run in-flow (also as a fallback)
            if (on_cpu := at.cpu_fallback(r, treq, a.allocation)) is not None:
                self.log.warning("%s", on_cpu)
            ev = self._evaluator(run, self.device) if run.mode == "in-flow" else None
            if ev is not None and ev.ahead is not None:  # the first evaluation's imports and processes, made ready now
                _ready_ahead(self.device)
            # the task releases it as the trainer ends, before its final state goes to the API (red team 41n B3);
            # not while this process still evaluates the last checkpoints on its GPUs (in-flow on cuda)
            treq.allocation.release_at_end = ev is None or self.device == "cpu"
            # in-flow, commit events would have each step evaluated twice: only the deployment mode announces them
            earlier = Earlier(run_dir)  # read before the trainer replaces it
            handle = _Future(fut := train_task.submit(treq.model_copy(update={"announce_commits": run.mode == "deployment"})))
            progress = run_dir / "progress.jsonl"
            controls = Controls(progress_size=lambda: progress.stat().st_size if progress.exists() else 0,
                                kill=lambda why: (self.log.error("%s: killing the trainer", why),
                                                  request_kill(run_dir, why)),
                                stop=lambda: request_stop(run_dir),
                                lease_lost=lambda: keeper.lost.is_set() and not released_at_end(a.allocation.id),
                                lost_cause=lambda: lost_cause(self.ledger, self.ledger.url, a.allocation.id,
                                                              r.lease_s, "its trainer"),
                                on_poll=lambda: (self.cancelled(), self.ledger_gone(run),
                                                 ev.catch_up(lambda: not handle.done()) if ev else None))
            lost = _watched(handle, controls, r.job.name, r.hang_s)
            try:
                result = fut.result()
            # what was scored before the failure stays scored; the trainer's own account of a lost allocation (it
            # stops on it itself: tasks/training/allocation.py) goes before the watch's
            except TrainFailed as err:
                return TrainOutcome(failure=TrainFailure(message=str(err), returncode=err.returncode,
                                                         log_tail=err.log_tail),
                                    evaluations=ev.summaries() if ev else [],
                                    evaluation_failures=ev.failures() if ev else [])
            if lost is not None:
                raise LeaseLost(f"{lost} (step {result.final_step}); rerun the same command to place the job again and "
                                f"resume from step {result.final_step}")
            if (kept := earlier.carried_over(result)) is not result:
                self.log.info("nothing left to train: step %d was committed by an earlier run of %s; its result "
                              "is kept", result.final_step, run.job)
                result = kept
            if ev is not None:  # the final checkpoint, and any commit the watch had not reached
                ev.catch_up()
                warmstart.discard_precursor()  # none is left to evaluate: what was started ahead is not needed
            return TrainOutcome(result=result, evaluations=ev.summaries() if ev else [],
                                evaluation_failures=ev.failures() if ev else [])

    def _evaluator(self, run: Run, device: str, reevaluate: bool = True) -> InFlowEvaluator:
        r = self.request
        return InFlowEvaluator(r.job.training.checkpoint.uri, r.history_dir, run.job, run.suite,
                               evaluate=lambda uri: evaluate_task(EvaluateRequest(
                                   uri=uri, suite=r.suite_spec, device=device, executor=r.executor,
                                   history_dir=r.history_dir, reevaluate=reevaluate)),
                               warn=self.log.warning,
                               ahead=(lambda: warmstart.start_next(device)) if r.executor == "local" else None)

    def release(self, run: Run) -> None:
        assert run.attempt is not None
        if self.ledger_gone(run):  # a release would make an empty ledger at the path and say the GPUs came back
            return
        # the ledger's own call, not a Prefect task: a task run is created through the API, and while a restarting
        # server comes back the client's retries held the GPUs of a finished run for 71 s (red team 41m R1)
        try:
            aid = run.attempt.allocation.id
            if released_at_end(aid):  # the train task gave it back as the trainer ended (or said it was freed)
                self.ledger.release(aid, by_holder=True)
                return
            if self.ledger.allocation(aid).state in ("released", "expired"):  # freed before: lapsed, or released
                self.log.warning("allocation %s had been %s before this run released it: nothing left to release",
                                 aid, self.ledger.how_ended(aid))
                return
            started = self.ledger.release(aid, by_holder=True)  # its trainer has ended
            self.log.info("released allocation %s%s", run.attempt.allocation.id,
                          f"; {len(started)} queued job(s) started on its GPUs" if started else "")
        except LedgerError as err:  # the lease runs out anyway; say so rather than hide the original error
            self.log.error("could not release allocation %s (%s); its lease expires in %.0f s",
                           run.attempt.allocation.id, err, self.request.lease_s)

    def diagnose(self, run: Run, failure: TrainFailure) -> Diagnosis:
        offset = run.attempt.log_offset if run.attempt else 0
        return diagnose_task(run.job, str(Path(run.run_dir) / "train.log"), offset)

    def announce(self, run: Run, recovery: Recovery) -> None:
        d, act, job = recovery.diagnosis, recovery.action, run.job
        create_markdown_artifact(
            f"## Training failure of `{job}`\n\n| | |\n|---|---|\n| type | {d.type} ({d.category}) |\n"
            f"| where | rank {d.rank if d.rank is not None else '?'}, node {d.node or '?'} |\n"
            f"| root cause | `{(d.root_cause_line or '-').replace('|', '/')[:300]}` (line {d.line_no}) |\n"
            f"| symptoms | {len(d.evidence)} other error lines |\n| action | **{act.kind}**"
            f"{' + node check' if act.node_check else ''}: {act.reason} |\n",
            key=run_key("diagnosis", job, run.request.job.training.checkpoint.uri or ""),
            description=f"diagnosis of a training failure of {job}")
        emit_event(event="frenzy.training.failed", resource={"prefect.resource.id": f"frenzy.job.{job}"},
                   payload={"type": d.type, "category": d.category, "rank": d.rank, "node": d.node,
                            "root_cause_line": d.root_cause_line, "action": act.kind, "reason": act.reason,
                            "restarts_done": len(run.recoveries)})
        if act.kind != "stop":
            self.log.warning("recovery %d/%d: %s -> %s", len(run.recoveries) + 1, self.request.max_restarts, d.type,
                             act.kind)

    def check_nodes(self, run: Run) -> None:
        assert run.attempt is not None
        at.check_allocation_nodes(self.ledger, run.attempt.allocation, self.log, self.request.executor)

    def replan(self, run: Run, diagnosis: Diagnosis) -> list[ResourcePlan]:
        assert run.attempt is not None
        at.note_oom(self.request.job, run.attempt.plan, diagnosis, self.cluster)
        return replan_after_oom(self.request.job, self.cluster, self.request.rank_by, load_observations())

    def evaluations(self, run: Run) -> tuple[list[EvalSummary], list[EvalFailure]]:
        self.reach("evaluating")
        if run.mode != "deployment" or run.result is None:  # in-flow: scored, or failed, as training ran
            return run.evaluations, run.evaluation_failures
        r, res, root = self.request, run.result, run.request.job.training.checkpoint.uri or ""
        mine = {c.step for c in res.checkpoints if res.resumed_from_step is None or c.step > res.resumed_from_step}
        earlier = {s for s in committed_steps(root) if s <= res.final_step} - mine  # a resumed run's earlier steps
        read = lambda: scored(r.history_dir, run.job, run.suite, root)  # noqa: E731
        gone = retired_steps(root, sorted(mine | earlier), read())
        for g in gone:  # not waited for, never started, not a failure
            self.log.info("%s: not evaluated (not a failure of the run)", g.why)
        steps = sorted((mine | earlier) - {g.step for g in gone})
        self.log.info("waiting for the evaluate-on-checkpoint runs of steps %s", steps)
        triggered = TriggeredEvaluations(root, self.started, self.log.warning, self.log.info, earlier=frozenset(earlier),
                                         waited=frozenset(steps), outages=self.outages,
                                         committed_at=lambda: commit_times(Path(run.run_dir) / "progress.jsonl"),
                                         watched=self.started)  # where no worker was said first (evaluation_mode)

        causes: dict[int, str] = {}  # why each step's newest run ended without a score, as said when it is rerun

        def runs() -> dict[int, tuple[Verdict, str]]:
            self.cancelled()
            ended = triggered.ended_without_score()
            causes.update({step: why for step, (_, why) in ended.items()})
            unscored = set(steps) - set(read())
            for step in triggered.orphans(unscored):  # its commit made no run (or was stopped first)
                if step in triggered.lost:
                    self.log.warning("step %d: %s: starting its evaluation run now", step, triggered.lost[step])
                else:
                    self.log.info("step %d has no score and no evaluation run: starting one", step)
                triggered.start(step, r.suite_spec, r.history_dir)
            for step, theirs in triggered.other_suite(unscored, r.suite_spec, r.history_dir):
                self.log.warning("the evaluation run of step %d evaluated %s (an earlier submit's), not %s: starting "
                                 "one with this suite", step, theirs, r.suite_spec)
                triggered.start(step, r.suite_spec, r.history_dir)
            return ended

        def again(step: int) -> bool:
            if step not in triggered.balked:
                self.log.warning("%s", rerun_line(step, causes.get(step, "")))
            return triggered.rerun(step)

        try:
            triggered.ended_without_score()  # which steps have a run: an earlier invocation's without one start now
            triggered.unseen = dict.fromkeys(earlier, datetime.min.replace(tzinfo=UTC))
            found, failures = collect_scores(read, steps, r.eval_timeout_s, runs=runs, rerun=again)
        except DeploymentGone as gone:
            self.log.warning("%s: evaluating the steps left in this run (in-flow); %s", gone, gone.fix)
            if lacks := lacking_here(load_suite(r.suite_spec)):  # a plugin only the workers had (red team 41r)
                self.log.warning("%s", lacks)
            ev = self._evaluator(run, self.device, reevaluate=False)  # a step a late worker is scoring: its result
            ev.catch_up()
            found, failures = {s: ev.done[s] for s in steps if s in ev.done}, [f for f in ev.failures() if f.step in steps]
        for f in failures:
            self.log.error("evaluation of step %d failed: %s", f.step, f.cause)
        if missing := sorted(set(steps) - set(found) - {f.step for f in failures}):
            self.log.warning("no score for step(s) %s within %.0f s of training's end; %s", missing, r.eval_timeout_s,
                             triggered.left(missing))
        return [found[s] for s in sorted(found)], failures

    def analyse(self, run: Run) -> StragglerReport | None:
        trace = run.result.trace if run.result else None
        if not trace:
            return None
        try:  # the job trained: a trace the analysis cannot use is logged, not raised
            return stragglers_task(StragglerRequest(trace=trace))
        except Exception as err:  # noqa: BLE001
            self.log.warning("straggler analysis of %s failed: %s", trace, err)
            return None

    def report(self, run: Run) -> str:
        path = report_task(run_report(run), str(Path(run.run_dir) / "report.html"),
                           run.request.job.training.checkpoint.uri or "")
        self.log.info("report: %s", path)
        return path

    def record(self, run: Run) -> None:
        if not self.ledger_gone(run):
            self.ledger.record_run(run_record(run))
        emit_event(event=f"frenzy.run.{run.stage.value}", resource={"prefect.resource.id": f"frenzy.job.{run.job}"},
                   payload={"stage": run.stage.value, "at_s": run.visits[-1].at_s if run.visits else 0.0,
                            "run_dir": run.run_dir, "checkpoint_root": run.request.job.training.checkpoint.uri})


@task(name="diagnose", task_run_name="diagnose-{job}")
def diagnose_task(job: str, log: str, offset: int) -> Diagnosis:
    """Diagnose the failed attempt's part of the training log (the LLM agent only where one is configured)."""
    with open(log, "rb") as f:
        f.seek(offset)
        d = diagnose(f.read(), agent=config_from_env())
    d.log = log
    return d


@task(name="report")
def report_task(report: RunReport, path: str, root: str) -> str:
    """The run report: HTML with plots on disk, the same as a markdown artifact keyed by the run (job name and
    checkpoint root `root`: see tasks/artifactkey.py)."""
    out = render_html(report, path)
    key = run_key("report", report.job, root)
    create_markdown_artifact(markdown(report, str(out)), key=key, description=f"run report of {report.job}")
    get_run_logger().info("run report %s, artifact %s", out, key)  # the key to search for in the UI
    return str(out)
