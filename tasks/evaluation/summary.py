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
