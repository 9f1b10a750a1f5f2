"""A rerun of a job whose final step is already committed (stopped while its evaluations ran, or rerun after it
finished on another ledger): the trainer resumes at that step and trains nothing. What the run then reports is the
training that committed the step (the earlier invocation's result), not an empty one (no loss, 0 tokens/s, no
checkpoints). No Prefect here."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import ValidationError

from tasks.training.request import TrainResult


class Earlier:
    """The result.json an earlier invocation left in `run_dir`, read before the trainer replaces it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "result.json"
        self.text: str | None = None
        self.result: TrainResult | None = None
        try:
            self.text = self.path.read_text()
            self.result = TrainResult.model_validate(json.loads(self.text))
        except (OSError, ValueError, ValidationError):  # none, or not one: nothing to carry over
            self.text, self.result = None, None

    def carried_over(self, now: TrainResult) -> TrainResult:
        """`now`, or, when `now` trained nothing at the step the earlier invocation ended on (same checkpoint
        root) and that one trained, the earlier result (marked resumed at that step, so that only what this
        invocation committed counts as new); its result.json is put back."""
        e = self.result
        if (e is None or now.resumed_from_step != now.final_step or e.final_step != now.final_step
                or e.checkpoint_uri != now.checkpoint_uri or not e.checkpoints or math.isnan(e.last_loss)):
            return now
        if self.text is not None:
            self.path.write_text(self.text)
        return e.model_copy(update={"resumed_from_step": now.resumed_from_step})
