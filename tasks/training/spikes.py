"""Loss-spike detection: a rolling z-score over loss and gradient norm (OLMo's rule, PaLM's remedy).

A step whose loss or gradient norm sits more than `zscore` standard deviations above the mean of the
previous `window` healthy steps (after `min_steps` of history) is a spike; so is a non-finite value. Its `kind`
says which: a `loss` spike (the batch already did harm, or is bad data), a `gradient` spike (the loss is in range and
only the gradient norm is out: a gradient norm's distribution has a heavy tail, and a small model's ordinary steps
reach z 6-14 several times in a thousand steps), or `nonfinite`. The trainer's spike guard (guard.py) decides what
to do with each. The detector's state is small and goes into every manifest, so a resume sees the same history.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Literal

SpikeKind = Literal["", "loss", "gradient", "nonfinite"]


@dataclass
class Verdict:
    spike: bool
    loss_z: float
    grad_z: float
    reason: str = ""
    kind: SpikeKind = ""
    """Empty for a healthy step."""


@dataclass(frozen=True)
class WindowStats:
    """The loss history's mean, standard deviation and length (a manifest's `loss` figures)."""

    mean: float
    """NaN for an empty history."""
    std: float
    window_len: int

    def to_dict(self) -> dict[str, float | int]:
        """The manifest's keys, in this order."""
        return asdict(self)


class SpikeDetector:
    def __init__(self, zscore: float = 6.0, window: int = 64, min_steps: int = 20) -> None:
        self.zscore, self.window, self.min_steps = zscore, window, min_steps
        self.loss: deque[float] = deque(maxlen=window)
        self.grad: deque[float] = deque(maxlen=window)
        self.last_spike_step: int | None = None

    @staticmethod
    def _z(hist: deque[float], x: float) -> float:
        n = len(hist)
        mean = sum(hist) / n
        var = sum((h - mean) ** 2 for h in hist) / max(n - 1, 1)
        # a floor on the spread: a perfectly flat history must not turn noise into a spike
        std = max(math.sqrt(var), 1e-3 * abs(mean), 1e-8)
        return (x - mean) / std

    def check(self, loss: float, grad_norm: float) -> Verdict:
        """Judge one step before its update is applied; a healthy step joins the history."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return Verdict(True, math.inf, math.inf, "non-finite loss or gradient norm", "nonfinite")
        if len(self.loss) < self.min_steps:
            self.loss.append(loss)
            self.grad.append(grad_norm)
            return Verdict(False, 0.0, 0.0)
        lz, gz = self._z(self.loss, loss), self._z(self.grad, grad_norm)
        if lz > self.zscore or gz > self.zscore:
            kind: SpikeKind = "loss" if lz > self.zscore else "gradient"
            z = lz if kind == "loss" else gz
            return Verdict(True, lz, gz, f"{'loss' if kind == 'loss' else 'gradient norm'} z-score {z:.1f} > "
                           f"{self.zscore:g}", kind)
        self.loss.append(loss)
        self.grad.append(grad_norm)
        return Verdict(False, lz, gz)

    def restart(self, loss: float, grad_norm: float) -> None:
        """Start the history again from this step (the run changed level; spikes are judged after `min_steps`)."""
        self.loss = deque([loss], maxlen=self.window)
        self.grad = deque([grad_norm], maxlen=self.window)

    def stats(self) -> WindowStats:
        n = len(self.loss)
        mean = sum(self.loss) / n if n else float("nan")
        std = math.sqrt(sum((h - mean) ** 2 for h in self.loss) / max(n - 1, 1)) if n > 1 else 0.0
        return WindowStats(mean=mean, std=std, window_len=n)

    def state(self) -> dict:
        return {"loss": list(self.loss), "grad": list(self.grad), "last_spike_step": self.last_spike_step}

    def load(self, state: dict) -> None:
        self.loss = deque(state.get("loss", []), maxlen=self.window)
        self.grad = deque(state.get("grad", []), maxlen=self.window)
        self.last_spike_step = state.get("last_spike_step")


class AboveChance:
    """A loss above that of a model that knows nothing: a uniform guess over the vocabulary scores ln(vocab) (5.55
    for 256 byte tokens). Above `factor` times that for `steps` steps in a row, the run is diverging, whatever the
    z-score says: with a learning rate too high from the first step the rolling history is out of range from its
    start, so no step stands out of it (red team 41j S15: lr 5.0 trained 180 steps at losses of 27-126, 0 spikes).
    Said once per run; training goes on (such a run can still come down; the warning names the fix)."""

    def __init__(self, vocab: int, factor: float = 1.5, steps: int = 20) -> None:
        self.chance = math.log(max(vocab, 2))
        self.limit, self.steps, self.factor = factor * self.chance, steps, factor
        self.vocab, self.run, self.said_at = vocab, 0, None

    def check(self, step: int, loss: float) -> str | None:
        """The warning, the first time the loss has stayed above the limit for `steps` steps; else None."""
        self.run = self.run + 1 if not math.isfinite(loss) or loss > self.limit else 0
        if self.run < self.steps or self.said_at is not None:
            return None
        self.said_at = step
        return (f"the loss has stayed above {self.limit:.2f} ({self.factor:g}x the {self.chance:.2f} of a uniform guess "
                f"over the {self.vocab:,} tokens) for {self.steps} steps in a row, {loss:.4g} at step {step}: the run is "
                "diverging (no spike stands out when every step is out of range): lower training.lr or lengthen "
                "training.warmup_steps")
