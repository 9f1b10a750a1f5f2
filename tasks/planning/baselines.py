"""Published peak-memory formulas kept as named baselines, so MARP's improvement is shown side by side.

- `frenzy`: the Frenzy paper's MARP formula (section IV-A): 20W/t static plus Korthikanti's activations
  s*b*h*l*(10 + 24/t + 5as/(ht)), with W = V*h + l*(12h^2 + 13h). No PP, ZeRO, flash, logits or overheads.
- `megatron`: Megatron-LM's theoretical memory (weights + optimizer at 18 or 6 + 12/dp bytes per parameter
  on the most loaded stage, per-layer activations s*b*h*(10 + 24/t) or 34/t with SP and selective recompute,
  in-flight 1F1B micro-batches, the interleaving penalty, logits when pp == 1, a 5% activation overhead).
Both return bytes (they model tensor memory only).
"""

from __future__ import annotations

from tasks.jobspec import JobSpec
from tasks.planning.layout import Layout, grad_accum_steps


def frenzy_formula_bytes(job: JobSpec, layout: Layout) -> float:
    m, t = job.model, job.training
    h, nl, a, s, b, tp = m.hidden, m.layers, m.heads, t.seq_len, layout.micro_batch, layout.tp
    w = m.vocab * h + nl * (12 * h * h + 13 * h)
    return 20 * w / tp + s * b * h * nl * (10 + 24 / tp + 5 * a * s / (h * tp))


def megatron_formula_bytes(job: JobSpec, layout: Layout) -> float:
    m, t = job.model, job.training
    h, s, b, tp, pp, dp, v = m.hidden, t.seq_len, layout.micro_batch, layout.tp, layout.pp, layout.dp, m.vocab
    gated = 1.5 if m.mlp == "swiglu" else 1.0
    norm = 1 if m.norm == "rmsnorm" else 2
    attn = 2 * h * h * (1 + m.n_kv_heads / m.heads)
    per_layer = 2 * h * (m.ffn * gated + norm) + attn
    emb = h * v
    shard = (per_layer * m.layers / pp + emb) / tp
    if not m.tied_embeddings and pp == 1:
        shard += emb / tp
    bpp = 6 + 12 / dp if (t.distributed_optimizer or t.zero_stage >= 1) else 18
    weights = shard * bpp
    micro = grad_accum_steps(job, layout)
    sbh = s * b * h
    if layout.sequence_parallel and t.recompute == "selective":
        act = sbh * (18 + 4 * m.ffn / h) * m.layers
    else:
        act = sbh * (10 + 24 / tp) * m.layers
    act += 8 * s * b * pp + sbh * pp  # embedding input and dropout, in-flight on the first stage
    if layout.vpp > 1:
        act *= 1 + (pp - 1) / (pp * layout.vpp)
    elif pp > 1:
        act *= min(1.0, micro / pp)
    if layout.sequence_parallel and t.recompute == "selective":
        if pp == 1:
            act += sbh * 4 * (1 + v / h)
        act /= tp
    else:
        if pp == 1:
            act += (s * b * v / tp + sbh) * 2
        act *= 1.05
    return weights + act
