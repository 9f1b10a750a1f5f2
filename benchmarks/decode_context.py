"""HumanEval generation as an evaluation trial runs it, on a job's model: seconds per batch and how many prompts do
not leave room for their new tokens in the context (those rows used to make their whole batch run a full window
per token).

The model is the job's architecture with random weights (the time of a step does not depend on the weights; the
tokens may stop at different places than a trained model's, so each row runs its full `--new` budget unless it
happens to emit a stop string). Runs whatever `tasks` package is first on PYTHONPATH, so two trees compare:

    PYTHONPATH=. python benchmarks/decode_context.py --job examples/jobs/gpu-1b.yaml --device cuda --start 98 --problems 32
    PYTHONPATH=/path/to/old/tree python benchmarks/decode_context.py ...   # the same on another version
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import yaml

from tasks.evaluation.datasets import EvalContext, HumanEval
from tasks.evaluation.engine import LM, ModelInfo
from tasks.jobspec import ModelSpec
from tasks.training.model import GPT


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(job: Path, device: str, start: int, problems: int, batch: int, new: int) -> dict:
    """Time HumanEval's `infer_batch` over `problems` problems from `start`, one batch of `batch` at a time."""
    raw = yaml.safe_load(job.read_text())
    spec = ModelSpec.model_validate(raw["model"])
    seq_len = int(raw["training"]["seq_len"])
    torch.manual_seed(0)
    lm = LM(GPT(spec, seq_len).state_dict(), ModelInfo(model=spec.model_dump(), seq_len=seq_len), device)
    # random weights emit ids past the byte range, which the byte tokenizer's stop check and decode refuse: time every
    # row's full budget (what an untrained or rambling model costs) and skip the text
    lm.stopper = lambda stop: None
    lm._cut = lambda ids, stop: ""
    ds = HumanEval({"max_new_tokens": new, "batch": batch}, EvalContext(seq_len=seq_len))
    examples = [ds.example(i) for i in range(start, min(start + problems, len(ds)))]
    long = sum(len(lm.encode(ex["prompt"])) > seq_len - new for ex in examples)
    ds.infer_batch(lm, examples[:batch][:2])  # warm-up: kernels, allocator
    per_batch = []
    for k in range(0, len(examples), batch):
        _sync(device)
        t0 = time.perf_counter()
        ds.infer_batch(lm, examples[k:k + batch])
        _sync(device)
        per_batch.append(round(time.perf_counter() - t0, 3))
    return {"job": str(job), "device": device, "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else "",
            "torch": torch.__version__, "python": platform.python_version(), "seq_len": seq_len, "start": start,
            "problems": len(examples),
            "batch": batch, "new_tokens": new, "prompts_past_room": long, "seconds_per_batch": per_batch,
            "seconds": round(sum(per_batch), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", type=Path, default=Path("examples/jobs/gpu-1b.yaml"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--start", type=int, default=0, help="the first HumanEval problem (98-129 hold 3 prompts of > 928 bytes)")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new", type=int, default=96, help="new tokens per problem (HumanEval's default budget)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    a = ap.parse_args()
    res = run(a.job, a.device, a.start, a.problems, a.batch, a.new)
    print(json.dumps(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
