"""Retention: which step directories a run keeps (the newest committed ones plus the newest healthy one) and the
removal of a timeline a resume or rollback abandons. Manifests go first, so a half-finished removal never leaves a
committed step with missing shards."""

from __future__ import annotations

from tasks.training.checkpoint.manifest import step_dir
from tasks.training.checkpoint.read import committed, list_steps, read_manifest
from tasks.training.storage import Storage


def apply_retention(storage: Storage, keep: int) -> list[int]:
    """Keep the newest `keep` committed steps plus the newest healthy one; drop the rest and stale partials.

    Returns the removed steps. Manifests go first so a half-finished removal never leaves a committed step
    with missing shards.
    """
    steps = list_steps(storage)
    manifests = {s: m for s in steps if (m := read_manifest(storage, s)) is not None}
    if not manifests:
        return []
    newest = max(manifests)
    keep_set = set(sorted(manifests, reverse=True)[:keep])
    healthy = [s for s in sorted(manifests, reverse=True) if manifests[s].healthy]
    if healthy and not keep_set & set(healthy):
        keep_set.add(healthy[0])
    removed = []
    for s in steps:
        if s in keep_set or (s not in manifests and s > newest):
            continue  # uncommitted and newer than every commit: possibly a persist in flight elsewhere
        if s in manifests:
            storage.delete(f"{step_dir(s)}/manifest.json")
        storage.remove_dir(step_dir(s))
        removed.append(s)
    return removed


def discard_after(storage: Storage, step: int) -> list[int]:
    """Remove every step directory newer than `step` (a resume or rollback abandons that timeline)."""
    removed = [s for s in list_steps(storage) if s > step]
    for s in removed:
        storage.delete(f"{step_dir(s)}/manifest.json")
        storage.remove_dir(step_dir(s))
    return removed


def abandoned(storage: Storage, step: int) -> str | None:
    """Why `step`, committed once (a caller saw its manifest) and now without one, is gone by design, or None: newer
    than every step still committed, it was discarded when the run rolled back or resumed to an earlier step
    (`discard_after`: that timeline is abandoned). A step no one saw committed is not asked about here: a mistyped
    step is the user's error, not this."""
    kept = committed(storage)
    if not kept or step <= kept[0].step:
        return None
    return (f"step {step} of {storage.uri} was discarded when the run went back to step {kept[0].step} (a loss-spike "
            "rollback or a resume abandons the newer steps), by design; the run commits its steps again as it trains on")


def retired(storage: Storage, step: int) -> str | None:
    """Why `step`, which has no committed manifest under `storage`, is gone by design, or None: a step older than the
    newest committed one is not kept once newer steps are committed (`apply_retention`). Names the setting and the
    run's value where its manifests record it."""
    kept = committed(storage)
    if not kept or step >= kept[0].step or any(m.step == step for m in kept):
        return None
    keep = kept[0].trainer.get("keep")
    setting = f"training.checkpoint.keep = {keep}" if keep else "training.checkpoint.keep"
    return (f"step {step} of {storage.uri} was removed by retention, by design: the run keeps only its newest "
            f"checkpoints ({setting}; kept now: {sorted(m.step for m in kept)}); evaluate a kept step, or give the job "
            "a larger keep to keep more")
