"""Where one GPU's share of a training step goes: matmuls, memory-bound kernels and the host's kernel launches.

Each term comes from the GPU's catalog fields (cluster/catalog.py: dense TFLOP/s for the job's precision,
`mem_bw_gbs`) and from what Frenzy's trainer runs (tasks/training/model.py, step.py, setup.py):

- **matmuls**: the linears, the output head and attention (flash: causal, its backward recomputing the scores;
  math: the whole square), recompute's extra forward, at `MATMUL_EFF` of the peak for the job's precision.
  fp32 runs at the catalog's fp32 (non-tensor) rate: the trainer never enables TF32 (no `allow_tf32` or
  `set_float32_matmul_precision` anywhere in it) and torch's default for CUDA matmuls is full fp32;
- **memory-bound kernels**: the norms, casts, activations, residual adds and RoPE of each block, the fp32 logits and
  the loss, the math path's fp32 softmax, the optimizer's and the gradient clip's passes over weights, gradients and
  moments, autocast's weight casts; bytes over `mem_bw_gbs` at `MEM_BW_EFF`;
- **host**: PyTorch dispatches every kernel from Python; a step of a small model is bound by that, not by the GPU.
  Operations per block counted on the trainer's own step (`TorchDispatchMode` over `StepRunner.compute/apply`, 2 and
  4 blocks, benchmarks/results/marp_step_time.md), each costing `LAUNCH_S`, or `HOOKED_LAUNCH_S` under the Python
  dispatch mode of per-op selective recompute (`recompute: op`). The step is the sum of the three: the trainer
  syncs with the host once per step (loss and gradient norm before the update), and on the H100 rows the sum fits
  better than the longer of GPU and host (log-RMS error 0.110 against 0.127, which needs one constant more).

Fitted on the H100's 14 rows of benchmarks/results/gpu_h100.json only (least squares on log step time) and checked
without refitting on the H200's 12 rows of gpu_h200.json: benchmarks/results/marp_step_time.md. The placement
simulator keeps `constant_mfu_step_s` (cluster/jobperf.py `SIM_STEP_MODEL`): with this model `has` lost more than 2%
of its edge over `fcfs` on round-17 windows, where the new model makes some GPU types faster than the trace's
reference A100 (HBM2e bandwidth) and narrows the gap between fast and slow types (host time is the same on every GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cluster.catalog import GPUType
from tasks.jobspec import JobSpec
from tasks.planning.layout import Layout, count_params, grad_accum_steps

MATMUL_EFF = 0.78
"""Fraction of the datasheet dense peak the matmuls sustain (fitted; cuBLAS reaches 70-80% on large GEMMs). No fall-off
for small matmuls: fitted as `x w / (w + half)` (w = tokens per micro-batch x hidden), the half-point went to zero
(benchmarks/results/marp_step_time.md); what makes small models slow on the H100 rows is the host."""
MEM_BW_EFF = 0.8
"""Fraction of the datasheet bandwidth elementwise and reduction kernels reach on large tensors (not fitted:
STREAM-like copies reach 80-90% of HBM bandwidth)."""
LAUNCH_S = 23.5e-6
"""Host seconds per dispatched operation in eager PyTorch with autograd and autocast (fitted)."""
HOOKED_LAUNCH_S = 119e-6
"""Host seconds per operation run under `recompute: op`'s Python dispatch mode (its policy function is called and
its outputs cached for each op; fitted)."""

FWD_OPS_SHARE = 0.35
"""Share of a block's operations in its forward (counted: 24 of 68 for a GPT block, 47 of 122 for a Llama block,
recomputed once more under `recompute: full`)."""
OP_RC_EXTRA_SHARE = 0.30
"""Operations `recompute: op` adds, as a share of the block's (counted: 20 of 68, 43 of 122)."""
STEP_OPS = 45
"""Operations per step outside the blocks: embedding, head, loss, clip, fused AdamW (counted 38-52)."""


@dataclass(frozen=True)
class StepCost:
    """One GPU's share of an optimizer step on `layout`, before pipeline bubbles and communication."""

    matmul_s: float
    memory_s: float
    host_s: float

    @property
    def step_s(self) -> float:
        return self.matmul_s + self.memory_s + self.host_s


def _attention_flops_per_token(job: JobSpec) -> tuple[float, float]:
    """(forward + backward, one more forward) matmul FLOPs of attention per token per block."""
    sh = job.training.seq_len * job.model.hidden
    if job.training.attention == "math":  # the whole s x s square: QK^T and PV, 2 s h each forward, twice back
        return 12 * sh, 4 * sh
    # flash skips the masked half; its backward recomputes QK^T: 2 matmuls forward, 5 backward, of s h each
    return 7 * sh, 2 * sh


def matmul_flops(job: JobSpec, layout: Layout) -> float:
    """Matmul FLOPs one GPU runs per optimizer step (linears, head, attention, recompute's extra forward)."""
    m, t = job.model, job.training
    pc = count_params(m, t.seq_len)
    tokens = t.global_batch * t.seq_len / layout.dp
    blocks = m.layers / layout.pp
    attn, attn_fwd = _attention_flops_per_token(job)
    flops = blocks * tokens * (6 * pc.per_layer_linear + attn) / layout.tp
    flops += 6 * m.vocab * m.hidden * tokens / (layout.tp * layout.pp)
    if t.recompute == "full":
        flops += blocks * tokens * (2 * pc.per_layer_linear + attn_fwd) / layout.tp
    elif t.recompute == "op":  # the recomputed matmuls (k, proj, and fc3 or fc2) run their forward again
        h, f, kv = m.hidden, m.ffn, m.n_kv_heads / m.heads
        mats = [h * h, h * h * kv, h * h * kv, h * h] + ([h * f, h * f, h * f] if m.mlp == "swiglu" else [h * f, h * f])
        flops += 2 * blocks * pc.per_layer_linear * tokens * sum(mats[1::2]) / sum(mats) / layout.tp
    elif t.recompute == "selective" and t.attention == "math":
        flops += blocks * tokens * attn_fwd / layout.tp
    return flops


def _dtypes(job: JobSpec) -> tuple[int, int]:
    """(bytes of the residual stream and of the fp32-or-not optimizer state, bytes of the matmul inputs)."""
    p = job.training.precision
    return (2 if p == "bf16" else 4), (4 if p == "fp32" else 2)


def _block_bytes_per_token(job: JobSpec, layout: Layout) -> float:
    """Memory-bound traffic of one block per token, forward + backward (the backward moves about twice the
    forward's bytes: it reads the saved input and the incoming gradient and writes a gradient)."""
    m, t = job.model, job.training
    r, c = _dtypes(job)
    h, f = m.hidden, m.ffn / layout.tp
    # two norms (fp32 in, fp32 out) each followed by one cast, the attention output's copy, two residual adds
    fwd = h * (10 * r + 6 * c)
    fwd += (5 if m.mlp == "swiglu" else 2) * c * f  # silu, its product / gelu: read and write the ffn activation
    if m.position == "rope":  # cat, two products and a sum over q and k
        fwd += 8 * c * m.head_dim * (m.heads + m.n_kv_heads) / layout.tp
    if t.attention == "math":  # the s x s scores: scale, mask, fp32 softmax and its casts, per head
        fwd += (6 * c + 16) * m.heads / layout.tp * t.seq_len
    return 3 * fwd


def memory_bytes(job: JobSpec, layout: Layout) -> float:
    """Bytes one GPU's memory-bound kernels move per optimizer step."""
    m, t = job.model, job.training
    r, c = _dtypes(job)
    pc = count_params(m, t.seq_len)
    tokens = t.global_batch * t.seq_len / layout.dp
    micro = grad_accum_steps(job, layout)
    traffic = m.layers / layout.pp * tokens * _block_bytes_per_token(job, layout)
    # the logits: written in c, cast to fp32, log-softmax, its gradient, cast back (fp32 loss on every device)
    traffic += (3 * c + 32) * m.vocab * tokens / (layout.tp * layout.pp)
    params = pc.total / (layout.tp * layout.pp)
    # fused AdamW reads weight, gradient and two moments and writes three; the clip reads and rescales gradients
    traffic += 10 * r * params
    if t.precision.endswith("-mixed"):  # autocast casts each weight per micro-batch, the gradient comes back fp32
        traffic += micro * (16 + (6 if t.recompute in ("full", "op") else 0)) * params
    return traffic


def host_ops(job: JobSpec, layout: Layout) -> tuple[float, float]:
    """(operations the host dispatches per step, those among them under `recompute: op`'s dispatch mode)."""
    m, t = job.model, job.training
    per_block = 38.0  # a GPT-2 block in fp32, counted
    per_block += 28 if m.norm == "rmsnorm" else 0  # two RMSNorms (Frenzy's autograd function) over two LayerNorms
    per_block += 24 if m.position == "rope" else 0
    per_block += 15 if m.mlp == "swiglu" else 0
    linears = 7 if m.mlp == "swiglu" else 6
    per_block -= 0 if m.bias else linears
    if t.precision.endswith("-mixed"):  # autocast: 3 operations per weight, 2 per bias
        per_block += linears * (3 + (2 if m.bias else 0))
    if t.attention == "math":
        per_block += 20 + (9 if t.recompute == "selective" else 0)
    hooked = 0.0
    if t.recompute == "full":
        per_block *= 1 + FWD_OPS_SHARE
    elif t.recompute == "op":
        hooked = per_block * (FWD_OPS_SHARE + OP_RC_EXTRA_SHARE)
        per_block *= 1 + OP_RC_EXTRA_SHARE
    micro = grad_accum_steps(job, layout)
    blocks = m.layers / layout.pp
    return micro * blocks * per_block + STEP_OPS, micro * blocks * hooked


def single_gpu_cost(job: JobSpec, layout: Layout, gpu: GPUType) -> StepCost:
    """Matmul, memory-bound and host seconds of one GPU's share of the step."""
    peak = gpu.tflops(job.training.precision) * 1e12
    matmul = matmul_flops(job, layout) / (peak * MATMUL_EFF)
    memory = memory_bytes(job, layout) / (gpu.mem_bw_gbs * 1e9 * MEM_BW_EFF)
    ops, hooked = host_ops(job, layout)
    return StepCost(matmul, memory, (ops - hooked) * LAUNCH_S + hooked * HOOKED_LAUNCH_S)


StepModel = Callable[[JobSpec, Layout, GPUType], float]
"""One GPU's seconds of compute per optimizer step of a layout (before pipeline bubbles and communication)."""


def fitted_step_s(job: JobSpec, layout: Layout, gpu: GPUType) -> float:
    """This module's model: matmul + memory-bound + host seconds (what `frenzy plan` ranks by)."""
    return single_gpu_cost(job, layout, gpu).step_s


CONSTANT_MFU = 0.45
"""The model before the fitted one: every step at 45% of the dense peak (Megatron/torchtitan report 35-55%)."""


def constant_mfu_step_s(job: JobSpec, layout: Layout, gpu: GPUType) -> float:
    """6 x params x tokens + causal attention FLOPs (recompute's extra forward included) at CONSTANT_MFU of the peak.
    The placement simulator's ground truth still (cluster/jobperf.py, cluster/sim_engine.py): with the fitted model
    `has` lost more than 2% of its edge over `fcfs` on some windows (benchmarks/results/marp_step_time.md)."""
    m, t = job.model, job.training
    pc = count_params(m, t.seq_len)
    tokens = t.global_batch * t.seq_len
    dense = pc.layers * pc.per_layer_linear + (pc.head or pc.embedding)
    flops = 6 * dense * tokens + 12 * m.layers * m.hidden * t.seq_len * tokens / 2  # causal attention
    if t.recompute == "full":
        flops *= 4 / 3
    elif t.recompute == "op":  # the recomputed matmuls (k, proj, and fc3 or fc2) run their forward again
        h, f, kv = m.hidden, m.ffn, m.n_kv_heads / m.heads
        mats = [h * h, h * h * kv, h * h * kv, h * h] + ([h * f, h * f, h * f] if m.mlp == "swiglu" else [h * f, h * f])
        flops += 2 * pc.layers * pc.per_layer_linear * tokens * sum(mats[1::2]) / sum(mats)
    return flops / (layout.gpus * gpu.tflops(t.precision) * 1e12 * CONSTANT_MFU)
