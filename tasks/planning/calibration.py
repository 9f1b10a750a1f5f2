"""What MARP learns from out-of-memory failures: each OOM the recovery policy diagnoses is recorded with what MARP
predicted; later plans for the same model shape and sequence length scale their predicted peak by the smallest
factor that explains every recorded OOM (the GPU's memory over the prediction that had fit it), and never offer a
layout that ran out of memory on that GPU type again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from pydantic import BaseModel, Field

from tasks.jobspec import JobSpec
from tasks.userfiles import LIMITS, read_bytes

log = logging.getLogger(__name__)


class OomObservation(BaseModel):
    """One out-of-memory failure of a planned layout."""

    model_key: str
    """sha256 (16 hex) of the model shape: the same model under any name."""
    model: str
    seq_len: int
    gpu_type: str
    gpu_memory_gib: float = Field(gt=0, allow_inf_nan=False)
    layout: str
    """Layout.label() of the plan that ran out of memory."""
    predicted_device_gib: float = Field(gt=0, allow_inf_nan=False)
    """Positive and finite: the calibration divides by it (a zero or NaN one is skipped as unreadable)."""
    job: str = ""
    line: str = ""
    """The log line the diagnosis took as the root cause."""
    time: float = 0.0


def model_key(job: JobSpec) -> str:
    return hashlib.sha256(json.dumps(job.model.shape_dump(), sort_keys=True).encode()).hexdigest()[:16]


def observations_path() -> Path:
    from tasks.pathvars import frenzy_home
    return frenzy_home() / "oom-observations.jsonl"


def record_oom(obs: OomObservation, path: Path | None = None) -> None:
    path = path or observations_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(obs.model_copy(update={"time": obs.time or time.time()}).model_dump_json() + "\n")


def load_observations(path: Path | None = None) -> list[OomObservation]:
    """The recorded observations; unreadable lines (a torn last line after a crash, bytes that are not UTF-8, a
    prediction of zero or NaN) are skipped with a warning naming the file and line."""
    path = path or observations_path()
    if not path.is_file():
        return []
    out = []
    for n, raw in enumerate(read_bytes(path, "OOM observations file", LIMITS["jsonl"]).splitlines(), 1):
        try:
            out.append(OomObservation.model_validate_json(raw))
        except ValueError as err:
            log.warning("%s:%d: skipped an unreadable OOM observation (%s); delete the line to silence this", path,
                        n, str(err).splitlines()[0])
    return out


class Calibration(BaseModel):
    """How a job's plans are corrected: a factor on the predicted peak, and layouts known to run out of memory."""

    factor: float = 1.0
    excluded: list[tuple[str, str]] = []
    """(gpu_type, layout label) pairs that ran out of memory."""
    observations: int = 0


def calibrate(job: JobSpec, observations: list[OomObservation]) -> Calibration:
    key = model_key(job)
    mine = [o for o in observations if o.model_key == key and o.seq_len == job.training.seq_len]
    if not mine:
        return Calibration()
    # the layout ran out on a GPU of gpu_memory_gib, so its real peak exceeded that: the prediction was short by at
    # least gpu_memory / predicted
    factor = max(1.0, *(o.gpu_memory_gib / o.predicted_device_gib for o in mine if o.predicted_device_gib > 0))
    return Calibration(factor=factor, excluded=sorted({(o.gpu_type, o.layout) for o in mine}), observations=len(mine))
