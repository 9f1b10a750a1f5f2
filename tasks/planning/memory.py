"""MARP's memory model: peak GPU memory of one training step for a job under a parallel layout.

The step is walked in phases on the most loaded pipeline stage: the start of backward (all activations
saved, loss gradients live), the end of backward (all gradients), and the optimizer step (moments plus
foreach temporaries). Tensor bytes follow what Frenzy's GPT (`tasks/training/model.py`) saves; the
conventions of the other implementations a layout implies are documented in docs/memory-model.md.
Three totals: `allocated` (tensor bytes), `reserved` (caching allocator), `device` (nvidia-smi).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from cluster.catalog import GPUType
from tasks.jobspec import JobSpec
from tasks.planning.layout import Layout, ParamCounts, count_params, grad_accum_steps

GiB = 1024**3
NCCL_GIB_PER_COMM = {2: 0.53, 3: 0.67}  # per communicator by group size (2, >2 ranks); nccl#964 on A100


class MemoryEstimate(BaseModel):
    """Predicted peak memory of one GPU (the most loaded pipeline stage)."""

    allocated_bytes: int
    """Peak tensor bytes (torch.cuda.max_memory_allocated)."""
    reserved_bytes: int
    """Peak bytes held by the caching allocator (torch.cuda.max_memory_reserved)."""
    device_bytes: int
    """Peak device memory in use as nvidia-smi shows it (reserved + CUDA context + NCCL)."""
    breakdown: dict[str, int]
    """Terms at the peak; they sum to `device_bytes` (the tensor terms sum to `allocated_bytes`)."""
    peak_phase: str
    """Where the peak happens: `backward_start`, `backward_end` or `optimizer_step`."""
    phases: dict[str, int]
    """Allocated bytes at each phase."""
    stage: int = 0
    """The pipeline stage the estimate is for (the most loaded one)."""
    params_per_gpu: int = Field(0)
    """Parameters held by this GPU (before ZeRO-3 sharding)."""

    @property
    def device_gib(self) -> float:
        return self.device_bytes / GiB


class _Conv(BaseModel):
    """Bytes-per-element conventions implied by precision and ZeRO/distributed optimizer."""

    param: float
    grad: float
    master: float  # separate fp32 master copy held by the optimizer (0 when params are the master)
    state: float  # optimizer moments per parameter
    temp: float  # foreach temporaries during step, per optimizer-owned parameter
    residual: int  # bytes of the residual stream element
    compute: int  # bytes of the compute (matmul) dtype
    autocast_copies: bool  # half-precision weight copies made by autocast and saved for backward
    fused_qkv: bool = False  # Megatron: one fused q/k/v projection whose output v (a view) keeps alive


def conventions(job: JobSpec) -> _Conv:
    t = job.training
    moments = {"adamw": 2, "adam": 2, "sgd": 1}[t.optimizer]
    mixed = t.precision.endswith("-mixed")
    if t.precision == "fp32":
        return _Conv(param=4, grad=4, master=0, state=4 * moments, temp=4 if moments == 2 else 0,
                     residual=4, compute=4, autocast_copies=False)
    if t.precision == "bf16":
        return _Conv(param=2, grad=2, master=0, state=2 * moments, temp=2 if moments == 2 else 0,
                     residual=2, compute=2, autocast_copies=False)
    assert mixed
    if t.zero_stage == 3:  # FSDP2 with MixedPrecisionPolicy(bf16 params, fp32 reduce): sharded fp32 master
        return _Conv(param=4, grad=4, master=0, state=4 * moments, temp=4 if moments == 2 else 0,
                     residual=2, compute=2, autocast_copies=False)
    if t.zero_stage in (1, 2) or t.distributed_optimizer:
        # Megatron / DeepSpeed: half-precision model weights, fp32 grads, fp32 master + moments (fused Adam)
        return _Conv(param=2, grad=4, master=4, state=4 * moments, temp=0, residual=2, compute=2,
                     autocast_copies=False, fused_qkv=t.distributed_optimizer)
    # PyTorch AMP: fp32 params are the master copy; autocast makes bf16 weight copies
    return _Conv(param=4, grad=4, master=0, state=4 * moments, temp=4 if moments == 2 else 0,
                 residual=4, compute=2, autocast_copies=True)


def layer_activation_bytes(job: JobSpec, layout: Layout, tokens: int) -> tuple[float, float]:
    """(saved bytes, backward working-set bytes) of one transformer block for `tokens` tokens on one GPU."""
    m, t = job.model, job.training
    cv = conventions(job)
    r, c = cv.residual, cv.compute
    h, a, f, s = m.hidden, m.heads, m.ffn, t.seq_len
    kvr = m.n_kv_heads / a
    tp = layout.tp
    rep = tp if layout.sequence_parallel else 1  # divisor of the replicated (norm/residual) part
    norm_stats = 8 if m.norm == "layernorm" else 4
    if t.recompute in ("full", "op"):
        saved = r * h / rep  # the block's input, kept by the checkpoint
        if t.recompute == "op":
            # torchtitan's per-op policy: the outputs of every other matmul (q, v, fc1 and, with SwiGLU, fc2;
            # k, proj and fc3 are recomputed) and of the attention kernel are kept, everything else is
            # recomputed. fc2's output before the TP reduction is a full-width partial sum on every rank.
            saved += c * (h + h * kvr + f) / tp + (c * h if m.mlp == "swiglu" else 0)
            if t.attention == "flash":
                saved += (c * h + 4 * a) / tp  # output + fp32 logsumexp
        none = job.model_copy(update={"training": t.model_copy(update={"recompute": "none"})})
        # backward re-materialises one block: its activations (less what the checkpoint kept, which the
        # recomputation reuses) plus that block's own backward working set
        kept = (saved - r * h / rep) * tokens
        return saved * tokens, sum(layer_activation_bytes(none, layout, tokens)) - kept
    repl = 2 * (r * h + norm_stats) + 2 * c * h  # two norm inputs + inputs of qkv and fc1
    # q, k, v (separate projections; with RoPE the rotated q and k take the place of the projections' outputs,
    # which nothing else keeps alive)
    shard = c * h * (1 + 2 * kvr)
    if cv.fused_qkv:
        # Megatron-Core's linear_qkv writes q, k and v into one buffer and splits it into views; RoPE makes new
        # q and k, and the attention kernel saves v, a view, so the whole buffer (its q and k parts too) lives on
        shard += c * h * (1 + kvr)
    if t.attention == "flash":
        shard += c * h + 4 * a  # output (also proj's input: same storage) + fp32 logsumexp
    else:
        shard += c * h  # proj's input: contiguous copy of the attention output
        if t.recompute != "selective":
            shard += 4 * a * s + (c * a * s if c != 4 else 0)  # fp32 softmax + its half copy
            if kvr < 1:
                shard += 2 * c * h  # repeated k and v
    shard += (3 if m.mlp == "swiglu" else 2) * c * f
    per_token = repl / rep + shard / tp
    saved = per_token * tokens
    mask = s * s if t.attention == "math" and t.recompute != "selective" else 0
    # the backward of one block holds a few activation-sized gradients at once: 0.24-0.32 of the block's
    # saved bytes under MemTracker over GELU/SwiGLU, flash/math and all precisions (0.3 is the upper side)
    work = 0.3 * saved
    if t.attention == "math" and t.recompute == "selective":  # the recomputed fp32 softmax and its half copy
        work += (4 + (c if c != 4 else 0)) * a * s * tokens / tp
    return saved + mask, work


def _inflight(layout: Layout, stage: int, micro_batches: int) -> float:
    """Micro-batches whose activations a stage holds at once (in units of its own layers)."""
    p, m = layout.pp, micro_batches
    if p == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    if layout.vpp > 1 and stage == 0:
        return p * (1 + (p - 1) / (p * layout.vpp)) * min(1.0, m / p)
    return float(min(m, p - stage))


def predict_peak_memory(job: JobSpec, layout: Layout, gpu: GPUType | None = None) -> MemoryEstimate:
    """Peak memory of one GPU training `job` under `layout`; overheads from `gpu` (defaults if None)."""
    stages = {0, layout.pp - 1}
    best = max((_stage_estimate(job, layout, st, gpu) for st in sorted(stages)), key=lambda e: e.device_bytes)
    return best


@dataclass(frozen=True)
class _Weights:
    """Bytes of the weight-sized tensors on one stage's GPU, after tensor parallelism and ZeRO sharding."""

    params: float
    """Parameters of the stage on this GPU (before ZeRO-3 sharding)."""
    p_bytes: float
    master_bytes: float
    state_bytes: float
    grad_bytes: float
    temp_bytes: float
    copies: float
    """Autocast's half-precision weight copies saved for backward."""
    fsdp: float
    """ZeRO-3: unsharded blocks and collective buffers."""


def _weights(job: JobSpec, layout: Layout, stage: int, cv: _Conv, pc: ParamCounts) -> _Weights:
    m, t = job.model, job.training
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    first, last = stage == 0, stage == pp - 1
    n_layers = m.layers // pp
    emb = pc.embedding / tp if first or (last and m.tied_embeddings and pp > 1) else 0
    head = pc.head / tp if last else 0
    other = n_layers * pc.per_layer_norm + (pc.position if first else 0) + (pc.final_norm if last else 0)
    params = n_layers * pc.per_layer_linear / tp + head + emb + other
    # ZeRO sharding divisors
    z = t.zero_stage
    opt_div = dp if (z >= 1 or t.distributed_optimizer) else 1
    grad_div = dp if z >= 2 else 1
    param_div = dp if z == 3 else 1
    # autocast casts every linear weight (and the tied/untied head) to half precision, saved for backward; under
    # full or per-op recompute a block keeps none of its copies past its forward (the cast is re-run with the
    # block in backward, one block at a time): only the head's copy and one block's stay (H100, 2026-11-25)
    head_copy = (pc.embedding if m.tied_embeddings else pc.head) / tp if last else 0
    held = 1 if t.recompute in ("full", "op") else n_layers
    copies = (held * pc.per_layer_linear / tp + head_copy) * 2 if cv.autocast_copies else 0
    # Frenzy's trainer takes fused AdamW for plain (non-DTensor) parameters, which updates in place: the
    # foreach temporary exists only with tensor parallelism or FSDP2 (setup.make_optimizer)
    fused = tp == 1 and z < 3
    # two unsharded half-precision blocks (current + prefetch), all-gather and reduce-scatter
    fsdp = pc.per_layer_linear / tp * (2 * 2 + 2 + 4) if z == 3 else 0.0
    return _Weights(params=params, p_bytes=params * cv.param / param_div, master_bytes=params * cv.master / opt_div,
                    state_bytes=params * cv.state / opt_div, grad_bytes=params * cv.grad / grad_div,
                    temp_bytes=0.0 if fused else params * cv.temp / opt_div, copies=copies, fsdp=fsdp)


def _activations(job: JobSpec, layout: Layout, stage: int, cv: _Conv, micro: int) -> tuple[float, float, float, float]:
    """Saved activations of the in-flight micro-batches, the saved logits, the loss gradient, and one layer's
    backward working set."""
    m, t = job.model, job.training
    tp, last = layout.tp, stage == layout.pp - 1
    tokens = layout.micro_batch * t.seq_len
    layer_saved, layer_work = layer_activation_bytes(job, layout, tokens)
    acts = m.layers // layout.pp * layer_saved * _inflight(layout, stage, micro)
    logits = 0.0
    loss_grad = 0.0
    if last:
        rep = tp if layout.sequence_parallel else 1
        acts += ((cv.residual * m.hidden + (8 if m.norm == "layernorm" else 4)) / rep
                 + cv.compute * m.hidden) * tokens
        logits = 4 * m.vocab / tp * tokens  # fp32 log-softmax output saved by the loss
        loss_grad = 2 * 4 * m.vocab / tp * tokens  # its gradient in and out at the start of backward
    return acts, logits, loss_grad, layer_work


def _peak_terms(w: _Weights, grads_live: float, acts: float, logits: float, loss_grad: float,
                layer_work: float) -> tuple[dict[str, float], str, dict[str, float]]:
    """Allocated bytes at each phase of the step, the peak phase, and the tensor terms at that peak."""
    static = w.p_bytes + w.master_bytes + w.state_bytes
    phases = {
        "backward_start": static + grads_live + w.copies + acts + logits + max(loss_grad, layer_work) + w.fsdp,
        "backward_end": static + w.grad_bytes + layer_work + w.fsdp,
        "optimizer_step": static + w.grad_bytes + w.temp_bytes,
    }
    peak_phase = max(phases, key=lambda k: phases[k])
    terms = {
        "parameters": w.p_bytes, "master_weights": w.master_bytes, "optimizer_states": w.state_bytes,
        "gradients": 0.0, "weight_copies": 0.0, "activations": 0.0, "logits_loss": 0.0,
        "backward_transient": 0.0, "optimizer_temporaries": 0.0, "fsdp_buffers": 0.0,
    }
    if peak_phase == "backward_start":
        terms.update(gradients=grads_live, weight_copies=w.copies, activations=acts,
                     logits_loss=logits + loss_grad if loss_grad >= layer_work else logits,
                     backward_transient=0.0 if loss_grad >= layer_work else layer_work, fsdp_buffers=w.fsdp)
    elif peak_phase == "backward_end":
        terms.update(gradients=w.grad_bytes, backward_transient=layer_work, fsdp_buffers=w.fsdp)
    else:
        terms.update(gradients=w.grad_bytes, optimizer_temporaries=w.temp_bytes)
    return phases, peak_phase, terms


# Full and op-level recompute free activations after the forward and make them again, in other sizes, during the
# backward, so the caching allocator holds more blocks it cannot reuse: reserved/allocated was 1.04-1.19 (mean
# 1.126) on the five such rows of one H100 against 1.01-1.16 (mean 1.063) without recompute
# (benchmarks/results/gpu_h100.md); the extra 0.05 is that difference less the per-block term. Selective recompute
# keeps most activations and showed no such excess.
RECOMPUTE_FRAG = 0.05


def _stage_estimate(job: JobSpec, layout: Layout, stage: int, gpu: GPUType | None) -> MemoryEstimate:
    cv = conventions(job)
    w = _weights(job, layout, stage, cv, count_params(job.model, job.training.seq_len))
    micro = grad_accum_steps(job, layout)
    acts, logits, loss_grad, layer_work = _activations(job, layout, stage, cv, micro)
    # gradients already live when backward starts: persistent DDP/Megatron buffers, or accumulation
    dp = layout.dp
    grads_live = w.grad_bytes if (dp > 1 and job.training.zero_stage < 3) or micro > 1 else 0.0
    phases, peak_phase, terms = _peak_terms(w, grads_live, acts, logits, loss_grad, layer_work)
    breakdown = {k: int(round(v)) for k, v in terms.items()}
    allocated = sum(breakdown.values())
    frag = (gpu.alloc_frag if gpu else 0.06) + (RECOMPUTE_FRAG if job.training.recompute in ("full", "op") else 0.0)
    # caching allocator: fragmentation plus rounding of large blocks to 2 MiB (~1 MiB per live block)
    breakdown["allocator"] = int(allocated * frag + (job.model.layers // layout.pp * 12 + 16) * 2**20)
    reserved = allocated + breakdown["allocator"]
    breakdown["cuda_context"] = int((gpu.context_gib if gpu else 0.5) * GiB)
    breakdown["nccl"] = int(GiB * sum(NCCL_GIB_PER_COMM[min(g, 3)] for g in (dp, layout.tp, layout.pp) if g > 1))
    device = reserved + breakdown["cuda_context"] + breakdown["nccl"]
    return MemoryEstimate(
        allocated_bytes=allocated, reserved_bytes=reserved, device_bytes=device, breakdown=breakdown,
        # the peak phase reports the sum of the (per-term rounded) breakdown, so the two always agree
        peak_phase=peak_phase, phases={k: allocated if k == peak_phase else int(v) for k, v in phases.items()},
        stage=stage,
        params_per_gpu=int(w.params),
    )
