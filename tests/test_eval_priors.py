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


def _trial(id_, load, start, load_s, end, chunks, metrics_on="cpu", error=None):
    from tasks.evaluation.runner import ChunkResult, TrialResult

    return TrialResult(id=id_, node=0, gpu=0, load=load, start_s=start, load_s=load_s, end_s=end, error=error,
                       metrics_on=metrics_on,
                       chunks=[ChunkResult(dataset="heldout-loss", start=a, stop=b, infer_s=i, landed_s=end, metric_s=m)
                               for a, b, i, m in chunks])


def test_a_trials_fixed_cost_is_its_wall_time_less_its_chunks_work():
    # a warm process hid the import: `loaded` came after 0.1 s, but the slot was busy 1.4 s beyond the inference
    warm = _trial(0, "shm", 10.0, 0.1, 12.4, [(0, 32, 0.6, 0.3), (32, 64, 0.4, 0.2)])
    assert warm.fixed_s == pytest.approx(1.4)
    on_gpu = _trial(1, "remote", 0.0, 3.0, 6.0, [(0, 64, 1.0, 1.5)], metrics_on="gpu")
    assert on_gpu.fixed_s == pytest.approx(3.5)  # its scoring ran in the trial: not a fixed cost


def test_learning_folds_each_trials_fixed_cost_not_its_loaded_event(tmp_path):
    from tasks.evaluation.runner import EvalResult, learn

    trials = [_trial(0, "shm", 2.0, 3.0, 6.0, [(0, 32, 0.5, 0.0)]),  # cold: 3.5 s fixed
              _trial(1, "shm", 6.0, 0.05, 7.5, [(32, 64, 0.5, 0.0)]),  # warm: loaded at once, still 1.0 s fixed
              _trial(2, "shm", 7.5, 0.05, 30.0, [], error="killed")]  # a failed trial teaches nothing
    res = EvalResult(uri="file:///x", run="r", step=1, suite="core", schedule="elastic", nodes=1, gpus_per_node=1,
                     cpu_workers_per_node=1, makespan_s=8.0, predicted_makespan_s=8.0, precursor_s=[2.0], scores={},
                     trials=trials, out_dir=str(tmp_path), priors_used=[])
    path = learn(res, load_suite("core"), "cpu/k", tmp_path / "p.json")
    loads = load_priors(path)["cpu/k"].model_load_s
    assert loads["shm"] == pytest.approx((3.5 + 1.0) / 2)  # the loaded events alone would say 1.525
    assert loads["remote"] == pytest.approx(2.0)  # the precursor's copy
    assert load_priors(path)["cpu/k"].datasets["heldout-loss"].infer_s_per_example == pytest.approx(1.0 / 64)
