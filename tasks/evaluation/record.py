"""Evaluate one checkpoint and record it: the score history line, the history plot and a small summary record.

The one entry point that `frenzy evaluate`, the evaluation flows and the `submit` pipeline all call, so the three
cannot drift apart: results go to `<history_dir>/<run>/step_<N>/<suite>/` unless `opts.out_dir` says otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

from tasks.evaluation import history
from tasks.evaluation.engine import hf_info, is_hf_dir, resolve_manifest
from tasks.evaluation.runner import EvalOptions, EvalResult, evaluate
from tasks.evaluation.suite import Suite


class EvalSummary(BaseModel):
    """A small record of one evaluation (the full result is the `result` file)."""

    uri: str
    run: str
    step: int
    suite: str
    scores: dict[str, dict[str, float]]
    makespan_s: float
    predicted_makespan_s: float
    result: str
    history_plot: str | None


WRITER_LOCK = ".writer.lock"
"""In an evaluation directory: held (flock) by the one process evaluating into it. The kernel drops it when that
process dies, so a SIGKILLed evaluation never leaves the directory locked."""


@contextlib.contextmanager
def sole_writer(out_dir: str | Path) -> Iterator[None]:
    """Hold the evaluation directory `out_dir` alone: a second evaluation of the same step and suite (an in-flow
    evaluation and an event-triggered deployment run, say) waits here until the first is done. Two writers would mix
    their chunk files (`humaneval: 32 of 16 examples scored`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / WRITER_LOCK, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def recorded(history_dir: str, run: str, step: int, suite: str) -> EvalSummary | None:
    """The history's summary of `step` of `run` on `suite`, None when it has no score for it."""
    for e in history.read(history_dir, run, suite):
        if e["step"] == step:
            res = Path(history_dir) / run / f"step_{step:08d}" / suite / "result.json"
            return EvalSummary(uri=e["uri"], run=run, step=step, suite=suite, scores=e["scores"], makespan_s=0.0,
                               predicted_makespan_s=0.0, result=str(res), history_plot=None)
    return None


def evaluate_and_record(uri: str, suite: Suite, opts: EvalOptions, history_dir: str = "evals",
                        progress: Callable[[str, float], None] | None = None,
                        reevaluate: bool = True) -> tuple[EvalResult, EvalSummary]:
    """Evaluate `uri` (a committed step or a root's newest) on `suite`, append the score to the run's history
    and redraw its plot; returns the full result and the summary. With `reevaluate` False, a step the history
    already scores on `suite` (or that another process is scoring now: this waits for it) is not evaluated again;
    its recorded result comes back."""
    if is_hf_dir(uri):  # a Hugging Face model directory is step 0 of a run named after it (as `evaluate` has it)
        run, step = str(hf_info(uri)["run"]), 0
    else:
        _, m = resolve_manifest(uri)
        run, step = m.run, m.step
    if opts.out_dir is None:
        opts = opts.model_copy(update={"out_dir": f"{history_dir}/{run}/step_{step:08d}/{suite.name}"})
    with sole_writer(opts.out_dir):
        done = None if reevaluate else recorded(history_dir, run, step, suite.name)
        if done is not None and Path(done.result).exists():
            return EvalResult.model_validate_json(Path(done.result).read_text()), done
        for part in ("predictions", "scores"):  # a previous evaluation's chunks may be split differently
            shutil.rmtree(Path(opts.out_dir) / part, ignore_errors=True)
        res = evaluate(uri, suite, opts, progress)
        history.append(history_dir, res.run, res.step, res.uri, suite.name, res.scores)
        plot = history.plot(history_dir, res.run, suite.name)
    summary = EvalSummary(uri=res.uri, run=res.run, step=res.step, suite=suite.name, scores=res.scores,
                          makespan_s=res.makespan_s, predicted_makespan_s=res.predicted_makespan_s,
                          result=f"{res.out_dir}/result.json", history_plot=str(plot) if plot else None)
    return res, summary
