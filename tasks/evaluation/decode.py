"""Batched, KV-cached greedy decoding over Frenzy's GPT (the evaluation engine's generation path).

The prompts of a batch are left-padded to one width; each row's positions count from its first real token (so
learned and rotary position encodings see what an unpadded run sees) and its padding is masked out of every
attention. The prompt is run once (prefill) into a key/value cache of the model's context length; each new token
then costs one position through the network instead of the whole window. A prompt is left-truncated so that it and
its new tokens fit the context (`seq_len - max_new_tokens` prompt tokens, as lm-eval's Hugging Face backend does), so
generation never leaves the cache; only a budget of new tokens as long as the context itself makes rows outgrow it,
and those fall back to the sliding window (a full forward of the last `seq_len` tokens per row and step). Either
way the tokens match generation without a cache (`LM.generate_recompute`, same truncation) token for token.

This reuses the model's own modules (projections, norms, MLP), so a checkpoint's weights decode unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tasks.training.model import GPT, _cast_once, _rotate, attention_backends


class KVCache:
    """Keys and values of every layer for a batch: [batch, kv heads, capacity, head dim] each."""

    def __init__(self, model: GPT, batch: int, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        spec = model.spec
        shape = (batch, spec.n_kv_heads, capacity, spec.head_dim)
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in model.blocks]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in model.blocks]
        self.length = 0
        self.capacity = capacity


def embed(model: GPT, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Token (plus learned position) embeddings of `idx` [b, s] at positions `pos` [b, s]."""
    x = model.wte(idx)
    return x + model.wpe(pos) if model.wpe is not None else x


def run_blocks(model: GPT, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
               cache: KVCache | None = None) -> torch.Tensor:
    """The residual stream after every block for inputs `x` [b, s, h] at positions `pos` [b, s], each query seeing
    the keys `mask` [b, 1, s, keys] allows. With a `cache` the keys are its columns 0 .. cache.length + s (this
    call's keys and values are written at cache.length and the length advances); without one, they are the s
    inputs themselves (any mask: causal, or a tree of shared prefixes; None: causal, for right-padded rows)."""
    with attention_backends(x.device):
        return _run_blocks(model, x, pos, mask, cache)


def _run_blocks(model: GPT, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                cache: KVCache | None = None) -> torch.Tensor:
    b, s = x.shape[:2]
    t0 = cache.length if cache is not None else 0
    rope = (model.rope_cos[pos][:, None], model.rope_sin[pos][:, None]) if model.spec.position == "rope" else None
    hd = model.spec.head_dim
    for i, blk in enumerate(model.blocks):
        h = _cast_once(blk.norm1(x))
        f = _fused(blk)
        q, k, v = F.linear(h, f.qkv, f.qkv_bias).split(f.qkv_split, dim=-1)
        q, k, v = (t.reshape(b, s, -1, hd).transpose(1, 2) for t in (q, k, v))
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        if cache is not None:
            cache.k[i][:, :, t0:t0 + s] = k
            cache.v[i][:, :, t0:t0 + s] = v
            k, v = cache.k[i][:, :, :t0 + s], cache.v[i][:, :, :t0 + s]
        a = q.shape[1]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=k.shape[1] != a)
        x = x + blk.proj(o.transpose(1, 2).reshape(b, s, a * hd))
        x = x + mlp(blk, f, x)
    if cache is not None:
        cache.length = t0 + s
    return x


@dataclass
class _Fusion:
    """A block's q|k|v projections (and SwiGLU's gate|up) as one weight each: one matmul instead of three (two)."""

    key: tuple
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    qkv_split: list[int]
    up: torch.Tensor | None
    up_bias: torch.Tensor | None


_FUSED: weakref.WeakKeyDictionary[torch.nn.Module, _Fusion] = weakref.WeakKeyDictionary()


def mlp(blk: torch.nn.Module, f: _Fusion, x: torch.Tensor) -> torch.Tensor:
    """A block's feed-forward half on the residual stream `x` (SwiGLU with its fused up/gate weight, or GELU)."""
    hn = _cast_once(blk.norm2(x))
    if blk.fc3 is not None:
        gate, up = F.linear(hn, f.up, f.up_bias).chunk(2, dim=-1)
        u = F.silu(gate) * up
    else:
        u = F.gelu(blk.fc1(hn), approximate="tanh")
    return blk.fc2(u)


def _fused(blk: torch.nn.Module) -> _Fusion:
    """The block's fused inference weights, made again whenever a source weight changed (version or storage)."""
    parts = [m for m in (blk.q, blk.k, blk.v, blk.fc1, blk.fc3) if m is not None]
    key = tuple((m.weight._version, m.weight.data_ptr()) for m in parts)
    f = _FUSED.get(blk)
    if f is None or f.key != key:
        def cat(ms: list, what: str) -> torch.Tensor | None:
            ts = [getattr(m, what) for m in ms]
            return None if ts[0] is None else torch.cat([t.detach() for t in ts])

        qkv = [blk.q, blk.k, blk.v]
        up = [blk.fc1, blk.fc3] if blk.fc3 is not None else None
        f = _Fusion(key, cat(qkv, "weight"), cat(qkv, "bias"), [m.out_features for m in qkv],
                    cat(up, "weight") if up else None, cat(up, "bias") if up else None)
        _FUSED[blk] = f
    return f


def _forward(model: GPT, idx: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits of the last position of `idx` [b, s] (columns cache.length .. +s), filling the cache.
    `pos` [b, s]: each token's position; `valid` [b, capacity]: which cached columns are real tokens."""
    s = idx.shape[1]
    t0 = cache.length
    causal = torch.ones(s, t0 + s, dtype=torch.bool, device=idx.device).tril(t0)
    itself = torch.zeros(s, t0 + s, dtype=torch.bool, device=idx.device)
    itself[:, t0:] = torch.eye(s, dtype=torch.bool, device=idx.device)
    # a padding query sees only itself (no row of the mask is empty, so nothing becomes NaN); real queries never
    # see padding keys
    mask = (causal[None, None] & valid[:, None, None, :t0 + s]) | itself[None, None]  # [b, 1, s, t0+s]
    x = run_blocks(model, embed(model, idx, pos), pos, mask, cache)
    return model.lm_head(model.norm_f(x[:, -1])).float()


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy at temperature 0, else sampled from the softmax at `temperature`
    restricted to the `top_k` most likely tokens (0: all) and the smallest set whose mass reaches `top_p`."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    """Sampled runs with the same seed, prompts and batch give the same tokens."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling {self}: temperature >= 0, top_k >= 0 and 0 < top_p <= 1")


def pick(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator | None) -> torch.Tensor:
    """Next token ids [b] from last-position logits [b, vocab]."""
    if sampling.temperature == 0:
        return logits.argmax(-1)
    z = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = z.topk(min(sampling.top_k, z.shape[-1]), dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if sampling.top_p < 1:
        srt, order = z.sort(-1, descending=True)
        probs = srt.softmax(-1)
        drop = probs.cumsum(-1) - probs >= sampling.top_p  # the tokens past the first that reach top_p
        z = z.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(z.softmax(-1), 1, generator=gen)[:, 0]


@dataclass
class _Rows:
    """The rows still decoding: their prompt indices, each one's last position, which cache columns are real."""

    rows: list[int]
    last_pos: torch.Tensor
    valid: torch.Tensor
    cache: KVCache

    def keep(self, keep: list[int]) -> None:
        """Drop every other row from the batch (its cache rows included): finished rows cost nothing any more."""
        sel = torch.tensor(keep, device=self.valid.device)
        self.rows = [self.rows[j] for j in keep]
        self.last_pos, self.valid = self.last_pos[sel], self.valid[sel]
        self.cache.k = [t.index_select(0, sel) for t in self.cache.k]
        self.cache.v = [t.index_select(0, sel) for t in self.cache.v]


def _prefill(model: GPT, prompts: list[list[int]], new: int, pad: int) -> tuple[torch.Tensor, _Rows]:
    """Run the left-padded prompts once into a cache of the context length (or prompt + new tokens)."""
    dev, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    b, width = len(prompts), max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    idx = torch.tensor([[pad] * n + [int(t) for t in p] for n, p in zip(pads, prompts, strict=True)], device=dev,
                       dtype=torch.long)
    col = torch.arange(width, device=dev)[None]
    off = torch.tensor(pads, device=dev)[:, None]
    pos = (col - off).clamp(min=0)
    capacity = max(min(model.seq_len, width + new), width)
    valid = torch.zeros(b, capacity, dtype=torch.bool, device=dev)
    valid[:, :width] = col >= off
    cache = KVCache(model, b, capacity, dev, dtype)
    return _forward(model, idx, pos, valid, cache), _Rows(list(range(b)), pos[:, -1], valid, cache)


def _next_logits(model: GPT, st: _Rows, nxt: torch.Tensor, history: list[list[int]]) -> torch.Tensor:
    """Logits after feeding each row its new token: one cached position, or past the context the sliding window
    (a full forward of the last `seq_len` tokens per row, as without a cache)."""
    L, cache = model.seq_len, st.cache
    if cache.length < cache.capacity and int(st.last_pos.max()) + 1 < L:
        st.last_pos = st.last_pos + 1
        st.valid[:, cache.length] = True
        return _forward(model, nxt[:, None], st.last_pos[:, None], st.valid, cache)
    dev = nxt.device
    return torch.stack([model.logits(torch.tensor([history[r][-L:]], device=dev, dtype=torch.long))[0, -1]
                        for r in st.rows])


def prompt_room(seq_len: int, max_new_tokens: int) -> int:
    """How many of a prompt's last tokens generation keeps: room for the new tokens inside the context (a prompt
    past it would make every row of its batch run a full window per token, on a GPU 20-60x the cached step), at
    least one token."""
    return max(1, seq_len - max_new_tokens)


@torch.inference_mode()
def greedy(model: GPT, prompts: list[list[int]], max_new_tokens: int,
           stop: Callable[[list[int]], bool] | None = None, pad: int = 0, eos: int | None = None,
           empty: int = 10, sampling: Sampling | None = None, vocab: int | None = None) -> list[list[int]]:
    """Continuations (token ids) of `prompts`, greedy or sampled (`sampling`), each at most `max_new_tokens`; a row
    ends once `stop(its new tokens)` is true (the caller trims the text at the stop string) or it produced `eos`.
    Finished rows leave the batch once they are a quarter of it. An empty prompt starts from the token `empty`.
    `vocab`: only ids below it are picked (a model whose output layer is wider than its tokenizer, e.g. a 32k-id model
    trained on byte-level data, whose ids past 255 stand for no text)."""
    sampling = sampling or Sampling()
    if not prompts or max_new_tokens <= 0:
        return [[] for _ in prompts]
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(sampling.seed) if sampling.temperature > 0 else None
    keep = prompt_room(model.seq_len, max_new_tokens)
    prompts = [[int(t) for t in p[-keep:]] or [empty] for p in prompts]
    logits, st = _prefill(model, prompts, max_new_tokens, pad)
    out: list[list[int]] = [[] for _ in prompts]
    history = [list(p) for p in prompts]
    ended: set[int] = set()  # batch positions of finished rows not dropped yet
    for step in range(max_new_tokens):
        nxt = pick(logits if vocab is None else logits[:, :vocab], sampling, gen)
        for j, r in enumerate(st.rows):
            if j in ended:
                continue
            tok = int(nxt[j])
            out[r].append(tok)
            history[r].append(tok)
            if tok == eos or (stop is not None and stop(out[r])):
                ended.add(j)
        if len(ended) == len(st.rows) or step + 1 == max_new_tokens:
            break
        if len(ended) >= max(1, len(st.rows) // 4):
            keep = [j for j in range(len(st.rows)) if j not in ended]
            nxt = nxt[torch.tensor(keep, device=dev)]
            st.keep(keep)
            ended = set()
        logits = _next_logits(model, st, nxt, history)
    return out
