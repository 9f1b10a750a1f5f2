"""A Hugging Face `config.json` as Frenzy's model shape (pure JSON: no torch, no transformers).

Llama, Mistral, Qwen2 and GPT-2 architectures map onto Frenzy's GPT exactly; anything else is refused with the
reason, never approximated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.errors import FrenzyError
from tasks.pathvars import expand_vars  # `$HOME/models/x`, as every path field
from tasks.userfiles import UserFileError, load_json, path_kind

LLAMA_LIKE = ("llama", "mistral", "qwen2")
SUPPORTED = (*LLAMA_LIKE, "gpt2")


class HFError(FrenzyError, ValueError):
    """A model directory Frenzy cannot read or write; the message names the fix."""


def read_config(folder: str | Path) -> dict[str, Any]:
    p = Path(expand_vars(str(folder), "model.hf")).expanduser()
    try:
        kind = path_kind(p / "config.json", "model config")
    except UserFileError as err:
        raise HFError(str(err)) from None
    if kind == "missing":
        raise HFError(f"{p} is not a Hugging Face model directory (no config.json)")
    try:
        doc = load_json(p / "config.json", "model config")
    except UserFileError as err:
        raise HFError(f"{err}; fix the file or download it again") from None
    if not isinstance(doc, dict):
        raise HFError(f"{p / 'config.json'} holds a JSON {type(doc).__name__}, not an object of model settings; "
                      "download the model's config.json again")
    return doc


def _positive(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    """A count the model shape needs: a positive integer (heads of 0 would divide by zero later)."""
    v = cfg.get(key)
    v = default if v is None else v
    if v is None:
        raise KeyError(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or int(v) <= 0:
        raise HFError(f"config.json key {key!r} is {v!r}; it must be a positive integer: fix the file")
    return int(v)


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, Llama 3 scaling) from either the transformers 4 keys or transformers 5's `rope_parameters`."""
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = cfg.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if not scaling:
        return theta, None
    if not isinstance(scaling, dict):
        raise HFError(f"rope_scaling is {scaling!r}; transformers writes an object such as "
                      '{"rope_type": "llama3", "factor": 8.0, ...}: fix config.json')
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise HFError(f"RoPE scaling {kind!r} is not supported (Frenzy implements none and llama3)")
    return theta, {"factor": float(scaling["factor"]), "low_freq_factor": float(scaling["low_freq_factor"]),
                   "high_freq_factor": float(scaling["high_freq_factor"]),
                   "original_max_position": int(scaling["original_max_position_embeddings"])}


def spec_fields_from_hf(folder: str | Path) -> dict[str, Any]:
    """ModelSpec fields from a model directory's config.json; a missing or mistyped key is refused by name."""
    cfg = read_config(folder)
    try:
        return _fields(folder, cfg)
    except KeyError as err:
        raise HFError(f"{Path(folder) / 'config.json'}: no {err.args[0]!r} key, which the "
                      f"{cfg.get('model_type')} shape needs; add it (transformers' config for the model has it)") \
            from None
    except HFError as err:
        if str(folder) in str(err):
            raise
        raise HFError(f"{Path(folder) / 'config.json'}: {err}") from None
    except (TypeError, ValueError, ZeroDivisionError) as err:
        raise HFError(f"{Path(folder) / 'config.json'} holds a value of the wrong type ({err}); fix the file") \
            from None


def _fields(folder: str | Path, cfg: dict[str, Any]) -> dict[str, Any]:
    kind = cfg.get("model_type")
    if kind in LLAMA_LIKE:
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise HFError(f"{folder}: hidden_act {act!r}; Frenzy's SwiGLU is silu-gated")
        heads, hidden = _positive(cfg, "num_attention_heads"), _positive(cfg, "hidden_size")
        if cfg.get("head_dim") not in (None, hidden // heads):
            raise HFError(f"{folder}: head_dim {cfg['head_dim']} differs from hidden_size / num_attention_heads "
                          f"({hidden // heads}); Frenzy's attention derives it")
        if cfg.get("mlp_bias"):
            raise HFError(f"{folder}: mlp_bias is not supported")
        theta, scaling = _rope(cfg)
        attn_bias = kind == "qwen2" or bool(cfg.get("attention_bias"))
        if kind == "llama" and cfg.get("attention_bias"):
            raise HFError(f"{folder}: Llama attention_bias (biases on q/k/v and o) is not supported")
        return dict(layers=_positive(cfg, "num_hidden_layers"), hidden=hidden, heads=heads,
                    kv_heads=_positive(cfg, "num_key_value_heads", heads),
                    ffn_hidden=_positive(cfg, "intermediate_size"), vocab=_positive(cfg, "vocab_size"),
                    mlp="swiglu", norm="rmsnorm", position="rope", bias=False,
                    qkv_bias=attn_bias, tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                    rope_theta=theta, rope_scaling=scaling, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                    hf=str(folder))
    if kind == "gpt2":
        act = cfg.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise HFError(f"{folder}: activation {act!r}; Frenzy's GPT-2 MLP is the tanh GELU (gelu_new)")
        if cfg.get("scale_attn_by_inverse_layer_idx") or cfg.get("reorder_and_upcast_attn"):
            raise HFError(f"{folder}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
        hidden = _positive(cfg, "n_embd")
        return dict(layers=_positive(cfg, "n_layer"), hidden=hidden, heads=_positive(cfg, "n_head"),
                    ffn_hidden=_positive(cfg, "n_inner", 4 * hidden), vocab=_positive(cfg, "vocab_size"), mlp="gelu",
                    norm="layernorm", position="learned", bias=True, tied_embeddings=True,
                    norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)), hf=str(folder))
    raise HFError(f"{folder}: model_type {kind!r} is not supported; Frenzy reads {', '.join(SUPPORTED)}")


def max_positions(folder: str | Path) -> int:
    """The longest context the model was made for (GPT-2's position table bounds `seq_len`)."""
    cfg = read_config(folder)
    return int(cfg.get("n_positions") or cfg.get("max_position_embeddings") or 2048)
