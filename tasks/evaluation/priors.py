"""Learned priors: seconds per example for inference and metrics, and model load times, from past runs.

Stored as JSON (default `$FRENZY_CACHE/eval-priors.json`), keyed by device kind and model shape, because a
prior is only a prior for one model on one kind of GPU. Each run folds its measurements in with an exponential
moving average; `apply_priors` returns a suite whose priors are the learned ones where known.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tasks.evaluation.suite import Suite
from tasks.training.data import cache_dir

ALPHA = 0.5
"""Weight of the newest run in the moving average."""


def priors_path() -> Path:
    return Path(os.environ.get("FRENZY_EVAL_PRIORS", cache_dir() / "eval-priors.json"))


def model_key(device: str, model: dict) -> str:
    """`cpu/gpt-l2-h64-v256`: device kind plus the shape that sets the cost per example."""
    return f"{device}/gpt-l{model.get('layers')}-h{model.get('hidden')}-v{model.get('vocab')}"


def load_priors(path: Path | None = None) -> dict:
    p = path or priors_path()
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as err:
        raise ValueError(f"priors file {p} is not JSON ({err}); delete it to start over") from None


def apply_priors(suite: Suite, key: str, path: Path | None = None) -> tuple[Suite, list[str]]:
    """The suite with learned priors substituted; also the names of the datasets that had one."""
    learned = load_priors(path).get(key, {})
    ds = learned.get("datasets", {})
    s = suite.model_copy(deep=True)
    used = []
    for d in s.datasets:
        if d.name in ds:
            d.infer_s_per_example = ds[d.name]["infer_s_per_example"]
            d.metric_s_per_example = ds[d.name]["metric_s_per_example"]
            used.append(d.name)
    for k in ("remote", "shm"):
        if k in learned.get("model_load_s", {}):
            setattr(s.model_load_s, k, learned["model_load_s"][k])
    return s, used


def update_priors(key: str, datasets: dict[str, dict[str, float]], model_load_s: dict[str, float],
                  path: Path | None = None) -> Path:
    """Fold one run's measurements in: `datasets[name] = {infer_s_per_example, metric_s_per_example}`."""
    p = path or priors_path()
    allp = load_priors(p)
    entry = allp.setdefault(key, {"datasets": {}, "model_load_s": {}})

    def ema(old: float | None, new: float) -> float:
        return new if old is None else (1 - ALPHA) * old + ALPHA * new

    for name, m in datasets.items():
        cur = entry["datasets"].get(name, {})
        entry["datasets"][name] = {k: ema(cur.get(k), v) for k, v in m.items()} | \
            {"runs": int(cur.get("runs", 0)) + 1}
    for k, v in model_load_s.items():
        entry["model_load_s"][k] = ema(entry["model_load_s"].get(k), v)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(allp, indent=1))
    os.replace(tmp, p)
    return p
