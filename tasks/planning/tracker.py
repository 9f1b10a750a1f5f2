"""Ground truth without a GPU: run Frenzy's GPT for two steps under FakeTensorMode inside torch's MemTracker.

Fake tensors allocate nothing, so a multi-billion-parameter step is traced in seconds on a laptop; the
tracker counts tensor bytes by storage, i.e. what `torch.cuda.max_memory_allocated` would report for the
same eager kernels. Used by `benchmarks/marp_accuracy.py` and the tests to check the memory model.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from tasks.jobspec import JobSpec
from tasks.training.model import GPT
from tasks.training.setup import make_optimizer


def tracked_peak(job: JobSpec, micro_batch: int) -> dict[str, int]:
    """Peak tensor bytes of a steady-state step (second iteration) on one device, by tracker category."""
    t = job.training
    dtype = torch.bfloat16 if t.precision == "bf16" else torch.float32
    mixed = t.precision.endswith("-mixed")
    half = torch.float16 if t.precision.startswith("fp16") else torch.bfloat16
    prev = torch.get_default_dtype()
    with FakeTensorMode():
        torch.set_default_dtype(dtype)
        try:
            model = GPT(job.model, t.seq_len, t.attention, t.recompute)
        finally:
            torch.set_default_dtype(prev)
        # the trainer's own optimizer (fused AdamW on plain parameters, as on one GPU and with DDP)
        opt = make_optimizer(list(model.parameters()), t, plain=True)
        x = torch.randint(0, job.model.vocab, (micro_batch, t.seq_len))
        y = torch.randint(0, job.model.vocab, (micro_batch, t.seq_len))
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            for it in range(2):
                with torch.autocast("cpu", half, enabled=mixed):
                    loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if it == 0:
                    tracker.reset_mod_stats()
        snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
