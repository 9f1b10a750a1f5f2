"""Operations the trainer's step dispatches per block and per step, the counts behind tasks/planning/steptime.py.

Runs Frenzy's own step (`setup.build_model`, `step.StepRunner.compute/apply`, as benchmarks/gpu_check.py drives them)
on the CPU for tiny shapes with 2 and 4 blocks under a `TorchDispatchMode` that counts every aten operation other than
views (no kernel runs for a view); the difference over 2 blocks is the per-block count, the rest the per-step one.
One step is counted after two warm-up steps (the optimizer's state exists by then).

    python benchmarks/step_ops.py        # a few seconds on a CPU; results in benchmarks/results/marp_step_time.md
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_check import make_job  # noqa: E402

from tasks.training import data as D  # noqa: E402
from tasks.training.optrace import OpTracer  # noqa: E402
from tasks.training.setup import Dist, build_model, load_data  # noqa: E402
from tasks.training.step import StepRunner  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402

VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "permute", "as_strided", "unsqueeze", "squeeze",
         "detach", "alias", "slice", "select", "split", "_reshape_alias", "reshape", "lift_fresh", "unbind", "empty",
         "empty_strided"}
TINY_GPT = {"preset": "gpt-tiny"}
TINY_LLAMA = {"preset": "llama2-7b", "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 512}
CASES: list[tuple[str, dict, dict]] = [
    ("GPT-2 block, fp32", TINY_GPT, {"precision": "fp32"}),
    ("+ RMSNorm", dict(TINY_GPT, norm="rmsnorm"), {"precision": "fp32"}),
    ("+ RoPE", dict(TINY_GPT, position="rope"), {"precision": "fp32"}),
    ("+ SwiGLU", dict(TINY_GPT, mlp="swiglu"), {"precision": "fp32"}),
    ("no biases", dict(TINY_GPT, bias=False), {"precision": "fp32"}),
    ("GPT-2 block, bf16-mixed", TINY_GPT, {}),
    ("no biases, bf16-mixed", dict(TINY_GPT, bias=False), {}),
    ("GPT-2, math attention", TINY_GPT, {"precision": "fp32", "attention": "math"}),
    ("GPT-2, math + selective", TINY_GPT, {"precision": "fp32", "attention": "math", "recompute": "selective"}),
    ("GPT-2 bf16-mixed, full recompute", TINY_GPT, {"recompute": "full"}),
    ("GPT-2 bf16-mixed, op recompute", TINY_GPT, {"recompute": "op"}),
    ("Llama block, bf16-mixed", TINY_LLAMA, {}),
    ("Llama bf16-mixed, full recompute", TINY_LLAMA, {"recompute": "full"}),
    ("Llama bf16-mixed, op recompute", TINY_LLAMA, {"recompute": "op"}),
]


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        self.n += func.overloadpacket.__name__ not in VIEWS
        return func(*args, **(kwargs or {}))


def count_step(model: dict, over: dict) -> int:
    """Non-view operations of the third training step of `model` (micro-batch 2, 64 tokens) on the CPU."""
    job = make_job(model, 2, {**over, "seq_len": 64}, 4, f"file://{tempfile.mkdtemp(prefix='stepops-')}/c")
    d, dev = Dist(), torch.device("cpu")
    data = load_data(job, d, Storage(job.training.checkpoint.uri))
    m = build_model(job, d, dev)
    runner = StepRunner(m, data, job, d, dev, OpTracer(0, 0, 0))
    m.model.train()
    cursor = D.Cursor()
    for step in (1, 2):
        runner.compute(step, data.loader.next_indices(cursor), False)
        runner.apply(False)
    counter = _Count()
    with counter:
        runner.compute(3, data.loader.next_indices(cursor), False)
        runner.apply(False)
    return counter.n


def main() -> int:
    print("| shape | operations per block | per step outside the blocks |\n|---|---|---|")
    for name, model, over in CASES:
        two, four = (count_step(dict(model, layers=n), over) for n in (2, 4))
        per_block = (four - two) // 2
        print(f"| {name} | {per_block} | {two - 2 * per_block} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
