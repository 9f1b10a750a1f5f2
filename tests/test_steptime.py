"""The planner's step-time model against the real GPU steps of benchmarks/results/gpu_h100.json (the rows it was fitted
on) and gpu_h200.json (the rows it was checked on, never fitted): benchmarks/results/marp_step_time.md."""

import importlib.util
import json
import sys
from functools import cache
from pathlib import Path

import pytest

from cluster.catalog import default_catalog
from cluster.inventory import load_cluster
from cluster.jobperf import JobKey, layout_step_time
from cluster.sim_engine import Perf
from tasks.planning.layout import Layout
from tasks.planning.plans import estimate_step_time
from tasks.planning.steptime import constant_mfu_step_s, single_gpu_cost

ROOT = Path(__file__).parents[1]


@cache
def _gpu_check():
    """benchmarks/gpu_check.py, whose CONFIGS and make_job built the measured jobs."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _errors(results: str, set_name: str, gpu_name: str) -> dict[str, float]:
    """Predicted / measured - 1 of each measured row (the planner's estimate for one GPU: no communication)."""
    g = _gpu_check()
    configs = {c[0]: c for c in getattr(g, set_name)}
    gpu = default_catalog().get(gpu_name)
    out = {}
    for row in json.loads((ROOT / "benchmarks" / "results" / results).read_text())["marp"]:
        _, model, mb, over = configs[row["config"]]
        job = g.make_job(model, mb, over, 8, "file:///unused")
        pred = estimate_step_time(job, Layout(micro_batch=mb), gpu, gpu.link_gbs, gpu.link_gbs, 1)
        out[row["config"]] = pred / row["step_s"] - 1
    return out


@pytest.mark.parametrize(("results", "set_name", "gpu", "rows", "bound"), [
    ("gpu_h100.json", "CONFIGS", "H100-80GB", 14, 0.20),  # fitted here: worst 18.9% (constant MFU: 85.5%)
    ("gpu_h200.json", "HELDOUT_CONFIGS", "H200-141GB", 12, 0.25),  # checked, not fitted: worst 24.1% (before: 75.2%)
])
def test_each_measured_step_is_predicted_within_the_fit(results, set_name, gpu, rows, bound):
    errs = _errors(results, set_name, gpu)
    assert len(errs) == rows
    off = {k: f"{v:+.1%}" for k, v in errs.items() if abs(v) > bound}
    assert not off, f"predicted step time off by more than {bound:.0%}: {off}"


def test_small_models_are_host_bound_and_large_ones_matmul_bound():
    g = _gpu_check()
    h100 = default_catalog().get("H100-80GB")
    small = g.make_job({"preset": "gpt-100m"}, 8, {"seq_len": 1024}, 8, "file:///unused")
    large = g.make_job({"preset": "gpt-1b"}, 16, {"seq_len": 2048, "recompute": "full"}, 8, "file:///unused")
    s, big = single_gpu_cost(small, Layout(micro_batch=8), h100), single_gpu_cost(large, Layout(micro_batch=16), h100)
    assert s.host_s > s.matmul_s and s.host_s > s.memory_s
    assert big.matmul_s > big.memory_s > big.host_s
    # fp32 runs at the catalog's fp32 rate (the trainer enables no TF32): 15x the bf16 matmul time for the same job
    fp32 = g.make_job({"preset": "gpt-1b"}, 16, {"seq_len": 2048, "recompute": "full", "precision": "fp32"}, 8,
                      "file:///unused")
    ratio = single_gpu_cost(fp32, Layout(micro_batch=16), h100).matmul_s / big.matmul_s
    assert ratio == pytest.approx(h100.bf16_tflops / h100.fp32_tflops)



def test_the_simulator_keeps_the_constant_mfu_model():
    # the fitted model moved has/fcfs by more than the keep rule's 2% on round 17 (marp_step_time.md): the replay and
    # has's plans in the simulator keep 45% of the peak, while the planner ranks by the fitted model
    key = JobKey("gpt2-350m", 8, 1024, "bf16-mixed")
    a100 = default_catalog().get("A100-40GB-SXM")
    job, lay = key.spec(), Layout(micro_batch=8)
    replay = layout_step_time(key, "A100-40GB-SXM", lay)
    assert replay == pytest.approx(constant_mfu_step_s(job, lay, a100))
    assert replay != pytest.approx(estimate_step_time(job, lay, a100, a100.link_gbs, 12.5, 1), rel=0.05)
    plans = Perf(load_cluster("phoebe"), default_catalog()).plans(key)
    one = next(p for p in plans if p.gpu_type == "A100-40GB-SXM" and p.gpus == 1)
    assert one.est_step_time_s == pytest.approx(constant_mfu_step_s(job, one.layout, a100))
