"""Built-in model shapes (public configurations), referenced from job YAML as `model: {preset: NAME}`."""

from __future__ import annotations

from typing import Any

_GPT2: dict[str, Any] = dict(vocab=50257, mlp="gelu", norm="layernorm", tied_embeddings=True,
                             position="learned", bias=True)
_BERT: dict[str, Any] = dict(_GPT2, vocab=30522)
_LLAMA: dict[str, Any] = dict(mlp="swiglu", norm="rmsnorm", tied_embeddings=False, position="rope", bias=False)
_BYTE: dict[str, Any] = dict(_GPT2, vocab=256)

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # GPT-2 family (Radford et al. 2019) and the "GPT2-7B" of the Frenzy paper's evaluation
    "gpt2-124m": dict(_GPT2, layers=12, hidden=768, heads=12),
    "gpt2-350m": dict(_GPT2, layers=24, hidden=1024, heads=16),
    "gpt2-774m": dict(_GPT2, layers=36, hidden=1280, heads=20),
    "gpt2-1.5b": dict(_GPT2, layers=48, hidden=1600, heads=25),
    "gpt2-7b": dict(_GPT2, layers=32, hidden=4096, heads=32),
    # BERT (Devlin et al. 2019), modelled as the same transformer stack for memory purposes
    "bert-base": dict(_BERT, layers=12, hidden=768, heads=12),
    "bert-large": dict(_BERT, layers=24, hidden=1024, heads=16),
    # Llama family, Mistral, Qwen2 (their published config.json shapes)
    "llama2-7b": dict(_LLAMA, layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000),
    "llama2-13b": dict(_LLAMA, layers=40, hidden=5120, heads=40, kv_heads=40, ffn_hidden=13824, vocab=32000),
    "llama2-70b": dict(_LLAMA, layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=32000),
    "llama3-8b": dict(_LLAMA, layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                      rope_theta=500000.0),
    "llama3-70b": dict(_LLAMA, layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256,
                       rope_theta=500000.0),
    "mistral-7b": dict(_LLAMA, layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000),
    "qwen2-7b": dict(_LLAMA, layers=28, hidden=3584, heads=28, kv_heads=4, ffn_hidden=18944, vocab=152064,
                     qkv_bias=True, rope_theta=1000000.0, norm_eps=1e-6),
    # byte-level models of our own, small enough to train on a CPU
    "gpt-tiny": dict(_BYTE, layers=2, hidden=64, heads=4),
    "gpt-mini": dict(_BYTE, layers=6, hidden=384, heads=6),
    "gpt-100m": dict(_BYTE, layers=12, hidden=768, heads=12),
    "gpt-1b": dict(_BYTE, layers=24, hidden=2048, heads=16),
}
