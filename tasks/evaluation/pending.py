"""What the scheduled `evaluate-pending` covers: every checkpoint root `submit` recorded in the ledger (each with its
own suite and history directory, as the run recorded them) or the roots named, and which of them cannot be read.
No Prefect here."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from cluster.ledger import Ledger
from tasks.evaluation.request import PendingRequest
from tasks.paths import absolute
from tasks.training.storage import Storage


class Target(BaseModel):
    """One checkpoint root to cover: the suite its checkpoints are evaluated on and where their scores go."""

    root: str
    suite: str
    history_dir: str
    job: str = ""


def targets(request: PendingRequest, base: Path) -> list[Target]:
    """The roots to cover, each with its suite and history directory: with roots named, those (suite and history
    from the request, relative to `base`); else every run the ledger records (its own), and the roots older ledgers
    noted without a run record (the request's history directory)."""
    suite = request.suite or "core"
    history = absolute(request.history_dir or "evals", base, "history_dir")
    if request.roots:
        return [Target(root=absolute(r, base, "roots"), suite=absolute(suite, base, "suite") if suite.endswith((".yaml", ".yml"))
                       else suite, history_dir=history) for r in request.roots]
    ledger = Ledger(request.ledger or None)
    out = {rec.checkpoint_root: Target(root=rec.checkpoint_root, suite=request.suite or rec.suite or "core",
                                       history_dir=absolute(request.history_dir, base, "history_dir") if request.history_dir
                                       else rec.history_dir, job=rec.job)
           for rec in ledger.runs() if rec.checkpoint_root and (rec.suite or request.suite)}
    for noted in ledger.checkpoint_roots().values():
        if noted.root not in out:
            out[noted.root] = Target(root=noted.root, suite=request.suite or noted.suite or "core", history_dir=history,
                                     job=noted.job)
    return sorted(out.values(), key=lambda t: t.root)


def missing(target: Target) -> str | None:
    """Why `target.root` cannot be covered (it does not exist: a typo, or a job that has not committed yet), or
    None."""
    st = Storage(target.root)
    if st.local is not None and st.local.exists() and not st.local.is_dir():
        return f"checkpoint root {target.root} is a file, not a directory of step_NNNNNNNN checkpoints: name the root"
    exists = st.local.is_dir() if st.local is not None else st.fs.exists(st.root)
    return None if exists else (f"checkpoint root {target.root} does not exist: nothing there to evaluate (a typo, "
                                "or a job that has not committed a checkpoint yet)")
