"""The run's evaluations: in-flow (each checkpoint evaluated in the run as it commits, oldest first) and the scores
that other runs (the commit-triggered deployment) wrote to the history. No Prefect here: the evaluation itself is
a callable."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from tasks.artifactkey import step_root
from tasks.evaluation import history
from tasks.evaluation.suite import Suite, missing_plugins
from tasks.evaluation.summary import EvalSummary
from tasks.paths import place_key
from tasks.procs import exit_words
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage


def step_uri(root: str, step: int) -> str:
    return f"{root.rstrip('/')}/{ck.step_dir(step)}"


def scored(history_dir: str, run: str, suite: str, root: str | None = None) -> dict[int, EvalSummary]:
    """The steps of `run` (under checkpoint root `root`, when given: roots that share a run name share a history,
    and one root's score is not another's) the history already scores on `suite` (evaluated earlier, or by another
    run), each with the results its history line names."""
    out = {}
    for e in history.read(history_dir, run, suite):
        if root and history.uri_key(step_root(e.uri)) != place_key(root):
            continue
        res = history.result_file(history_dir, e)
        out[e.step] = EvalSummary(uri=e.uri, run=run, step=e.step, suite=suite, scores=e.scores, makespan_s=0.0,
                                  predicted_makespan_s=0.0, result=str(res or ""), history_plot=None, failed=e.failed)
    return out


class InFlowEvaluator:
    """Evaluates each newly committed checkpoint under `root`, oldest first, when asked (`catch_up`); steps the
    history already has (a resumed job) are not evaluated again, and one that cannot be evaluated is reported once
    (`failures`, with its cause) and skipped: it does not stop training. `ahead`, when given, is called after an
    evaluation that another one follows (a step still waiting, or training still running, whose next commit comes):
    it starts the next evaluation's processes (their imports) while this process finishes the one before."""

    def __init__(self, root: str, history_dir: str, run: str, suite: str, evaluate: Callable[[str], EvalSummary],
                 warn: Callable[[str], None], ahead: Callable[[], None] | None = None) -> None:
        self.root, self.evaluate, self.warn, self.ahead = root, evaluate, warn, ahead
        self.done: dict[int, EvalSummary] = scored(history_dir, run, suite, root)
        self.missed: dict[int, str] = {}
        self.retired: dict[int, str] = {}
        """Steps retention removed before they were scored (by design, not failures), with why."""

    def catch_up(self, training: Callable[[], bool] | None = None) -> None:
        """Evaluate the steps committed and not yet evaluated, oldest first. `training`: whether the trainer still
        runs (asked after each evaluation: one that ended meanwhile commits nothing more)."""
        todo = sorted(m.step for m in ck.committed(Storage(self.root))
                      if m.step not in self.done and m.step not in self.missed and m.step not in self.retired)
        for step in todo:
            self._evaluate(step)
            if self.ahead is not None and (step != todo[-1] or (training is not None and training())):
                self.ahead()

    def _evaluate(self, step: int) -> None:
        try:
            self.done[step] = self.evaluate(step_uri(self.root, step))
        except Exception as err:  # noqa: BLE001 - one checkpoint that cannot be evaluated does not fail the job
            if why := ck.retired(Storage(self.root), step):
                self.retired[step] = why
                self.warn(f"{why}: not evaluated (not a failure of the run)")
                return
            if why := ck.abandoned(Storage(self.root), step):  # not kept in `retired`: the run may commit it again
                self.warn(f"{why}: not evaluated (not a failure of the run)")
                return
            cause = str(err) or type(err).__name__
            self.missed[step] = cause
            self.warn(f"evaluation of step {step} failed: {cause}")

    def summaries(self) -> list[EvalSummary]:
        return [self.done[s] for s in sorted(self.done)]

    def failures(self) -> list[EvalFailure]:
        return [EvalFailure(step=s, cause=self.missed[s]) for s in sorted(self.missed) if s not in self.done]


class EvalFailure(BaseModel):
    """A committed step whose evaluation run failed (after the retries that could help)."""

    step: int
    cause: str
    earlier: bool = False
    """From an earlier run of the job (a rerun of a finished job reports it): not tried again by this one."""

    def line(self) -> str:
        """How the CLI and the report say it."""
        when = " in the earlier run (not tried again by this one)" if self.earlier else ""
        return f"evaluation of step {self.step} FAILED{when}: {self.cause}"


Verdict = Literal["failed", "crashed"]
"""How a triggered evaluation run ended without a score: failed (its code raised: the same checkpoint fails the same
way, so it is not retried) or crashed (its process or worker died: worth one more run)."""


def crash_cause(message: str | None, run_name: str) -> str:
    """The cause `submit` reports for a Crashed evaluation run: a process the worker saw end by a signal (Prefect's
    `Process exited with status code: -9 ... out of memory or manual cancellation`, which named neither the
    evaluation nor what to look at: red team 41m B3) says the evaluation process was killed, by which signal, its
    usual senders and where its log is; any other message as Prefect gave it."""
    text = message or f"the run {run_name} ended Crashed"
    m = re.search(r"status code:?\s*(-\d+)", text)
    if m is None:
        return text
    how = exit_words(int(m.group(1)), lambda sig: _KILL_SENDERS if sig == "SIGKILL" else "a signal sent to it")
    return (f"its evaluation process (flow run {run_name}) was {how}; its log: `prefect flow-run logs {run_name}`; "
            f"the worker said: {text}")


_API_GONE = re.compile(r"Connection refused|All connection attempts failed|ConnectError|Connection reset|"
                       r"RemoteProtocolError|Server disconnected")
"""How an exception of an unreachable Prefect API reads in a run's Failed message (httpx's, the OS's)."""


def api_outage_cause(message: str | None, run_name: str) -> str | None:
    """The cause `submit` reports for an evaluation run that Failed because the Prefect API did not answer (a server
    restarted: its code raised a connection error, not the checkpoint nor a dataset), so that it is run again like a
    crashed one instead of reported as the step's failure (red team 41q B3); None for any other failure."""
    if not message or _API_GONE.search(message) is None:
        return None
    return (f"its evaluation run {run_name} failed when the Prefect API did not answer (a server restart or a network "
            f"cut, not the checkpoint nor a dataset); its log: `prefect flow-run logs {run_name}`; it said: {message}")


def rerun_line(step: int, cause: str) -> str:
    """What `submit` says as it runs a step's evaluation again: why its run ended without a score (`crash_cause`, or
    a run stuck PENDING that was ended), as the server's state records it."""
    return (f"the evaluation run of step {step} ended without a score: {cause.rstrip('.')}; running it again" if cause
            else f"the evaluation run of step {step} crashed (its worker or process died): running it again")


def lacking_here(suite: Suite) -> str | None:
    """What `submit` says when it evaluates in-flow after waiting for workers (none polled the pool) and this process
    cannot import a `module:factory` dataset plugin of `suite`, which the workers had: those datasets fail here (the
    others are scored), named with how to score them where the plugin is (red team 41r). None when nothing lacks."""
    if not (lacking := missing_plugins(suite)):
        return None
    return (f"this process lacks what the workers evaluate with ({'; '.join(lacking)}): those datasets fail in this "
            "in-flow evaluation and the others are scored; start a worker where the plugin is installed (`prefect "
            "worker start --pool frenzy`, from any directory), then score them with `prefect deployment run "
            "evaluate-pending/evaluate-pending`")


_KILL_SENDERS = ("a dataset plugin that kills its own process group, the kernel's out-of-memory killer (`dmesg` on the "
                 "worker) or a manual kill")


class Retired(BaseModel):
    """A step removed by design before it was scored, and why: by retention (`ck.retired`), or discarded by a
    rollback or resume to an earlier step (`ck.abandoned`)."""

    step: int
    why: str


def retired_steps(root: str, steps: list[int], scored: set[int] | dict) -> list[Retired]:
    """The steps of `steps` (each seen committed) with no score that retention removed or a rollback discarded (by
    design). They are not waited for, not evaluated, and not a failure of the run (red team 41e S14)."""
    if not root:
        return []
    storage = Storage(root)
    return [Retired(step=s, why=why) for s in steps
            if s not in scored and (why := ck.retired(storage, s) or ck.abandoned(storage, s))]


def collect_scores(read: Callable[[], dict[int, EvalSummary]], steps: list[int], timeout_s: float,
                   runs: Callable[[], dict[int, tuple[Verdict, str]]] = dict,
                   rerun: Callable[[int], bool] | None = None, retries: int = 1,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> tuple[dict[int, EvalSummary], list[EvalFailure]]:
    """deployment mode: the scores the commit-triggered evaluations wrote to the history, waiting (at most
    `timeout_s`) until every committed step in `steps` has one or its run failed. `runs()` gives the steps whose
    newest triggered run ended without a score; a crashed one is run again (`rerun`, False when it could not be
    started: asked again at the next poll, not counted) up to `retries` times, a failed one is reported at once with
    its cause. The runs finish in any order: the final step's score can land before an
    earlier step's."""
    deadline = clock() + timeout_s
    tries: dict[int, int] = {}
    while True:
        found = read()
        failures = []
        for step, (verdict, cause) in sorted(runs().items()):
            if step in found or step not in steps:
                continue
            if verdict == "crashed" and rerun is not None and tries.get(step, 0) < retries:
                if rerun(step):
                    tries[step] = tries.get(step, 0) + 1
                continue
            failures.append(EvalFailure(step=step, cause=cause))
        settled = set(found) | {f.step for f in failures}
        if set(steps) <= settled or clock() > deadline:
            return found, failures
        sleep(2.0)
