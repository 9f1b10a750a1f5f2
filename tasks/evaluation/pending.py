"""What the scheduled `evaluate-pending` covers: every checkpoint root `submit` recorded in the ledger (each with its
own suite and history directory, as the run recorded them) or the roots named, and which of them cannot be read.
No Prefect here."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from cluster.ledger import Ledger
from tasks.evaluation.request import PendingRequest
from tasks.paths import absolute, place_key
from tasks.training.storage import Storage


class Target(BaseModel):
    """One checkpoint root to cover: the suite its checkpoints are evaluated on and where their scores go."""

    root: str
    suite: str
    history_dir: str
    job: str = ""


def targets(request: PendingRequest, base: Path) -> list[Target]:
    """The roots to cover, each with its suite and history directory: every run the ledger records (its own), and
    the roots older ledgers noted without a run record (the request's history directory); with roots named, only
    those, each taking its run's suite and history from the ledger when a recorded run commits there (however the
    root is spelled), else the request's (relative to `base`). A suite or history directory in the request wins."""
    history = absolute(request.history_dir or "evals", base, "history_dir")
    ledger = _ledger(request, base)
    known: dict[str, Target] = {}
    for noted in ledger.checkpoint_roots().values():
        known[place_key(noted.root)] = Target(root=noted.root, suite=noted.suite or "core", history_dir=history,
                                              job=noted.job)
    for rec in reversed(ledger.runs()):  # the most recently updated run of a root last: it wins
        if rec.checkpoint_root and (rec.suite or request.suite):
            known[place_key(rec.checkpoint_root)] = Target(root=rec.checkpoint_root, suite=rec.suite or "core",
                                                           history_dir=rec.history_dir, job=rec.job)
    if request.roots:
        named = [absolute(r, base, "roots") for r in request.roots]
        found = [known.get(place_key(r)) or Target(root=r, suite="core", history_dir=history) for r in named]
    else:
        found = list(known.values())
    out = [t.model_copy(update={"suite": _suite(request.suite, base) if request.suite else t.suite,
                                "history_dir": history if request.history_dir else t.history_dir}) for t in found]
    return sorted(out, key=lambda t: t.root)


def _ledger(request: PendingRequest, base: Path) -> Ledger:
    return Ledger(absolute(request.ledger, base, "ledger") if request.ledger and "://" not in request.ledger else None)


def no_roots(request: PendingRequest, base: Path) -> str:
    """Why `targets` found nothing to cover, naming the ledger it read (a worker with another HOME or FRENZY_LEDGER
    reads another one): it records no run, or only runs submitted with evaluation off (red team 41i N7, N19)."""
    ledger = _ledger(request, base)
    runs = ledger.runs()
    if not runs:
        return (f"no checkpoint roots: the ledger {ledger.url} records no submitted job and none were named (a ledger "
                "elsewhere? give `ledger` in the request, or set FRENZY_LEDGER on the worker)")
    off = sorted({r.job for r in runs if not r.suite})
    if not off:
        return f"no checkpoint roots: the ledger {ledger.url} records {len(runs)} run(s), none with a checkpoint root"
    return (f"no checkpoint roots to evaluate: the ledger {ledger.url} records {len(runs)} run(s), none with an "
            f"evaluation suite (submitted with evaluation off: {', '.join(off[:5])}{' ...' if len(off) > 5 else ''}); "
            "give `suite` in the request to evaluate their checkpoints")


def _suite(suite: str, base: Path) -> str:
    return absolute(suite, base, "suite") if suite.endswith((".yaml", ".yml")) else suite


def missing(target: Target) -> str | None:
    """Why `target.root` cannot be covered (it does not exist: a typo, or a job that has not committed yet), or
    None."""
    st = Storage(target.root)
    if st.local is not None and st.local.exists() and not st.local.is_dir():
        return f"checkpoint root {target.root} is a file, not a directory of step_NNNNNNNN checkpoints: name the root"
    exists = st.local.is_dir() if st.local is not None else st.fs.exists(st.root)
    return None if exists else (f"checkpoint root {target.root} does not exist: nothing there to evaluate (a typo, "
                                "or a job that has not committed a checkpoint yet)")
