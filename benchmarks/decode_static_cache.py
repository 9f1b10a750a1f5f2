"""Experiment (kept for reproduction, not the decoder): decode with a fixed-shape attention over the whole preallocated KV buffer
(zero-initialised, in-place writes, a mask over all capacity columns) against the current decoder (attention over
the filled columns only), gpt-mini, 16 rows x 256 new tokens, 1 thread, 5 alternating rounds, identical tokens."""
import statistics
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from tasks.evaluation import decode as D
from tasks.jobspec import ModelSpec
from tasks.training.model import GPT

torch.set_num_threads(1)
orig_forward, orig_cache_init = D._forward, D.KVCache.__init__

def zero_cache_init(self, model, batch, capacity, device, dtype):
    orig_cache_init(self, model, batch, capacity, device, dtype)
    self.k = [torch.zeros_like(t) for t in self.k]
    self.v = [torch.zeros_like(t) for t in self.v]

def static_forward(model, idx, pos, valid, cache):
    s = idx.shape[1]
    if s != 1:
        return orig_forward(model, idx, pos, valid, cache)
    t0 = cache.length
    full = cache.capacity
    mask = valid[:, None, None, :full].clone()  # [b,1,1,capacity]: every written real column
    # run_blocks slices k[:, :, :t0+s]; give it the whole buffer by temporarily setting a view
    x = D.embed(model, idx, pos)
    b = x.shape[0]
    rope = (model.rope_cos[pos][:, None], model.rope_sin[pos][:, None]) if model.spec.position == "rope" else None
    hd = model.spec.head_dim
    import torch.nn.functional as F
    for i, blk in enumerate(model.blocks):
        h = D._cast_once(blk.norm1(x))
        f = D._fused(blk)
        q, k, v = F.linear(h, f.qkv, f.qkv_bias).split(f.qkv_split, dim=-1)
        q, k, v = (t.reshape(b, 1, -1, hd).transpose(1, 2) for t in (q, k, v))
        if rope is not None:
            q, k = D._rotate(q, *rope), D._rotate(k, *rope)
        cache.k[i][:, :, t0:t0 + 1] = k
        cache.v[i][:, :, t0:t0 + 1] = v
        a = q.shape[1]
        o = F.scaled_dot_product_attention(q, cache.k[i], cache.v[i], attn_mask=mask, enable_gqa=cache.k[i].shape[1] != a)
        x = x + blk.proj(o.transpose(1, 2).reshape(b, 1, a * hd))
        x = x + D.mlp(blk, f, x)
    cache.length = t0 + 1
    return model.lm_head(model.norm_f(x[:, -1])).float()

spec = ModelSpec.model_validate({"preset": "gpt-mini"})
torch.manual_seed(0)
model = GPT(spec, 512).eval()
rows = [list(f"def function_{i}(x, y):\n    # {'compute ' * (i % 6 + 3)}the result\n    return".encode()) for i in range(16)]
D.greedy(model, rows[:2], 8)
times = {"current": [], "static": []}
toks = {}
for _ in range(5):
    for mode in ("current", "static"):
        D._forward = orig_forward if mode == "current" else static_forward
        D.KVCache.__init__ = orig_cache_init if mode == "current" else zero_cache_init
        t = time.perf_counter()
        out = D.greedy(model, rows, 256)
        times[mode].append(time.perf_counter() - t)
        toks.setdefault(mode, out)
        assert out == toks[mode]
print({m: [round(4096 / x) for x in v] for m, v in times.items()}, "tokens/s per round")
print("median tokens/s", {m: round(4096 / statistics.median(v)) for m, v in times.items()},
      "ratio static/current", round(statistics.median(times["current"]) / statistics.median(times["static"]), 3),
      "same tokens", toks["current"] == toks["static"])
