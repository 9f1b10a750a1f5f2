"""One line per trainer progress record (step, checkpoint, spike, resume, ...), for every front-end.

Rank 0 appends the records to `<run_dir>/progress.jsonl`; `launch()` and the Ray executor hand each one to their
`on_record` callback as a `ProgressRecord` (`progress_record()`). `frenzy train` prints these lines on stderr and the
Prefect `train` task logs them, so both show the same words.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

WARNING_EVENTS = frozenset({"spike", "resume", "checkpoint_rejected", "resharded", "lease_wait", "diverging"})
"""Records a front-end should show as warnings rather than progress."""


class ProgressRecord(BaseModel):
    """One record of `progress.jsonl`: its kind (`event`), when it was written (epoch seconds) and the kind's fields,
    every one kept (`model_dump()` holds each field of the line). The kinds a front-end acts on have their own
    records below."""

    model_config = ConfigDict(extra="allow")

    event: str
    time: float


class StepProgress(ProgressRecord):
    """`step`: written every `training.log_every_steps` and at the last step."""

    event: Literal["step"]
    step: int
    steps: int
    """training.steps."""
    loss: float
    grad_norm: float
    tokens_per_s: float
    eta_s: float
    lr: float


class CommitProgress(ProgressRecord):
    """`checkpoint`: a checkpoint committed; the fields of CheckpointRecord (tasks/training/checkpoint/manifest.py),
    repeated because this module is the launcher's and imports no torch (tests/test_trainer_parts.py keeps them the same)."""

    event: Literal["checkpoint"]
    step: int
    uri: str
    blocked_s: float
    wait_s: float = 0.0
    drag_s: float = 0.0
    persist_s: float
    bytes: int
    deferred_steps: int = 0


class SpikeProgress(ProgressRecord):
    """`spike`: a loss spike the guard handled (tasks/training/guard.py)."""

    event: Literal["spike"]
    step: int
    reason: str
    action: str
    """rolled_back, update_skipped or trained_through."""
    rolled_back_to: int | None
    skipped_samples: list[int] | None
    """[first, end) of the samples left out; None when trained through."""


_KINDS: dict[str, type[ProgressRecord]] = {"step": StepProgress, "checkpoint": CommitProgress, "spike": SpikeProgress}


def progress_record(line: dict[str, Any]) -> ProgressRecord:
    """The record of one parsed line of `progress.jsonl`; a line its kind's record does not fit (another trainer
    version's) stays a plain ProgressRecord: showing progress never fails a run."""
    kind = _KINDS.get(line.get("event", ""), ProgressRecord)
    try:
        return kind.model_validate(line)
    except ValidationError:
        return ProgressRecord.model_validate(line)


def is_warning(rec: ProgressRecord) -> bool:
    """Whether a front-end shows `rec` as a warning. A gradient-norm spike whose update was only skipped (the loss in
    range: 6-12 in an ordinary 1,500-step gpt-tiny run, red team 41p S13) is progress: the run's summary counts
    them in one line, so they are not a warning each."""
    if isinstance(rec, SpikeProgress) and rec.action == "update_skipped" and rec.rolled_back_to is None:
        return not rec.reason.startswith("gradient norm")
    return rec.event in WARNING_EVENTS


def describe(rec: ProgressRecord) -> str:
    """A human line for one record of `progress.jsonl`."""
    if isinstance(rec, StepProgress):
        return (f"step {rec.step}/{rec.steps}  loss {rec.loss:.4f}  gnorm {rec.grad_norm:.3f}  "
                f"{rec.tokens_per_s:,.0f} tok/s  ETA {rec.eta_s:.0f}s")
    if isinstance(rec, CommitProgress):
        return (f"checkpoint step {rec.step} committed: {rec.uri} ({rec.bytes / 1e6:.1f} MB, "
                f"blocked {rec.blocked_s * 1e3:.1f} ms, persisted in {rec.persist_s:.2f}s)")
    if isinstance(rec, SpikeProgress):
        what = "gradient-norm spike" if rec.reason.startswith("gradient norm") else "loss spike"
        if rec.action == "trained_through":
            return f"{what} at step {rec.step} ({rec.reason}) after several in a row: trained through it"
        if rec.rolled_back_to is not None:
            done = f"rolled back to step {rec.rolled_back_to}"
        elif what == "gradient-norm spike":
            done = "update skipped (the loss is in range: nothing to roll back)"
        else:
            done = "update skipped (no healthy checkpoint to roll back to)"
        return f"{what} at step {rec.step} ({rec.reason}): {done}, skipping samples {rec.skipped_samples}"
    fields = rec.model_dump()
    if rec.event in ("lease_wait", "resharded", "diverging") and "message" in fields:
        return fields["message"]
    return f"{rec.event}: " + ", ".join(f"{k}={v}" for k, v in fields.items() if k not in ("event", "time"))
