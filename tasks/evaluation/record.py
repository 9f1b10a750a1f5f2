"""Evaluate one checkpoint and record it: the score history line, the history plot and a small summary record.

The one entry point that `frenzy evaluate`, the evaluation flows and the `submit` pipeline all call, so the three
cannot drift apart: results go to `<history_dir>/<run>/step_<N>/<suite>/` unless `opts.out_dir` says otherwise, or
`<suite>@<root tag>/` beside it when that one holds another checkpoint root's results (roots that share a run name
share a history directory: red team 41l C3). The history line names the results it belongs to (`result`), and every
reader goes through it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError

from tasks.artifactkey import step_root
from tasks.errors import FrenzyError, as_frenzy_error, environment_problem
from tasks.evaluation import history
from tasks.evaluation.engine import hf_info, is_hf_dir, resolve_manifest
from tasks.evaluation.runner import EvalOptions, EvalResult, evaluate
from tasks.evaluation.suite import Suite
from tasks.evaluation.summary import EvalSummary
from tasks.outdir import (
    BusyError,
    Hold,
    OutputError,
    check_dir_target,
    failed_dir,
    fill_dir,
    held,
    lock_note,
    machine_errors,
)
from tasks.paths import place_key
from tasks.procs import alive
from tasks.training import checkpoint as ck
from tasks.userfiles import LIMITS, read_bytes


class Writer(BaseModel):
    """Who holds an evaluation directory's lock, for which checkpoint root (place_key): its lock's note."""

    pid: int
    host: str
    root: str

    def live(self) -> bool:
        return self.host != socket.gethostname() or alive(self.pid)


LOCK_STALE_S = 60.0
"""How long an evaluation's lock may go without its holder's heartbeat (a thread renews it 6 times in that time)
before one waiting for it takes it over (`FRENZY_EVAL_LOCK_STALE_S`): a holder stopped by SIGSTOP and never
continued kept the lock, and the rerun waited its whole eval_timeout_s (red team 41r)."""


def lock_stale_s() -> float:
    raw = os.environ.get("FRENZY_EVAL_LOCK_STALE_S", "")
    try:
        return float(raw) if raw and float(raw) > 0 else LOCK_STALE_S
    except ValueError:
        return LOCK_STALE_S


@contextlib.contextmanager
def sole_writer(out_dir: str | Path, wait: bool = True, root: str = "",
                said: Callable[[str], None] | None = None) -> Iterator[Hold]:
    """Hold the evaluation directory `out_dir` alone (tasks/outdir.py's lock, `.NAME.lock` beside it): a second
    evaluation of the same step and suite (an in-flow evaluation and an event-triggered deployment run, say) waits
    here until the first is done, or with `wait` False is refused at once, naming the first. Two writers would mix
    their chunk files (`humaneval: 32 of 16 examples scored`). `root`: the checkpoint root (place_key) being
    evaluated, in the lock's note, so that another root's evaluation goes beside it at once (`_holder_root`). A
    holder that sent no heartbeat for `lock_stale_s()` (stopped, frozen) is taken over, said through `said`; the
    `Hold` tells the old holder, should it continue, that it must publish nothing."""
    out = Path(out_dir).expanduser().absolute()
    note = Writer(pid=os.getpid(), host=socket.gethostname(), root=root).model_dump_json() if root else ""
    with held(out, "frenzy evaluate", wait=wait, note=note, stale_s=lock_stale_s(), said=said) as hold:
        yield hold


def recorded(history_dir: str, run: str, step: int, suite: str, uri: str | None = None,
             whole: bool = True) -> EvalSummary | None:
    """The history's summary of `step` of `run` on `suite` (scored at `uri`, when given: roots that share a run name
    share a history, and one root's score is not another's), None when it has no score for it or (with `whole`)
    its newest evaluation left a dataset unscored (evaluated again, as `history.survey_pending` has it)."""
    for e in history.read(history_dir, run, suite):
        if e.step == step and not (whole and e.failed) and (uri is None or history.uri_key(e.uri) == place_key(uri)):
            res = history.result_file(history_dir, e)
            return EvalSummary(uri=e.uri, run=run, step=step, suite=suite, scores=e.scores, makespan_s=0.0,
                               predicted_makespan_s=0.0, result=str(res or ""), history_plot=None, failed=e.failed)
    return None


def results_dir(history_dir: str, run: str, step: int, suite: str, root: str) -> Path:
    """Where an evaluation of `step` of checkpoint root `root` on `suite` puts its results: `<history_dir>/<run>/
    step_<N>/<suite>`, unless that holds another root's results (a root with the same run name, evaluated into the
    same history directory), or this root already has `<suite>@<root tag>` beside it: then that one. So one root's
    layout is what it always was, and a second root never replaces the first's files."""
    plain = Path(history_dir).expanduser().absolute() / run / ck.step_dir(step) / suite
    own = plain.with_name(f"{suite}@{history.root_tag(root)}")
    return own if own.exists() or _holder_root(plain) not in (None, place_key(root)) else plain


ROOT_MARK = ".frenzy-root"
"""In a results directory being written: the checkpoint root it is of (place_key). A failed attempt keeps it in its
logs at `OUT.failed`, so that another root's evaluation goes beside them, not over them (red team 41n C3)."""


def _holder_root(out: Path) -> str | None:
    """The checkpoint root (place_key) whose evaluation is writing `out` now (its lock's note: red team 41o S6, the
    second root waited on or was refused by the first's lock), else whose results `out` holds, or else whose failed
    attempt `OUT.failed` holds (another root's success at `out` would remove those logs, which its error named);
    None when none."""
    writer = _writer(out)
    if writer is not None:
        return writer.root
    try:
        uri = EvalResult.model_validate_json(read_bytes(out / "result.json", "evaluation result", LIMITS["json"])).uri
        return history.uri_key(uri if is_hf_dir(uri) else step_root(uri))
    except (OSError, ValueError):  # none, or not a result: nobody's (replaced only with overwrite, as before)
        pass
    try:
        return (failed_dir(out) / ROOT_MARK).read_text().strip() or None
    except OSError:
        return None


def _writer(out: Path) -> Writer | None:
    """The live writer of `out` its lock names; None when none does (no lock, no note yet, or a dead holder's)."""
    try:
        w = Writer.model_validate_json(lock_note(out) or "null")
    except ValidationError:
        return None
    return w if w.live() else None


def evaluate_and_record(uri: str, suite: Suite, opts: EvalOptions, history_dir: str = "evals",
                        progress: Callable[[str, float], None] | None = None,
                        reevaluate: bool = True, overwrite: bool = False,
                        fence: Callable[[], str | None] | None = None) -> tuple[EvalResult, EvalSummary]:
    """Evaluate `uri` (a committed step or a root's newest) on `suite`, append the score to the run's history
    and redraw its plot; returns the full result and the summary. With `reevaluate` False, a step the history
    already scores on `suite` (or that another process is scoring now: this waits for it) is not evaluated again;
    its recorded result comes back. With it True, a second evaluation into the same directory is refused at once.

    The results are written whole or not at all: into a temp directory beside the target, renamed over it when the
    evaluation is complete (tasks/outdir.py), so a kill leaves the previous results as they were. A target that holds
    results is replaced only with `overwrite` (`--overwrite`). `fence`, asked once the results are complete and
    before any of them is published (the history line, the rename): a reason not to publish (this process's run was
    marked Crashed and run again while it was stopped), raised as `Fenced`; its logs stay at `OUT.failed`."""
    if is_hf_dir(uri):  # a Hugging Face model directory is step 0 of a run named after it (as `evaluate` has it)
        run, step, at = str(hf_info(uri)["run"]), 0, None
    else:
        storage, m = resolve_manifest(uri)
        run, step, at = m.run, m.step, storage.url(ck.step_dir(m.step))
    root = uri if at is None else step_root(at)
    if not reevaluate and (kept := _whole(recorded(history_dir, run, step, suite.name, at))) is not None:
        return kept  # scored whole already: read and returned, nothing written, no lock (a read-only history too)
    for _ in range(3):  # another root of the run name may take the plain directory first, or while this waits
        out = (Path(opts.out_dir).expanduser().absolute() if opts.out_dir
               else results_dir(history_dir, run, step, suite.name, root))
        check_dir_target(out, "frenzy evaluate", by_content=True)  # its own layout is evals/<run>/step_<N>/<suite>
        with contextlib.ExitStack() as lock:
            try:  # not waiting first: a lock another root took since `results_dir` looked sends this one beside it
                hold = lock.enter_context(sole_writer(out, wait=False, root=place_key(root)))
            except BusyError:
                if not opts.out_dir and results_dir(history_dir, run, step, suite.name, root) != out:
                    continue
                if reevaluate:
                    raise
                hold = lock.enter_context(sole_writer(out, wait=True, root=place_key(root), said=_saying(progress)))
            if opts.out_dir or results_dir(history_dir, run, step, suite.name, root) == out:
                return _record_into(out, uri, suite, opts, history_dir, progress,
                                    None if reevaluate else recorded(history_dir, run, step, suite.name, at), overwrite,
                                    place_key(root), _fenced_by(hold, fence))
    raise OutputError(f"{out} was taken by another checkpoint root's evaluation three times while this one waited; "
                      "run it again")


def _saying(progress: Callable[[str, float], None] | None) -> Callable[[str], None]:
    """Where a lock taken over is said: the evaluation's progress (a flow's log), else stderr."""
    if progress is not None:
        return lambda msg: progress(msg, 0.0)
    return lambda msg: print(f"frenzy evaluate: {msg}", file=sys.stderr, flush=True)


def _fenced_by(hold: Hold, fence: Callable[[], str | None] | None) -> Callable[[], str | None]:
    """`fence`, then whether this process still holds its lock (a waiter takes over a stopped holder's): the lock
    last, nearest the publish."""
    def why() -> str | None:
        if fence is not None and (said := fence()):
            return said
        if taken := hold.taken():
            return (f"not publishing this evaluation: {taken}; the process that took it evaluates the step and "
                    "publishes its result, and nothing of this attempt is written to the history or the results "
                    "directory")
        return None
    return why


class Fenced(FrenzyError):
    """An evaluation complete but not published: its run was marked ended on the server (Crashed while its process
    was stopped) and run again; the run made again publishes the step's result."""


def _whole(done: EvalSummary | None) -> tuple[EvalResult, EvalSummary] | None:
    """The recorded evaluation `done` with its result file, when that file is there and reads."""
    if done is None or not done.result:
        return None
    try:
        return EvalResult.model_validate_json(Path(done.result).read_text()), done
    except (OSError, ValueError):
        return None


def _record_into(out: Path, uri: str, suite: Suite, opts: EvalOptions, history_dir: str,
                 progress: Callable[[str, float], None] | None, done: EvalSummary | None,
                 overwrite: bool, root: str, fence: Callable[[], str | None] | None = None) -> tuple[EvalResult, EvalSummary]:
    """`evaluate_and_record` into `out`, held alone: the recorded result `done` when its files are there, else a new
    evaluation, its history line (naming `out/result.json`) and the redrawn plot. `root`: the checkpoint root
    (place_key), marked in the attempt while it runs and so in its logs should it fail (`ROOT_MARK`)."""
    if done is not None and done.result and Path(done.result).exists():
        return EvalResult.model_validate_json(Path(done.result).read_text()), done
    if not overwrite:
        _refuse_results(out)
    earlier = _complete_result(out)
    try:
        with machine_errors("frenzy evaluate", out), fill_dir(out, "frenzy evaluate", True, keep_failed=True) as tmp:
            (tmp / ROOT_MARK).write_text(root)
            res = evaluate(uri, suite, opts.model_copy(update={"out_dir": str(tmp)}), _naming(progress, tmp, out),
                           history.preload_plotting)  # the plot's imports beside the trials, not after them
            if res.failed and earlier is not None:  # a partial result never replaces a complete one (red team 41m C2)
                raise _KeptEarlier(_kept_aside(res, tmp, out, earlier))
            res = _renamed(res, tmp, out)
            if fence is not None and (why := fence()):  # nothing of this attempt reaches the history or `out`
                raise Fenced(why)
            (tmp / "result.json").write_text(res.model_dump_json(indent=1))
            # before the rename: a history that cannot be written (a full disk) leaves no results behind
            with machine_errors("frenzy evaluate", history.history_file(history_dir, res.run)):
                history.append(history_dir, res.run, res.step, res.uri, suite.name, res.scores, res.failed,
                               result=out / "result.json")
            (tmp / ROOT_MARK).unlink()  # complete: its result.json names the root
    except _KeptEarlier as kept:  # this attempt is at OUT.failed/; OUT and the history are as they were
        res = kept.res
        return res, EvalSummary(uri=res.uri, run=res.run, step=res.step, suite=suite.name, scores=res.scores,
                                makespan_s=res.makespan_s, predicted_makespan_s=res.predicted_makespan_s,
                                result=f"{res.out_dir}/result.json", history_plot=None, failed=res.failed)
    except Fenced:
        raise
    except Exception as err:  # any other failure (a full disk, say): the complete earlier result is untouched
        if fence is not None and (why := fence()):  # taken over while it ran (stopped past the lock's stale time):
            raise Fenced(why) from err  # the taker swept its files, which is why it failed; say that, not the error
        if isinstance(err, FrenzyError):  # (red team 41s, scenario 18: `...precursor-n0.stderr: no such file`)
            _say_kept(err, out, earlier)
        raise
    plot = _plot(history_dir, res, suite.name, out)
    summary = EvalSummary(uri=res.uri, run=res.run, step=res.step, suite=suite.name, scores=res.scores,
                          makespan_s=res.makespan_s, predicted_makespan_s=res.predicted_makespan_s,
                          result=f"{res.out_dir}/result.json", history_plot=str(plot) if plot else None,
                          failed=res.failed)
    return res, summary


class _KeptEarlier(Exception):  # noqa: N818 - not an error: the way out of `fill_dir` that keeps the old results
    """An evaluation with failed datasets whose target held a complete result: `res`, as kept at `OUT.failed`."""

    def __init__(self, res: EvalResult) -> None:
        super().__init__(res.kept_earlier or "")
        self.res = res


def _complete_result(out: Path) -> EvalResult | None:
    """The result `out` holds when every dataset of it was scored; None when it holds none or a partial one."""
    try:
        prev = EvalResult.model_validate_json(read_bytes(out / "result.json", "evaluation result", LIMITS["json"]))
    except (OSError, ValueError):
        return None
    return None if prev.failed else prev


def _kept_aside(res: EvalResult, tmp: Path, out: Path, earlier: EvalResult) -> EvalResult:
    """`res` (some datasets failed) as it reads once `fill_dir` moves `tmp` to `OUT.failed`, where it is written,
    saying that `out` keeps `earlier`'s complete results."""
    kept = failed_dir(out)
    res = _renamed(res, tmp, kept).model_copy(update={"kept_earlier": (
        f"{out} keeps its earlier complete results ({', '.join(earlier.scores)} scored); this attempt, with "
        f"{', '.join(res.failed)} not scored, is in {kept} (only an attempt that scores every dataset replaces them)")})
    (tmp / "result.json").write_text(res.model_dump_json(indent=1))
    return res


def _say_kept(err: FrenzyError, out: Path, earlier: EvalResult | None) -> None:
    """Add to `err`'s message that `out` keeps `earlier`, the complete result an `--overwrite` failed to replace
    (its type and causes stay: the CLI still names the fix of a full disk)."""
    if earlier is None or len(err.args) != 1 or str(err) != err.args[0]:
        return
    err.args = (f"{err.args[0]}; {out} keeps its earlier complete results ({', '.join(earlier.scores)} scored): "
                "nothing of them was replaced",)


def _naming(progress: Callable[[str, float], None] | None, tmp: Path, out: Path
            ) -> Callable[[str, float], None] | None:
    """`progress` with the temp results directory named as `out`: a trial's log it names (`its log: ...`) is read
    after the results are renamed into place, where the temp directory no longer exists (red team 41k B1). An
    evaluation that fails as a whole keeps its logs at `OUT.failed` (tasks/outdir.py), and its error names them there."""
    if progress is None:
        return None
    return lambda msg, frac: progress(msg.replace(str(tmp), str(out)), frac)


def _renamed(res: EvalResult, tmp: Path, out: Path) -> EvalResult:
    """`res` as it reads once `tmp` is renamed to `out`: its directory, each failed dataset's cause and each trial's
    error (which name their logs) under `out`."""
    def at(text: str) -> str:
        return text.replace(str(tmp), str(out))

    trials = [t.model_copy(update={"error": at(t.error)}) if t.error else t for t in res.trials]
    return res.model_copy(update={"out_dir": str(out), "trials": trials,
                                  "failed": {d: at(why) for d, why in res.failed.items()}})


def _plot(history_dir: str, res: EvalResult, suite: str, out: Path) -> Path | None:
    """Redraw the history plot once the results are in place; a failure says they were kept."""
    try:
        return history.plot(history_dir, res.run, suite)
    except FrenzyError as err:  # the plot's writer names a machine error (a full disk) as one
        problem: FrenzyError = err
    except OSError as err:
        if environment_problem(err) is None:
            raise
        problem = as_frenzy_error(err, "drawing the history plot")
    raise FrenzyError(f"{problem}; the evaluation itself is complete and kept: {out}/result.json, and its line in "
                      f"{history.history_file(history_dir, res.run)} (only the plot is missing)") from problem


def _refuse_results(out: Path) -> None:
    """Refuse a target that holds anything, naming the evaluation whose results it holds."""
    if not (out.is_dir() and any(out.iterdir())):
        return
    what = "files"
    try:
        prev = EvalResult.model_validate_json(read_bytes(out / "result.json", "evaluation result", LIMITS["json"]))
        what = f"the results of {prev.run} step {prev.step} on {prev.suite}"
    except (OSError, ValueError):
        pass
    raise OutputError(f"{out} already holds {what}; frenzy evaluate replaces them only with --overwrite (or give "
                      "another --out-dir)")
