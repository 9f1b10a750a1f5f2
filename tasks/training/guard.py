"""The spike guard: what the trainer does with a step the detector (spikes.py) flags, bounded, and counted.

A spike is handled by skipping its update. When the loss itself spiked and there is a healthy checkpoint before it
(and `spike.rollback`), the trainer also rolls back there and skips `skip_batches` batches from the spike's batch on
(PaLM's remedy: replaying the same data on the same weights would meet the same spike). A gradient-norm spike with
the loss in range drops only its update and its batch: nothing was harmed, and ordinary steps reach such gradient
norms several times per thousand (a rollback for each re-trained up to `every_steps` steps). With nothing to roll
back to (a spike before the first checkpoint, or `rollback: false`) only the spike's own batch is dropped: the
batches after it are unseen data, and skipping them would change what the model is trained on for nothing.

Skipping an update leaves the weights as they were, so when the weights rather than a batch caused the spike (the
loss curve changing level early in training, not a bad batch) every next batch is flagged too: the detector's
history no longer describes the run. So at most `spike.max_consecutive` spikes in a row (no healthy update past
them) are skipped; the next one is trained through and the detector's history restarts at the new level, with one
warning. A non-finite loss is never applied: past the bound the run stops with an error that names the fix.
fp16 loss-scale overflows (finite loss, non-finite gradients under GradScaler) are the scaler's business, not
spikes: their update is skipped and the scale lowered, bounded the same way.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from tasks.errors import FrenzyError
from tasks.jobspec import SpikeSpec
from tasks.training.spikes import AboveChance, SpikeDetector, Verdict

log = logging.getLogger("frenzy.train")

MAX_OVERFLOWS = 40
"""fp16 overflows in a row before the run stops: GradScaler starts at 2**16 and halves on each, so 40 reach
2**-24, below which no loss scale makes the gradients finite."""


class SpikeError(FrenzyError, RuntimeError):
    """The loss or gradients stay non-finite and nothing the guard may do helps; the message names the fix."""


class SpikeCounts(BaseModel):
    """What the spike guard did in one trainer invocation (result `spike_counts`, the summary and the report)."""

    spikes: int = 0
    """Steps the detector flagged."""
    rollbacks: int = 0
    """Spikes rolled back to a healthy checkpoint."""
    skipped_updates: int = 0
    """Spikes whose update was not applied."""
    skipped_samples: int = 0
    """Samples never trained on because of spikes (the spike batches and the windows skipped after rollbacks)."""
    trained_through: int = 0
    """Spikes applied after `max_consecutive` in a row (the guard gave up skipping; the history restarted)."""
    overflow_skips: int = 0
    """fp16 loss-scale overflows whose update GradScaler skipped (not spikes)."""
    diverging_at: int | None = None
    """The step at which the loss had stayed above chance (spikes.AboveChance) long enough to be said; None if never."""

    def summary(self) -> str:
        """One phrase for summaries and reports; empty when nothing happened."""
        diverged = (f"loss above chance for long from step {self.diverging_at}: diverging (lower training.lr)"
                    if self.diverging_at is not None else "")
        if not self.spikes and not self.overflow_skips:
            return diverged
        parts = [f"{self.skipped_updates} updates skipped ({self.skipped_samples:,} samples not trained on)",
                 f"{self.rollbacks} rollbacks", f"{self.trained_through} trained through"]
        if self.overflow_skips:
            parts.append(f"{self.overflow_skips} fp16 overflows")
        said = f"{self.spikes} spikes (loss or gradient norm): " + ", ".join(parts)
        return f"{said}; {diverged}" if diverged else said


class _Spike(BaseModel):
    step: int
    loss: float
    grad_norm: float
    reason: str


class SkippedSpike(_Spike):
    """A spike whose update was not applied (result.json `spikes`, the `spike` progress record; keys in this order)."""

    skipped_samples: list[int]
    """[first, end) of the samples left out."""
    rolled_back_to: int | None
    action: Literal["rolled_back", "update_skipped"]


class TrainedThroughSpike(_Spike):
    """A spike applied after `max_consecutive` in a row: the history restarted from it."""

    action: Literal["trained_through"] = "trained_through"
    rolled_back_to: None = None
    skipped_samples: None = None


SpikeRecord = Annotated[SkippedSpike | TrainedThroughSpike, Field(discriminator="action")]
"""One spike the guard handled, in result.json's `spikes`."""


@dataclass
class Decision:
    """The guard's answer for one step, before its update."""

    action: Literal["apply", "skip", "overflow"]
    verdict: Verdict
    record: TrainedThroughSpike | None = None
    """A progress record to emit (a spike trained through)."""
    diverging: str | None = None
    """A warning to emit once: the loss has stayed above chance (spikes.AboveChance)."""


@dataclass
class SpikeGuard:
    spec: SpikeSpec
    global_batch: int
    scaler_enabled: bool = False
    vocab: int | None = None
    """The model's vocabulary: the loss of a uniform guess (ln vocab) against which divergence is judged."""
    counts: SpikeCounts = field(default_factory=SpikeCounts)
    records: list[SkippedSpike | TrainedThroughSpike] = field(default_factory=list)
    _streak: int = 0
    _top: int = 0
    _overflows: int = 0
    _stuck: list[SkippedSpike] = field(default_factory=list)
    """The rollbacks since a healthy update last reached the step of the furthest spike among them."""

    def __post_init__(self) -> None:
        self.detector = SpikeDetector(self.spec.zscore, self.spec.window, self.spec.min_steps)
        self.chance = AboveChance(self.vocab) if self.vocab else None

    def judge(self, step: int, loss: float, grad_norm: float) -> Decision:
        """Step `step`'s loss and gradient norm: apply the update, skip it as a spike, or skip an fp16 overflow;
        with a warning the first time the loss has stayed above chance."""
        decision = self._judge(step, loss, grad_norm)
        if self.chance is not None and (said := self.chance.check(step, loss)) is not None:
            self.counts.diverging_at = step
            log.warning("%s", said)
            decision.diverging = said
        return decision

    def _judge(self, step: int, loss: float, grad_norm: float) -> Decision:
        if self.scaler_enabled and math.isfinite(loss) and not math.isfinite(grad_norm):
            self._overflows += 1
            self.counts.overflow_skips += 1
            if self._overflows > MAX_OVERFLOWS:
                raise SpikeError(f"gradients non-finite for {self._overflows} steps in a row at step {step} under "
                                 "fp16 loss scaling: lower training.lr, set training.grad_clip, or use bf16-mixed")
            return Decision("overflow", Verdict(True, 0.0, math.inf, "fp16 loss-scale overflow"))
        self._overflows = 0
        verdict = self.detector.check(loss, grad_norm)
        if not verdict.spike:
            return Decision("apply", verdict)
        self.counts.spikes += 1
        if self._streak < self.spec.max_consecutive:
            self._streak += 1
            self._top = max(self._top, step)
            return Decision("skip", verdict)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise SpikeError(f"loss or gradient norm non-finite at step {step} after {self._streak} spikes in a "
                             "row that skipping and rolling back did not cure: lower training.lr, set "
                             "training.grad_clip, or resume from an earlier checkpoint")
        return Decision("apply", verdict, self._train_through(step, loss, grad_norm, verdict))

    def _train_through(self, step: int, loss: float, grad_norm: float, verdict: Verdict) -> TrainedThroughSpike:
        self.counts.trained_through += 1
        self.detector.restart(loss, grad_norm)
        self.detector.last_spike_step = step  # checkpoints right after it are not rollback targets
        log.warning("loss spike at step %d (%s) after %d in a row: training through it; the spike history "
                    "restarts at loss %.4f (a change of level, not a bad batch)", step, verdict.reason,
                    self._streak, loss)
        self._streak = 0
        rec = TrainedThroughSpike(step=step, loss=loss, grad_norm=grad_norm, reason=verdict.reason)
        self.records.append(rec)
        return rec

    def may_roll_back(self, verdict: Verdict) -> bool:
        """A loss spike (or a non-finite one) rolls back; a gradient-norm spike whose loss is in range only skips its
        update and its batch: the weights are as they were, and a rollback would re-train up to `every_steps` steps
        for a step that did no harm (a heavy-tailed gradient norm flags several ordinary steps per thousand)."""
        return self.spec.rollback and verdict.kind != "gradient"

    def window(self, first_sample: int, rolled_back: bool) -> tuple[int, int]:
        """The samples a handled spike leaves out: `skip_batches` batches after a rollback, else its own batch."""
        return first_sample, first_sample + (self.spec.skip_batches if rolled_back else 1) * self.global_batch

    def skipped(self, step: int, loss: float, grad_norm: float, verdict: Verdict, window: tuple[int, int],
                rolled_back_to: int | None) -> SkippedSpike:
        """Count and log a skipped spike; returns its progress record."""
        self.counts.skipped_updates += 1
        self.counts.skipped_samples += window[1] - window[0]
        # after a rollback the spike lies in an abandoned timeline (its batches are skipped): commits of the new
        # timeline are healthy, so a later spike rolls back to them, not again past them
        # a gradient-norm spike's skipped update left the weights as they were: checkpoints after it stay healthy
        if verdict.kind != "gradient":
            self.detector.last_spike_step = step if rolled_back_to is None else None
        rec = SkippedSpike(step=step, loss=loss, grad_norm=grad_norm, reason=verdict.reason,
                           skipped_samples=list(window), rolled_back_to=rolled_back_to,
                           action="rolled_back" if rolled_back_to is not None else "update_skipped")
        self.records.append(rec)
        if rolled_back_to is not None:
            self.counts.rollbacks += 1
            log.warning("loss spike at step %d (%s): rolled back to step %d, skipping samples %s", step,
                        verdict.reason, rolled_back_to, window)
        elif verdict.kind == "gradient":
            log.info("gradient-norm spike at step %d (%s, loss in range): update skipped, samples %s", step,
                     verdict.reason, window)
        elif self._streak == 1:  # one warning per run of spikes; the bound keeps the rest few
            log.warning("loss spike at step %d (%s): update skipped (no healthy checkpoint to roll back to), "
                        "skipping samples %s; after %d in a row the run trains through", step, verdict.reason,
                        window, self.spec.max_consecutive)
        else:
            log.info("loss spike at step %d (%s): update skipped, samples %s", step, verdict.reason, window)
        return rec

    def passed(self, step: int) -> None:
        """A healthy update made step `step`: at or past every spike of the streak, the streak ends; at or past
        every spike that was rolled back, the rollbacks recovered."""
        if step >= self._top:
            self._streak = 0
        if self._stuck and step >= max(r.step for r in self._stuck):
            self._stuck.clear()

    def bound_rollbacks(self, rec: SkippedSpike) -> None:
        """Count a rollback toward the bound: more than `max_rollbacks` in a row (at least `max_consecutive`, what
        one spike may take) that never got the run past the furthest spike they answered are not recovery but a
        loop (red team 41o S10: lr 30 rolled back to step 20 from a non-finite loss at step 50 158 times in
        100 s); the run stops, its newest commit the checkpoint rolled back to."""
        if rec.rolled_back_to is None:
            return
        self._stuck.append(rec)
        bound = max(self.spec.max_rollbacks, self.spec.max_consecutive)
        if len(self._stuck) > bound:
            raise SpikeError(stuck_message(self._stuck, bound))


def stuck_message(stuck: list[SkippedSpike], bound: int) -> str:
    """What a run stopped for rolling back without getting past its spike says, and the fixes."""
    top = max(r.step for r in stuck)
    targets = ", ".join(str(t) for t in sorted({r.rolled_back_to for r in stuck if r.rolled_back_to is not None}))
    bad = [r.step for r in stuck if not (math.isfinite(r.loss) and math.isfinite(r.grad_norm))]
    if bad:
        cause = (f"the loss or gradient norm was non-finite at step {bad[0]} each time the run reached it ({len(bad)} times)"
                 if len(set(bad)) == 1 else f"the loss or gradient norm was non-finite at steps "
                 f"{', '.join(map(str, sorted(set(bad))))}")
    else:
        cause = f"the loss spiked at steps {', '.join(map(str, sorted({r.step for r in stuck})))}"
    return (f"{len(stuck)} rollbacks to step {targets} in a row never got the run past step {top}: {cause}; the run "
            f"stopped, its newest checkpoint step {stuck[-1].rolled_back_to}: lower training.lr, lengthen "
            "training.warmup_steps or set training.grad_clip and resume, or raise training.spike.max_rollbacks "
            f"(now {bound}) to let it retry longer")
