"""Learned evaluation priors (tasks/evaluation/priors.py): the file folds runs in as moving averages, reads back as
records, and a suite takes the learned values where it has them."""

from __future__ import annotations

import json

import pytest

from tasks.evaluation.priors import ALPHA, PriorEntry, apply_priors, load_priors, update_priors
from tasks.evaluation.suite import load_suite


def test_two_runs_fold_into_a_moving_average_that_a_suite_then_uses(tmp_path):
    path = tmp_path / "priors.json"
    assert load_priors(path) == {}
    update_priors("cpu/gpt-l2", {"heldout-loss": {"infer_s_per_example": 2.0, "metric_s_per_example": 0.0}},
                  {"shm": 4.0}, path)
    update_priors("cpu/gpt-l2", {"heldout-loss": {"infer_s_per_example": 1.0, "metric_s_per_example": 0.5}},
                  {"shm": 2.0, "remote": 8.0}, path)
    entry = load_priors(path)["cpu/gpt-l2"]
    assert isinstance(entry, PriorEntry)
    prior = entry.datasets["heldout-loss"]
    assert prior.runs == 2 and prior.infer_s_per_example == pytest.approx((1 - ALPHA) * 2.0 + ALPHA * 1.0)
    assert entry.model_load_s == {"shm": pytest.approx((1 - ALPHA) * 4.0 + ALPHA * 2.0), "remote": 8.0}
    # the file keeps its JSON shape: key -> {datasets: {name: {infer, metric, runs}}, model_load_s}
    doc = json.loads(path.read_text())
    assert list(doc["cpu/gpt-l2"]) == ["datasets", "model_load_s"]
    assert list(doc["cpu/gpt-l2"]["datasets"]["heldout-loss"]) == ["infer_s_per_example", "metric_s_per_example", "runs"]

    suite = load_suite("core")
    planned, used = apply_priors(suite, "cpu/gpt-l2", path)
    d = next(d for d in planned.datasets if d.name == "heldout-loss")
    assert used == ["heldout-loss"] and d.infer_s_per_example == prior.infer_s_per_example
    assert planned.model_load_s.remote == 8.0 and planned.model_load_s.shm == entry.model_load_s["shm"]
    untouched, none_used = apply_priors(suite, "cuda/other", path)
    assert none_used == [] and untouched == suite
