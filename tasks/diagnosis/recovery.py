"""What to do when training fails (Acme section 6.1), decided from the diagnosis; no Prefect here.

- infrastructure (a GPU, NVLink, node, network, storage or collective fault; a hang): check the allocation's nodes
  (two-round pairwise test, when it holds two or more), cordon the faulty ones, place again on healthy GPUs and
  resume from the newest verified checkpoint;
- OutOfMemoryError: place again with the next plan that has more memory per GPU (none left: stop), and record the
  observation for the memory model;
- other restartable framework errors (an unclassified RuntimeError, a killed data-loader worker, a rank killed by
  a signal): resume once more;
- script and configuration errors, and logs no rule explains: stop at once with the diagnosis (a restart fails
  the same way, or a person must look);
- at most `max_restarts` restarts in all; a loss spike is not a failure (the trainer rolls back by itself).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from tasks.diagnosis.diagnose import Diagnosis

ActionKind = Literal["resume", "replan", "stop"]


class Action(BaseModel):
    kind: ActionKind
    node_check: bool = False
    reason: str


def decide(d: Diagnosis, restarts_done: int, max_restarts: int) -> Action:
    """The action for a failure diagnosed as `d` after `restarts_done` restarts."""
    what = f"{d.type} ({d.category})" + (f" on rank {d.rank}" if d.rank is not None else "") + \
        (f", node {d.node}" if d.node else "")
    if restarts_done >= max_restarts:
        return Action(kind="stop", reason=f"{what}: {restarts_done} restart(s) already, the limit is {max_restarts}")
    if d.category == "unknown":
        return Action(kind="stop", reason=f"no rule explains the failure; a person must look ({d.mitigation})")
    if not d.restartable:
        return Action(kind="stop", reason=f"{what} is not restartable: {d.mitigation}")
    if d.type == "OutOfMemoryError":
        return Action(kind="replan", reason=f"{what}: {d.mitigation}")
    if d.category == "infrastructure":
        return Action(kind="resume", node_check=True, reason=f"{what}: {d.mitigation}")
    return Action(kind="resume", reason=f"{what}: {d.mitigation}")
