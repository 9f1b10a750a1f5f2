"""Evaluate one checkpoint and record it: the score history line, the history plot and a small summary record.

The one entry point that `frenzy evaluate`, the evaluation flows and the `submit` pipeline all call, so the three
cannot drift apart: results go to `<history_dir>/<run>/step_<N>/<suite>/` unless `opts.out_dir` says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from tasks.evaluation import history
from tasks.evaluation.engine import resolve_manifest
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


def evaluate_and_record(uri: str, suite: Suite, opts: EvalOptions, history_dir: str = "evals",
                        progress: Callable[[str, float], None] | None = None) -> tuple[EvalResult, EvalSummary]:
    """Evaluate `uri` (a committed step or a root's newest) on `suite`, append the score to the run's history
    and redraw its plot; returns the full result and the summary."""
    if opts.out_dir is None:
        _, m = resolve_manifest(uri)
        opts = opts.model_copy(update={"out_dir": f"{history_dir}/{m.run}/step_{m.step:08d}/{suite.name}"})
    res = evaluate(uri, suite, opts, progress)
    history.append(history_dir, res.run, res.step, res.uri, suite.name, res.scores)
    plot = history.plot(history_dir, res.run, suite.name)
    summary = EvalSummary(uri=res.uri, run=res.run, step=res.step, suite=suite.name, scores=res.scores,
                          makespan_s=res.makespan_s, predicted_makespan_s=res.predicted_makespan_s,
                          result=f"{res.out_dir}/result.json", history_plot=str(plot) if plot else None)
    return res, summary
