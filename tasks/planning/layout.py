"""A parallel layout (how a job is split over GPUs) and the exact parameter counts of Frenzy's GPT."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.jobspec import JobSpec, ModelSpec


class Layout(BaseModel):
    """Data x tensor x pipeline degrees and the micro-batch of one forward pass."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    dp: int = Field(1, ge=1)
    """Data-parallel degree."""
    tp: int = Field(1, ge=1)
    """Tensor-parallel degree (Megatron column/row split of attention and MLP, vocab-parallel head)."""
    pp: int = Field(1, ge=1)
    """Pipeline-parallel degree (stages)."""
    micro_batch: int = Field(1, ge=1)
    """Sequences per forward pass per GPU."""
    vpp: int = Field(1, ge=1)
    """Virtual stages per pipeline rank (>1 means the interleaved 1F1B schedule)."""
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    """Pipeline schedule (interleaving is set by `vpp`)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norm and residual activations also split over the TP group."""

    @model_validator(mode="after")
    def _check(self) -> Layout:
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        return self

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def label(self) -> str:
        extra = (f" vpp={self.vpp}" if self.vpp > 1 else "") + (" sp" if self.sequence_parallel else "")
        return f"dp={self.dp} tp={self.tp} pp={self.pp} mb={self.micro_batch}{extra}"


def grad_accum_steps(job: JobSpec, layout: Layout) -> int:
    """Micro-batches per optimizer step on each data-parallel replica."""
    per_step = layout.dp * layout.micro_batch
    return max(1, job.training.global_batch // per_step)


def check_layout(job: JobSpec, layout: Layout) -> str | None:
    """Why this layout cannot run this job, or None when it can."""
    m, t = job.model, job.training
    if t.global_batch % (layout.dp * layout.micro_batch):
        return (f"global_batch={t.global_batch} is not divisible by dp*micro_batch="
                f"{layout.dp * layout.micro_batch}")
    if m.heads % layout.tp or m.n_kv_heads % layout.tp and layout.tp % m.n_kv_heads:
        return f"tp={layout.tp} does not divide heads={m.heads} / kv_heads={m.n_kv_heads}"
    if m.ffn % layout.tp:
        return f"tp={layout.tp} does not divide ffn_hidden={m.ffn}"
    if m.layers % (layout.pp * layout.vpp):
        return f"layers={m.layers} is not divisible by pp*vpp={layout.pp * layout.vpp}"
    if layout.sequence_parallel and t.seq_len % layout.tp:
        return f"seq_len={t.seq_len} is not divisible by tp={layout.tp} (sequence parallel)"
    return None


class ParamCounts(BaseModel):
    """Parameter counts of Frenzy's GPT, split the way parallelism splits them."""

    per_layer_linear: int
    """Linear weights + biases of one block (split by TP)."""
    per_layer_norm: int
    """Norm weights of one block (replicated under TP)."""
    embedding: int
    """Token embedding (vocab-parallel under TP)."""
    position: int
    """Learned position table (replicated)."""
    head: int
    """Untied output projection (0 when tied)."""
    final_norm: int
    layers: int

    @property
    def total(self) -> int:
        return (self.layers * (self.per_layer_linear + self.per_layer_norm) + self.embedding + self.position
                + self.head + self.final_norm)


def count_params(m: ModelSpec, seq_len: int) -> ParamCounts:
    h, hd, a, kv, f = m.hidden, m.head_dim, m.heads, m.n_kv_heads, m.ffn
    up = 2 * f if m.mlp == "swiglu" else f
    b = 1 if m.bias else 0
    qkv_out = (a + 2 * kv) * hd
    linear = h * qkv_out + (1 if m.attn_bias else 0) * qkv_out + a * hd * h + b * h + h * up + b * up + f * h + b * h
    norm = h * (2 if m.norm == "layernorm" and m.bias else 1)
    return ParamCounts(
        per_layer_linear=linear, per_layer_norm=2 * norm, embedding=m.vocab * h,
        position=seq_len * h if m.position == "learned" else 0,
        head=0 if m.tied_embeddings else m.vocab * h, final_norm=norm, layers=m.layers,
    )
