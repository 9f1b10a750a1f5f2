"""Learned priors: seconds per example for inference and metrics, and model load times, from past runs.

Stored as JSON (default `$FRENZY_CACHE/eval-priors.json`), keyed by device kind and model shape, because a
prior is only a prior for one model on one kind of GPU. Each run folds its measurements in with an exponential
moving average; `apply_priors` returns a suite whose priors are the learned ones where known.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tasks.evaluation.suite import Suite
from tasks.training.data import cache_dir
from tasks.userfiles import UserFileError, load_json, path_kind

ALPHA = 0.5
"""Weight of the newest run in the moving average."""


def priors_path() -> Path:
    return Path(os.environ.get("FRENZY_EVAL_PRIORS", cache_dir() / "eval-priors.json"))


def model_key(device: str, model: dict) -> str:
    """`cpu/gpt-l2-h64-v256`: device kind plus the shape that sets the cost per example."""
    return f"{device}/gpt-l{model.get('layers')}-h{model.get('hidden')}-v{model.get('vocab')}"


_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class DatasetPrior(BaseModel):
    """One dataset's learned seconds per example (moving averages over `runs` runs)."""

    model_config = ConfigDict(extra="allow")

    infer_s_per_example: _Seconds
    metric_s_per_example: _Seconds
    runs: int = Field(0, ge=0)


class PriorEntry(BaseModel):
    """The priors of one device kind and model shape (`model_key`)."""

    datasets: dict[str, DatasetPrior] = Field(default_factory=dict)
    model_load_s: dict[str, _Seconds] = Field(default_factory=dict)
    """`remote` / `shm` -> seconds to load the model that way."""


_PRIORS = TypeAdapter(dict[str, PriorEntry])


def load_priors(path: Path | None = None) -> dict[str, PriorEntry]:
    """The priors file as written by `update_priors` ({} when there is none); a file that is not one (not JSON, a
    negative or non-finite time, a FIFO) is refused naming the file and the fix, never half-used."""
    p = path or priors_path()
    try:
        if path_kind(p, "priors file") == "missing":
            return {}
        return _PRIORS.validate_python(load_json(p, "evaluation priors file"))
    except UserFileError as err:
        raise UserFileError(f"{err}; or delete the priors file to start over (they are relearned)") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise UserFileError(f"{p}: not a priors file: {where}: {first['msg']}; delete it to start over (the priors "
                            "are relearned from the next runs)") from None


def apply_priors(suite: Suite, key: str, path: Path | None = None) -> tuple[Suite, list[str]]:
    """The suite with learned priors substituted; also the names of the datasets that had one."""
    learned = load_priors(path).get(key, PriorEntry())
    s = suite.model_copy(deep=True)
    used = []
    for d in s.datasets:
        if (prior := learned.datasets.get(d.name)) is not None:
            d.infer_s_per_example = prior.infer_s_per_example
            d.metric_s_per_example = prior.metric_s_per_example
            used.append(d.name)
    for k in ("remote", "shm"):
        if k in learned.model_load_s:
            setattr(s.model_load_s, k, learned.model_load_s[k])
    return s, used


def update_priors(key: str, datasets: dict[str, dict[str, float]], model_load_s: dict[str, float],
                  path: Path | None = None) -> Path:
    """Fold one run's measurements in: `datasets[name] = {infer_s_per_example, metric_s_per_example}`."""
    p = path or priors_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.parent / f".{p.name}.lock", "a") as lock:  # one read-modify-write at a time: no update is lost
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _fold(p, key, datasets, model_load_s)


def _fold(p: Path, key: str, datasets: dict[str, dict[str, float]], model_load_s: dict[str, float]) -> Path:
    allp = load_priors(p)
    entry = allp.setdefault(key, PriorEntry())

    def ema(old: float | None, new: float) -> float:
        return new if old is None else (1 - ALPHA) * old + ALPHA * new

    for name, m in datasets.items():
        cur = entry.datasets[name].model_dump() if name in entry.datasets else {}
        entry.datasets[name] = DatasetPrior.model_validate({k: ema(cur.get(k), v) for k, v in m.items()} |
                                                           {"runs": int(cur.get("runs", 0)) + 1})
    for k, v in model_load_s.items():
        entry.model_load_s[k] = ema(entry.model_load_s.get(k), v)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({k: e.model_dump() for k, e in allp.items()}, indent=1))
    os.replace(tmp, p)
    return p
