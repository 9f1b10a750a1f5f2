"""benchmarks/gpu_check.py is run only on a borrowed GPU, so nothing else notices when the code it drives changes
under it (its part B indexed the trainer's result as a dict for a week after the result became a record). Its
`--smoke` sizes run both parts on the CPU; this keeps the script working between GPU sessions."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cluster.catalog import default_catalog
from tasks.planning.layout import Layout, count_params
from tasks.planning.memory import predict_peak_memory
from tasks.training.model import GPT

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_gpu_check_smoke_runs_both_parts_without_an_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path),
                          "--smoke", "--device", "cpu", "--ckpt-dir", str(tmp_path / "ck")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert len(doc["marp"]) == 3 and not [r for r in doc["marp"] if "error" in r]
    runs = {k: v for k, v in doc["checkpoint"].items() if k in ("none", "every10")}
    assert set(runs) == {"none", "every10"} and not [k for k, v in runs.items() if "error" in v], runs
    assert runs["every10"]["tokens_per_s"] > 0 and doc["checkpoint"]["sync"]["bytes"] > 0


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", gc)  # its dataclasses look their module up there
    spec.loader.exec_module(gc)
    return gc


def _key(gc, model: dict, mb: int, over: dict) -> tuple:
    job = gc.make_job(model, mb, over, 8, "file:///x")
    t = job.training
    return (json.dumps(job.model.shape_dump(), sort_keys=True), mb, t.seq_len, t.precision, t.recompute, t.attention,
            t.optimizer)


def test_every_part_a_row_parses_and_builds_the_model_it_names():
    # the rows run on a borrowed GPU once; a typo in a shape (heads not dividing hidden, an unknown key) must fail
    # here. The model is built on the meta device (no memory) and its parameters counted against the planner's count
    gc = _gpu_check()
    for rows in [*gc.CONFIG_SETS.values(), gc.SMOKE_CONFIGS]:
        for name, model, mb, over in rows:
            job = gc.make_job(model, mb, over, 8, "file:///x")
            with torch.device("meta"):
                core = GPT(job.model, job.training.seq_len, attention=job.training.attention,
                           recompute=job.training.recompute)
            assert sum(p.numel() for p in core.parameters()) == count_params(job.model, job.training.seq_len).total, name


def test_heldout2_rows_are_new_shapes_that_fit_an_h100():
    # `--set heldout2` (written before it ran): 12 rows none of the 26 earlier ones has, at least five recomputing
    # (the full/op term's first unseen test), each predicted under the H100's ~76 GiB usable
    gc = _gpu_check()
    rows = gc.HELDOUT2_CONFIGS
    seen = {_key(gc, m, mb, o) for m_set in (gc.CONFIGS, gc.HELDOUT_CONFIGS) for _, m, mb, o in m_set}
    assert len(rows) == 12 and len({r[0] for r in rows}) == 12
    assert not [name for name, m, mb, o in rows if _key(gc, m, mb, o) in seen]
    jobs = [gc.make_job(m, mb, o, 8, "file:///x") for _, m, mb, o in rows]
    assert sum(j.training.recompute != "none" for j in jobs) >= 5
    assert {j.training.precision for j in jobs} == {"bf16-mixed", "fp16-mixed", "bf16", "fp32"}
    assert {1, 64} <= {r[2] for r in rows} and 8192 in {j.training.seq_len for j in jobs}
    gpu = default_catalog().get("H100-80GB")
    for (name, _, mb, _), job in zip(rows, jobs, strict=True):
        assert predict_peak_memory(job, Layout(micro_batch=mb), gpu).device_bytes < 76 * 2**30, name
    assert gc.CONFIG_SETS["heldout2"] is rows


def test_a_skipped_part_gets_no_section_in_the_markdown(tmp_path):
    """`--skip b` used to print a part B table of `None`s under the measured part A."""
    gc = _gpu_check()
    env = {"device": "cuda", "torch": "2", "python": "3.12", "cpus": 16, "date": "2026-11-27", "command": "x"}
    row = json.loads((ROOT / "benchmarks/results/gpu_h200.json").read_text())["marp"][0]  # a measured row
    md = gc.markdown(gc.Report(tmp_path, env, marp=[row]))
    assert "## A." in md and "## B." not in md
    md = gc.markdown(gc.Report(tmp_path, env, checkpoint={"model": "m", "runs": {}}))
    assert "## B." in md and "## A." not in md
