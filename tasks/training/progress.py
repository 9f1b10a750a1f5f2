"""One line per trainer progress record (step, checkpoint, spike, resume, ...), for every front-end.

`frenzy train` prints these lines on stderr and the Prefect `train` task logs them, so both show the same words.
"""

from __future__ import annotations

from typing import Any

WARNING_EVENTS = frozenset({"spike", "resume", "checkpoint_rejected", "resharded", "lease_wait"})
"""Records a front-end should show as warnings rather than progress."""


def describe(rec: dict[str, Any]) -> str:
    """A human line for one record of `progress.jsonl`."""
    ev = rec["event"]
    if ev == "step":
        return (f"step {rec['step']}/{rec['steps']}  loss {rec['loss']:.4f}  gnorm {rec['grad_norm']:.3f}  "
                f"{rec['tokens_per_s']:,.0f} tok/s  ETA {rec['eta_s']:.0f}s")
    if ev == "checkpoint":
        return (f"checkpoint step {rec['step']} committed: {rec['uri']} ({rec['bytes'] / 1e6:.1f} MB, "
                f"blocked {rec['blocked_s'] * 1e3:.1f} ms, persisted in {rec['persist_s']:.2f}s)")
    if ev == "spike":
        if rec.get("action") == "trained_through":
            return f"loss spike at step {rec['step']} ({rec['reason']}) after several in a row: trained through it"
        done = (f"rolled back to step {rec['rolled_back_to']}" if rec.get("rolled_back_to") is not None
                else "update skipped (nothing to roll back to)")
        return f"loss spike at step {rec['step']} ({rec['reason']}): {done}, skipping samples {rec['skipped_samples']}"
    if ev in ("lease_wait", "resharded"):
        return rec["message"]
    return f"{ev}: " + ", ".join(f"{k}={v}" for k, v in rec.items() if k not in ("event", "time"))
