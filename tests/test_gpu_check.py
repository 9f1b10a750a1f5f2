"""benchmarks/gpu_check.py is run only on a borrowed GPU, so nothing else notices when the code it drives changes
under it (its part B indexed the trainer's result as a dict for a week after the result became a record). Its
`--smoke` sizes run both parts on the CPU; this keeps the script working between GPU sessions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
