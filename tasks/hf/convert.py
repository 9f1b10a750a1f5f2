"""Weights between Hugging Face model directories and Frenzy's GPT: names mapped, GPT-2's Conv1D transposed and
its fused q/k/v split, every shape checked. `load_hf_state` reads safetensors (one file or an index of shards);
`export_hf` writes config.json + model.safetensors (+ tokenizer.json) that `transformers` loads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from tasks.hf.config import LLAMA_LIKE, HFError, read_config
from tasks.jobspec import ModelSpec
from tasks.outdir import atomic_dir
from tasks.userfiles import UserFileError, load_json

_LLAMA_BLOCK = {"input_layernorm.weight": "norm1.weight", "post_attention_layernorm.weight": "norm2.weight",
                "self_attn.q_proj.weight": "q.weight", "self_attn.k_proj.weight": "k.weight",
                "self_attn.v_proj.weight": "v.weight", "self_attn.q_proj.bias": "q.bias",
                "self_attn.k_proj.bias": "k.bias", "self_attn.v_proj.bias": "v.bias",
                "self_attn.o_proj.weight": "proj.weight", "mlp.gate_proj.weight": "fc1.weight",
                "mlp.up_proj.weight": "fc3.weight", "mlp.down_proj.weight": "fc2.weight"}
_LLAMA_TOP = {"model.embed_tokens.weight": "wte.weight", "model.norm.weight": "norm_f.weight",
              "lm_head.weight": "lm_head.weight"}
_GPT2_BLOCK = {"ln_1.weight": "norm1.weight", "ln_1.bias": "norm1.bias", "ln_2.weight": "norm2.weight",
               "ln_2.bias": "norm2.bias", "attn.c_proj.weight": "proj.weight", "attn.c_proj.bias": "proj.bias",
               "mlp.c_fc.weight": "fc1.weight", "mlp.c_fc.bias": "fc1.bias", "mlp.c_proj.weight": "fc2.weight",
               "mlp.c_proj.bias": "fc2.bias"}
_GPT2_TOP = {"wte.weight": "wte.weight", "wpe.weight": "wpe.weight", "ln_f.weight": "norm_f.weight",
             "ln_f.bias": "norm_f.bias"}
_GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


#: dtypes read as they are (then cast to the training dtype); quantised or integer weights need their scales, which
#: a plain cast would drop, so they are refused instead of trained on as garbage
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _index_files(folder: Path, index: Path) -> list[str]:
    """The shard files a `model.safetensors.index.json` names, each confined to `folder`."""
    try:
        doc = load_json(index, "safetensors index")
    except UserFileError as err:
        raise HFError(f"{err}; download the model's index again") from None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
        raise HFError(f"{index} has no \"weight_map\" object of tensor name -> shard file; download the index again")
    root = folder.resolve()
    files = sorted(set(wmap.values()))
    for f in files:
        target = (folder / f).resolve()
        if Path(f).is_absolute() or target.parent != root or not f or f in (".", ".."):
            raise HFError(f"{index}: weight_map names {f!r}, which is not a file in {folder}; shards must be plain "
                          "file names beside the index: fix the index")
        if not target.is_file():
            raise HFError(f"{index}: weight_map names {f}, which is missing from {folder}; download that shard")
    return files


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if path.stat().st_size < 8:
        raise HFError(f"{path} is {path.stat().st_size} bytes, not a safetensors file; download it again")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise HFError(f"{path} is not a readable safetensors file ({err}); it is truncated or damaged: download it "
                      "again") from None
    bad = sorted({f"{k} ({t.dtype})" for k, t in tensors.items() if t.dtype not in _FLOAT_DTYPES})
    if bad:
        raise HFError(f"{path}: tensors of a dtype Frenzy does not train from ({', '.join(bad[:3])}); quantised or "
                      "integer weights need their scales: give the unquantised (fp16/bf16/fp32) checkpoint")
    return tensors


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = _index_files(folder, index)
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        found = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth")]
        hint = f" (found {', '.join(found[:3])}: convert them to safetensors first)" if found else ""
        raise HFError(f"{folder} has no model.safetensors or model.safetensors.index.json{hint}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(_load_file(folder / f))
    return out


def load_hf_state(folder: str | Path, spec: ModelSpec, seq_len: int, dtype: torch.dtype = torch.float32
                  ) -> dict[str, torch.Tensor]:
    """The directory's weights under Frenzy's parameter names (as `dtype`), ready for `GPT.load_state_dict`."""
    folder = Path(folder).expanduser()
    cfg = read_config(folder)
    kind = cfg.get("model_type")
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", kind == "mistral") else None
    if window and seq_len > int(window):
        raise HFError(f"{folder}: the model attends over a sliding window of {window} tokens, which Frenzy's full "
                      f"causal attention does not implement; use seq_len <= {window}")
    raw = _read_safetensors(folder)
    out: dict[str, torch.Tensor] = {}
    unused = []
    for name, t in raw.items():
        if kind == "gpt2":
            name = name.removeprefix("transformer.")
            m = re.fullmatch(r"h\.(\d+)\.(.+)", name)
            if m:
                i, rest = int(m.group(1)), m.group(2)
                if rest in _GPT2_CONV1D:
                    t = t.t()  # Conv1D stores [in, out]
                if rest in ("attn.c_attn.weight", "attn.c_attn.bias"):
                    what = rest.rsplit(".", 1)[1]
                    for part, chunk in zip("qkv", t.chunk(3, dim=0), strict=True):
                        out[f"blocks.{i}.{part}.{what}"] = chunk
                elif rest in _GPT2_BLOCK:
                    out[f"blocks.{i}.{_GPT2_BLOCK[rest]}"] = t
                elif rest not in ("attn.bias", "attn.masked_bias"):  # old checkpoints keep the causal mask buffers
                    unused.append(name)
            elif name in _GPT2_TOP:
                out[_GPT2_TOP[name]] = t
            elif name == "lm_head.weight":
                pass  # tied to wte
            else:
                unused.append(name)
        else:
            m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
            if m and m.group(2) in _LLAMA_BLOCK:
                out[f"blocks.{m.group(1)}.{_LLAMA_BLOCK[m.group(2)]}"] = t
            elif name in _LLAMA_TOP:
                out[_LLAMA_TOP[name]] = t
            elif not name.endswith("rotary_emb.inv_freq"):
                unused.append(name)
    if unused:
        raise HFError(f"{folder}: weights Frenzy's {kind} mapping does not know: {', '.join(unused[:5])}")
    if "wpe.weight" in out:
        n = out["wpe.weight"].shape[0]
        if seq_len > n:
            raise HFError(f"seq_len {seq_len} exceeds the model's {n} learned positions; use seq_len <= {n}")
        out["wpe.weight"] = out["wpe.weight"][:seq_len]
    if spec.tied_embeddings:
        out.pop("lm_head.weight", None)
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def load_into(model: torch.nn.Module, folder: str | Path, seq_len: int) -> None:
    """Copy the directory's weights into a built GPT; every parameter must be covered with the same shape."""
    state = load_hf_state(folder, model.spec, seq_len)  # type: ignore[arg-type]
    own = model.state_dict()
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items() if k in own and
           v.shape != own[k].shape]
    if bad:
        raise HFError(f"{folder}: weights do not fit the model shape ({'; '.join(bad[:3])}); remove the overrides "
                      "in `model:` that change the shape")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.spec.tied_embeddings)]  # type: ignore[attr-defined]
    if missing or unexpected:
        raise HFError(f"{folder}: weights missing {missing[:4]}, unexpected {unexpected[:4]}")


def hf_architecture(spec: ModelSpec) -> str:
    """Which Hugging Face architecture holds this shape exactly, or an HFError saying why none does."""
    if spec.position == "learned":
        ok = (spec.mlp == "gelu" and spec.norm == "layernorm" and spec.bias and spec.attn_bias
              and spec.tied_embeddings and spec.n_kv_heads == spec.heads)
        if not ok:
            raise HFError("a learned-position model exports as GPT-2 only with GELU, LayerNorm, biases, tied "
                          "embeddings and MHA; this one differs")
        return "gpt2"
    if spec.mlp != "swiglu" or spec.norm != "rmsnorm" or spec.bias:
        raise HFError("a rotary model exports as Llama/Qwen2 only with SwiGLU, RMSNorm and no MLP/output biases")
    return "qwen2" if spec.attn_bias else "llama"


def _hf_config(spec: ModelSpec, seq_len: int, arch: str, eos_id: int | None) -> dict:
    if arch == "gpt2":
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": spec.layers,
               "n_embd": spec.hidden, "n_head": spec.heads, "n_inner": spec.ffn, "n_positions": seq_len,
               "n_ctx": seq_len, "vocab_size": spec.vocab, "activation_function": "gelu_new",
               "layer_norm_epsilon": spec.norm_eps or 1e-5, "tie_word_embeddings": True,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    else:
        cfg = {"architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"], "model_type": arch,
               "num_hidden_layers": spec.layers, "hidden_size": spec.hidden, "num_attention_heads": spec.heads,
               "num_key_value_heads": spec.n_kv_heads, "intermediate_size": spec.ffn, "vocab_size": spec.vocab,
               "hidden_act": "silu", "rms_norm_eps": spec.norm_eps or 1e-5, "rope_theta": spec.rope_theta or 10000.0,
               "max_position_embeddings": seq_len, "tie_word_embeddings": bool(spec.tied_embeddings),
               "attention_bias": False, "mlp_bias": False, "head_dim": spec.head_dim}
        if spec.rope_scaling is not None:
            rs = spec.rope_scaling
            cfg["rope_scaling"] = {"rope_type": "llama3", "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
                                   "high_freq_factor": rs.high_freq_factor,
                                   "original_max_position_embeddings": rs.original_max_position}
    if eos_id is not None:
        cfg["eos_token_id"] = eos_id
        cfg["bos_token_id"] = eos_id
    cfg["torch_dtype"] = "float32"
    return cfg


def check_state_shapes(state: dict[str, torch.Tensor], spec: ModelSpec, seq_len: int, what: str) -> None:
    """Refuse a state dict that is not exactly the parameters of `spec` (names and shapes), before anything is
    written: an export of it would load in transformers with random or misplaced weights."""
    from tasks.training.model import GPT

    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in GPT(spec, seq_len).state_dict().items()}
    if spec.tied_embeddings:
        want.pop("lm_head.weight", None)
    have = {k: tuple(v.shape) for k, v in state.items() if not (k == "lm_head.weight" and spec.tied_embeddings)}
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    bad = [f"{k} {have[k]} (model: {want[k]})" for k in sorted(set(want) & set(have)) if have[k] != want[k]]
    if missing or extra or bad:
        raise HFError(f"{what} does not match its model shape: missing {missing[:3]}, unexpected {extra[:3]}, "
                      f"wrong shapes {bad[:3]}; the checkpoint is damaged or its manifest names another model")


def export_hf(state: dict[str, torch.Tensor], spec: ModelSpec, seq_len: int, out: str | Path,
              tokenizer_json: str | None = None, eos_id: int | None = None, overwrite: bool = False) -> Path:
    """Write a Frenzy model (full state dict) as a Hugging Face directory, whole or not at all (tasks/outdir.py:
    a non-empty `out` only with `overwrite`, which replaces every file in it); returns it."""
    arch = hf_architecture(spec)
    check_state_shapes(state, spec, seq_len, "the checkpoint")
    dest = Path(out).expanduser().absolute()
    with atomic_dir(dest, "export", overwrite=overwrite) as tmp:
        _write_hf(tmp, state, spec, seq_len, arch, tokenizer_json, eos_id)
    return dest


def _write_hf(dest: Path, state: dict[str, torch.Tensor], spec: ModelSpec, seq_len: int, arch: str,
              tokenizer_json: str | None, eos_id: int | None) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach().to("cpu").contiguous()
        if name == "lm_head.weight" and spec.tied_embeddings:
            continue
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
        if arch == "gpt2":
            top = {v: k for k, v in _GPT2_TOP.items()}
            block = {v: k for k, v in _GPT2_BLOCK.items()}
            if m:
                i, rest = m.group(1), m.group(2)
                if rest[0] in "qkv" and rest[1] == ".":
                    continue  # fused below
                hf = block[rest]
                tensors[f"transformer.h.{i}.{hf}"] = t.t().contiguous() if hf in _GPT2_CONV1D else t
            else:
                tensors[f"transformer.{top[name]}"] = t
        else:
            top = {v: k for k, v in _LLAMA_TOP.items()}
            block = {v: k for k, v in _LLAMA_BLOCK.items()}
            tensors[f"model.layers.{m.group(1)}.{block[m.group(2)]}" if m else top[name]] = t
    if arch == "gpt2":
        for i in range(spec.layers):
            w = torch.cat([state[f"blocks.{i}.{p}.weight"] for p in "qkv"], dim=0)
            tensors[f"transformer.h.{i}.attn.c_attn.weight"] = w.detach().cpu().t().contiguous()
            tensors[f"transformer.h.{i}.attn.c_attn.bias"] = torch.cat(
                [state[f"blocks.{i}.{p}.bias"] for p in "qkv"]).detach().cpu().contiguous()
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(_hf_config(spec, seq_len, arch, eos_id), indent=1))
    if tokenizer_json is not None:
        (dest / "tokenizer.json").write_text(tokenizer_json)


__all__ = ["HFError", "LLAMA_LIKE", "export_hf", "hf_architecture", "load_hf_state", "load_into"]
