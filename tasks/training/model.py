"""Frenzy's GPT: one decoder stack built from a `ModelSpec` (GELU/SwiGLU, LayerNorm/RMSNorm, GQA, RoPE, tying).

Written so that what autograd saves is deliberate and identical on CPU and CUDA: norms and the loss run in
fp32 explicitly (not by autocast's per-device op lists), SwiGLU and RMSNorm are fused autograd functions that
save their inputs only, attention is SDPA (flash) or an explicit fp32-softmax path (math). The memory model
in `tasks/planning/memory.py` counts exactly these tensors.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tasks.jobspec import ModelSpec


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm saving only its input and 1/rms (as fused kernels do), in the input's dtype."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)
        rstd = torch.rsqrt(x.to(acc).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        g = grad.to(rstd.dtype) * weight.to(rstd.dtype)
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (grad.to(rstd.dtype) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


class _SwiGLUFn(torch.autograd.Function):
    """silu(a) * b over the gate and up projections; saves the two projections only and recomputes silu."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # in-place into two fresh buffers: the working set is 3 x ffn (da, db and the sigmoid)
        a, b = ctx.saved_tensors
        sig = torch.sigmoid(a)
        db = torch.mul(a, sig).mul_(grad)  # silu(a) * grad
        da = torch.ones_like(a).sub_(sig)  # d silu / da = sig * (1 + a * (1 - sig))
        da.mul_(a).add_(1).mul_(sig).mul_(b).mul_(grad)
        return da, db


def _cast_once(x: torch.Tensor) -> torch.Tensor:
    """Cast the input of several linears to the autocast dtype once: autocast would cast (and autograd save)
    one copy per linear, three for q/k/v."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return x.to(torch.get_autocast_dtype(dev))
    return x


def _norm(spec: ModelSpec) -> nn.Module:
    eps = spec.norm_eps or 1e-5
    if spec.norm == "rmsnorm":
        return RMSNorm(spec.hidden, eps)
    return nn.LayerNorm(spec.hidden, eps=eps, bias=spec.bias)


def rope_frequencies(spec: ModelSpec) -> torch.Tensor:
    """Inverse frequencies of the rotary pairs: base^(-2i/d), with Llama 3.1's scaling when the spec has it
    (long wavelengths divided by `factor`, short ones kept, a smooth blend between)."""
    hd = spec.head_dim
    inv = 1.0 / ((spec.rope_theta or 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    rs = spec.rope_scaling
    if rs is None:
        return inv
    low_wavelen = rs.original_max_position / rs.low_freq_factor
    high_wavelen = rs.original_max_position / rs.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    blended = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def rope_tables(seq_len: int, inv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
_ATTENTION_KERNELS = tuple(getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    if hasattr(torch.ops.aten, name))


def _op_checkpoint_context() -> tuple[object, object]:
    """Per-op selective checkpointing of one block (`recompute: op`): keep the outputs of every other matmul and
    of the attention kernel, recompute everything else (the policy torchtitan ships as `selective_ac_option=op`)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    count = {False: 0, True: 0}  # matmuls seen in the forward and in the recomputation

    def policy(ctx: object, func: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        if func in _MATMULS:
            count[ctx.is_recompute] += 1  # type: ignore[attr-defined]
            keep = count[ctx.is_recompute] % 2 == 1  # type: ignore[attr-defined]
        else:
            keep = func in _ATTENTION_KERNELS
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str, recompute: str = "none") -> None:
        super().__init__()
        self.spec, self.attention, self.recompute = spec, attention, recompute
        h, hd = spec.hidden, spec.head_dim
        self.norm1 = _norm(spec)
        # separate q/k/v and gate/up projections (same bytes and FLOPs as fused ones) so that tensor parallelism
        # shards each by heads or columns with plain column-wise DTensor sharding
        self.q = nn.Linear(h, spec.heads * hd, bias=spec.attn_bias)
        self.k = nn.Linear(h, spec.n_kv_heads * hd, bias=spec.attn_bias)
        self.v = nn.Linear(h, spec.n_kv_heads * hd, bias=spec.attn_bias)
        self.proj = nn.Linear(spec.heads * hd, h, bias=spec.bias)
        self.norm2 = _norm(spec)
        self.fc1 = nn.Linear(h, spec.ffn, bias=spec.bias)
        self.fc3 = nn.Linear(h, spec.ffn, bias=spec.bias) if spec.mlp == "swiglu" else None
        self.fc2 = nn.Linear(spec.ffn, h, bias=spec.bias)

    def _attend(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        hd = self.spec.head_dim
        # head counts from the outputs: under tensor parallelism each rank holds heads/tp of them
        q = self.q(x).view(b, s, -1, hd).transpose(1, 2)
        k = self.k(x).view(b, s, -1, hd).transpose(1, 2)
        v = self.v(x).view(b, s, -1, hd).transpose(1, 2)
        a, kv = q.shape[1], k.shape[1]
        if rope is not None:
            cos, sin = rope[0][:s], rope[1][:s]
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.attention == "flash":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != a)
        elif self.recompute == "selective" and self.training:
            o = torch.utils.checkpoint.checkpoint(self._math_core, q, k, v, use_reentrant=False)
        else:
            o = self._math_core(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(b, s, a * hd))

    def _math_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        a, kv, s = q.shape[1], k.shape[1], q.shape[2]
        if kv != a:
            k, v = k.repeat_interleave(a // kv, dim=1), v.repeat_interleave(a // kv, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        # softmax in fp32 whatever the compute dtype (Megatron's attention_softmax_in_fp32)
        probs = scores.masked_fill(mask, float("-inf")).float().softmax(-1).to(v.dtype)
        return probs @ v

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self._attend(_cast_once(self.norm1(x)), rope)
        hn = _cast_once(self.norm2(x))
        u = _SwiGLUFn.apply(self.fc1(hn), self.fc3(hn)) if self.fc3 is not None else \
            F.gelu(self.fc1(hn), approximate="tanh")
        return x + self.fc2(u)


NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """The attention kernels inference may use on `device`: on CUDA every one but cuDNN's, which builds a plan for
    each new sequence length; evaluation meets a new one every batch and a decode step every token, so a bf16
    batch's first generation ran 10-20x slower than the next on an H100, and scoring 64 new lengths 30x
    (benchmarks/results/decode_gpu_first.md). Elsewhere torch's own choice. Training keeps torch's choice (its
    sequence length is fixed)."""
    return sdpa_kernel(NO_CUDNN) if device.type == "cuda" else contextlib.nullcontext()


class GPT(nn.Module):
    """Decoder-only transformer; `forward(idx, targets)` returns the mean cross-entropy (fp32)."""

    def __init__(self, spec: ModelSpec, seq_len: int, attention: str = "flash",
                 recompute: str = "none") -> None:
        super().__init__()
        self.spec, self.seq_len, self.recompute = spec, seq_len, recompute
        self.wte = nn.Embedding(spec.vocab, spec.hidden)
        self.wpe = nn.Embedding(seq_len, spec.hidden) if spec.position == "learned" else None
        if spec.position == "rope":
            cos, sin = rope_tables(seq_len, rope_frequencies(spec))
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.blocks = nn.ModuleList(Block(spec, attention, recompute) for _ in range(spec.layers))
        self.norm_f = _norm(spec)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self._trunk(idx)
        # the loss is fp32 on every device; no reference to the half-precision logits is kept
        return F.cross_entropy(self.lm_head(self.norm_f(x)).float().flatten(0, 1), targets.flatten())

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-token logits (fp32) for every position of `idx` [batch, seq] (inference, evaluation)."""
        with attention_backends(idx.device):
            return self.lm_head(self.norm_f(self._trunk(idx))).float()

    def _trunk(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        rope = (self.rope_cos, self.rope_sin) if self.spec.position == "rope" else None
        for block in self.blocks:
            if self.recompute == "full" and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, rope, use_reentrant=False)
            elif self.recompute == "op" and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, rope, use_reentrant=False,
                                                      context_fn=_op_checkpoint_context)
            else:
                x = block(x, rope)
        return x

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
