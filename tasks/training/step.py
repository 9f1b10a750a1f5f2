"""The step: forward and backward over the rank's micro-batches, the gradient norm, and the optimizer update.

The step is split where the spike guard judges it: `compute()` ends with the step's one host sync (loss and
gradient norm, needed before the update), then either `apply()` or `discard()`.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.distributed as dist

from tasks.jobspec import JobSpec
from tasks.training.optrace import OpTracer
from tasks.training.setup import Data, Dist, Model


def lr_at(step: int, spec: JobSpec) -> float:
    """Linear warm-up, then cosine decay to 10% of `training.lr`."""
    t = spec.training
    warm = t.warmup_steps if t.warmup_steps is not None else min(100, t.steps // 10)
    if step <= warm:
        return t.lr * step / max(warm, 1)
    frac = (step - warm) / max(t.steps - warm, 1)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global gradient norm over plain and DTensor gradients (torch's clip refuses a mix), clipped in place."""
    norms = []
    for p in params:
        if p.grad is None:
            continue
        n = torch.linalg.vector_norm(p.grad, 2, dtype=torch.float32)
        norms.append(n.full_tensor() if hasattr(n, "full_tensor") else n)
    total = torch.linalg.vector_norm(torch.stack(norms), 2)
    coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))  # one host sync, not one per parameter
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total


def sync_time(dev: torch.device, traced: bool) -> float:
    """A timestamp for the op trace; on a GPU it waits for the queued kernels, so only on traced steps."""
    if traced and dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


class StepRunner:
    """One optimizer step of this rank: micro-batches with gradient accumulation (DDP syncs on the last only)."""

    def __init__(self, m: Model, data: Data, job: JobSpec, d: Dist, dev: torch.device, tracer: OpTracer) -> None:
        self.m, self.data, self.job, self.d, self.dev, self.tracer = m, data, job, d, dev, tracer
        self.data_s = 0.0
        """Seconds this rank spent reading and batching samples."""
        self._t_opt = 0.0

    def compute(self, step: int, mine: list[int], traced: bool) -> tuple[float, float]:
        """Forward and backward of step `step` over this rank's samples `mine`; (loss, gradient norm) after the
        cross-rank mean and clipping, with gradients left in place for `apply()`."""
        m, mb = self.m, self.data.micro
        for g in m.optimizer.param_groups:
            g["lr"] = lr_at(step, self.job)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.dev)
        n_mb = len(mine) // mb
        for i in range(n_mb):
            t_data = time.perf_counter()
            x, y = self.data.loader.batch(mine[i * mb:(i + 1) * mb])
            self.data_s += time.perf_counter() - t_data
            loss_sum += self._micro(x, y, i, n_mb, traced)
        self._t_opt = time.perf_counter()
        if self.d.on:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
            loss_sum /= self.d.world
        m.scaler.unscale_(m.optimizer)
        t = self.job.training
        max_norm = t.grad_clip if t.grad_clip > 0 else float("inf")
        gnorm = clip_grad_norm(m.params, max_norm) if self.d.tp > 1 else torch.nn.utils.clip_grad_norm_(m.params, max_norm)
        g = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
        # the step's one host sync: the spike check needs loss and grad norm before the update
        loss, norm = torch.stack([loss_sum.float(), g.float().to(loss_sum.device)]).tolist()
        return loss, norm

    def _micro(self, x: torch.Tensor, y: torch.Tensor, i: int, n_mb: int, traced: bool) -> torch.Tensor:
        m, dev = self.m, self.dev
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        last = i == n_mb - 1 or not hasattr(m.model, "no_sync")
        with contextlib.nullcontext() if last else m.model.no_sync():
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=m.amp_dtype, enabled=m.amp_dtype is not None):
                loss = m.model(x, y) / n_mb
            t1 = sync_time(dev, traced)
            self.tracer.record("forward-compute", t0, t1, mb_id=i)
            m.scaler.scale(loss).backward()
            self.tracer.record("backward-compute", t1, sync_time(dev, traced), mb_id=i)
        return loss.detach()

    def discard(self, step: int) -> None:
        """Drop the step's gradients (a spike or an fp16 overflow; the scaler lowers its scale on the latter)."""
        self.tracer.drop(step)
        self.m.optimizer.zero_grad(set_to_none=True)
        self.m.scaler.update()

    def apply(self, traced: bool) -> None:
        """The optimizer update with the step's gradients."""
        m = self.m
        m.scaler.step(m.optimizer)
        m.scaler.update()
        m.optimizer.zero_grad(set_to_none=True)
        if traced:
            self.tracer.record("optimizer", self._t_opt, sync_time(self.dev, traced))


def dp_hook(model: torch.nn.Module, tracer: OpTracer) -> None:
    """Time DDP's gradient all-reduce per bucket as `separate-grads-all-reduce` ops (no-op without DDP)."""
    if not hasattr(model, "register_comm_hook"):
        return

    def hook(_state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t0 = time.perf_counter()
        world = dist.get_world_size()
        fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            tracer.record("separate-grads-all-reduce", t0, time.perf_counter())
            return f.value()[0]

        return fut.then(done)

    # DDP checks the hook's annotations as objects; this module's are strings (postponed evaluation)
    hook.__annotations__ = {"_state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    model.register_comm_hook(None, hook)
