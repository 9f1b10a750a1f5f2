"""`EvalSummary`, the small record of one evaluation that the pipeline's records carry, apart from the evaluation code
(`record.py`, which loads models and torch) so that a request or a result can be read without importing either."""

from __future__ import annotations

from pydantic import BaseModel


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
    failed: dict[str, str] = {}
    """Datasets of the suite not scored, each with its cause (`EvalResult.failed`); empty: every one was."""

    earlier: bool = False
    """Reported again from an earlier evaluation (a rerun of a finished job): its failed datasets were not tried again."""

    def failed_lines(self) -> list[str]:
        """One line per failed dataset, as the CLI and the report say it."""
        when = " in an earlier evaluation (not tried again by this run)" if self.earlier else " (not scored)"
        return [f"step {self.step}: {ds} FAILED{when}: {why}" for ds, why in self.failed.items()]
