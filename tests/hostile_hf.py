"""Hostile Hugging Face model directories: config.json, safetensors files and sharded indexes (issue 32's first
row). Each case damages a copy of a random 2-layer Llama made by `save_pretrained` and loads it as a training run
or `frenzy evaluate` does (`ModelSpec(hf=...)`, then the weights into Frenzy's GPT)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

from tests.hostile_kit import Case, Run, lib, llama_dir

S = "hf"


def _load(d: Path) -> Run:
    def go() -> object:
        from tasks.hf.convert import load_into
        from tasks.jobspec import ModelSpec
        from tasks.training.model import GPT

        spec = ModelSpec(hf=str(d))
        gpt = GPT(spec, 64)
        load_into(gpt, d, 64)
        return gpt

    return lib(go)


def _with_config(change: Callable[[dict], object]) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        d = llama_dir(root / "B")
        cfg = json.loads((d / "config.json").read_text())
        new = change(cfg)
        (d / "config.json").write_text(json.dumps(cfg if new is None else new))
        return _load(d)
    return act


def _with_bytes(name: str, change: Callable[[bytes], bytes]) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        d = llama_dir(root / "B")
        p = d / name
        p.write_bytes(change(p.read_bytes() if p.exists() else b""))
        return _load(d)
    return act


def _safetensors_header(change: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        change(header)
        raw = json.dumps(header).encode()
        return struct.pack("<Q", len(raw)) + raw + data[8 + n:]
    return edit


def _tensors(change: Callable[[dict], None]) -> Callable[[Path], Run]:
    """Rewrite model.safetensors with `change` applied to its tensors."""
    def act(root: Path) -> Run:
        from safetensors.torch import load_file, save_file

        d = llama_dir(root / "B")
        t = load_file(str(d / "model.safetensors"))
        change(t)
        save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
        return _load(d)
    return act


def _index(weight_map: Callable[[Path, dict], object], split: bool = True) -> Callable[[Path], Run]:
    """Split the weights over two shards with an index, then let `weight_map` rewrite the index's map."""
    def act(root: Path) -> Run:
        from safetensors.torch import load_file, save_file

        d = llama_dir(root / "B")
        t = load_file(str(d / "model.safetensors"))
        (d / "model.safetensors").unlink()
        names = sorted(t)
        half = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for f, ns in half.items():
            save_file({n: t[n] for n in ns}, str(d / f), metadata={"format": "pt"})
        wmap = {n: f for f, ns in half.items() for n in ns}
        doc = weight_map(d, wmap)
        index = d / "model.safetensors.index.json"
        if isinstance(doc, bytes):
            index.write_bytes(doc)
        else:
            index.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        return _load(d)
    return act


def _same_weights(root: Path, run: Run) -> bool:
    from safetensors.torch import load_file

    files = sorted((root / "B").glob("*.safetensors"))
    raw: dict = {}
    for f in files:
        raw.update(load_file(str(f)))
    gpt = run.value
    return bool((gpt.wte.weight == raw["model.embed_tokens.weight"]).all()  # type: ignore[attr-defined]
                and (gpt.blocks[1].fc2.weight == raw["model.layers.1.mlp.down_proj.weight"]).all())  # type: ignore[attr-defined]


def _set(**kv: object) -> Callable[[dict], None]:
    return lambda c: c.update(kv)


def _drop(key: str) -> Callable[[dict], None]:
    return lambda c: c.pop(key) and None


_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
_CFG = "config.json"

CASES = [
    Case(S, "valid model loads its exact weights", lambda r: _load(llama_dir(r / "B")), _same_weights),
    Case(S, "no config.json", lambda r: (llama_dir(r / "B") / "config.json").unlink() or _load(r / "B"),
         ("no config.json",)),
    Case(S, "config not JSON", _with_bytes(_CFG, lambda b: b"{not json"), (_CFG, "not JSON")),
    Case(S, "config not UTF-8", _with_bytes(_CFG, lambda b: b.replace(b'"llama"', b'"ll\xffma"')), (_CFG, "UTF-8")),
    Case(S, "config is a JSON list", _with_config(lambda c: [c]), (_CFG, "list", "not an object")),
    Case(S, "config is null", _with_config(lambda c: "null"), (_CFG, "not an object")),
    Case(S, "model_type missing", _with_config(_drop("model_type")), ("model_type", "Frenzy reads")),
    Case(S, "model_type bert", _with_config(_set(model_type="bert")), ("'bert'", "not supported")),
    Case(S, "0 attention heads", _with_config(_set(num_attention_heads=0)),
         (_CFG, "num_attention_heads", "positive integer")),
    Case(S, "attention heads missing", _with_config(_drop("num_attention_heads")), (_CFG, "num_attention_heads")),
    Case(S, "hidden_size a string", _with_config(_set(hidden_size="64")), (_CFG, "hidden_size", "positive integer")),
    Case(S, "negative layers", _with_config(_set(num_hidden_layers=-1)), ("num_hidden_layers", "positive integer")),
    Case(S, "fractional vocab", _with_config(_set(vocab_size=300.5)), ("vocab_size", "positive integer")),
    Case(S, "0 kv heads", _with_config(_set(num_key_value_heads=0)), ("num_key_value_heads", "positive")),
    Case(S, "intermediate_size missing", _with_config(_drop("intermediate_size")), (_CFG, "intermediate_size")),
    Case(S, "rope_scaling the string linear", _with_config(_set(rope_scaling="linear")), (_CFG, "rope_scaling")),
    Case(S, "rope_scaling linear object", _with_config(_set(rope_scaling={"type": "linear", "factor": 2.0})),
         ("'linear'", "not supported")),
    Case(S, "llama3 rope without low_freq_factor", _with_config(_set(rope_scaling=_LLAMA3)),
         (_CFG, "low_freq_factor")),
    Case(S, "llama3 rope factor a string", _with_config(_set(rope_scaling={**_LLAMA3, "low_freq_factor": 1.0,
                                                                             "factor": "eight"})), (_CFG, "fix")),
    Case(S, "gelu activation", _with_config(_set(hidden_act="gelu")), ("hidden_act", "silu")),
    Case(S, "head_dim differs", _with_config(_set(head_dim=32)), ("head_dim",)),
    Case(S, "mlp_bias", _with_config(_set(mlp_bias=True)), ("mlp_bias",)),
    Case(S, "config shape differs from the weights", _with_config(_set(intermediate_size=128)),
         ("do not fit", "model:")),
    Case(S, "no weights at all", lambda r: (llama_dir(r / "B") / "model.safetensors").unlink() or _load(r / "B"),
         ("no model.safetensors",)),
    Case(S, "only pytorch_model.bin",
         lambda r: [(llama_dir(r / "B") / "model.safetensors").rename(r / "B" / "pytorch_model.bin")] and _load(r / "B"),
         ("pytorch_model.bin", "convert them to safetensors")),
    Case(S, "0-byte safetensors", _with_bytes("model.safetensors", lambda b: b""),
         ("model.safetensors", "download it again")),
    Case(S, "truncated safetensors", _with_bytes("model.safetensors", lambda b: b[: len(b) // 2]),
         ("model.safetensors", "download it again")),
    Case(S, "header length 2^62", _with_bytes("model.safetensors", lambda b: struct.pack("<Q", 1 << 62) + b[8:]),
         ("model.safetensors", "download it again")),
    Case(S, "header not JSON", _with_bytes("model.safetensors", lambda b: b[:8] + b"x" * 20 + b[28:]),
         ("model.safetensors", "download it again")),
    Case(S, "tensor offsets past EOF", _with_bytes("model.safetensors", _safetensors_header(
        lambda h: h["model.norm.weight"].update(data_offsets=[10**9, 10**9 + 256]))),
        ("model.safetensors", "download it again")),
    Case(S, "int8 weights (quantised)", _tensors(lambda t: t.update(
        {k: (v * 100).to(__import__("torch").int8) for k, v in t.items() if "proj" in k})),
        ("int8", "unquantised")),
    Case(S, "a tensor missing", _tensors(lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
         ("missing", "blocks.1.fc3.weight")),
    Case(S, "a tensor of the wrong shape", _tensors(lambda t: t.update(
        {"model.norm.weight": t["model.norm.weight"][:32].clone()})), ("do not fit", "norm_f.weight")),
    Case(S, "an unknown tensor", _tensors(lambda t: t.update({"model.extra.weight": t["model.norm.weight"].clone()})),
         ("model.extra.weight", "does not know")),
    Case(S, "valid sharded index", _index(lambda d, m: {"metadata": {}, "weight_map": m}), _same_weights),
    Case(S, "index not JSON", _index(lambda d, m: "{oops"), ("model.safetensors.index.json", "JSON")),
    Case(S, "index not UTF-8", _index(lambda d, m: json.dumps({"weight_map": m}).encode().replace(b"model-", b"m\xff-")),
         ("model.safetensors.index.json",)),
    Case(S, "index without weight_map", _index(lambda d, m: {"metadata": {}}), ("weight_map", "index")),
    Case(S, "index weight_map a list", _index(lambda d, m: {"weight_map": list(m.values())}), ("weight_map",)),
    Case(S, "index names a missing shard", _index(lambda d, m: {"weight_map": {**m, "x": "model-9.safetensors"}}),
         ("model-9.safetensors", "missing", "download")),
    Case(S, "index names '.'", _index(lambda d, m: {"weight_map": {**m, "x": "."}}), ("'.'", "not a file in")),
    Case(S, "index names an absolute path", _index(lambda d, m: {"weight_map": {
        k: str(d / v) if k.endswith("norm.weight") else v for k, v in m.items()}}), ("not a file in", "fix the index")),
    Case(S, "index escapes with ../", _index(lambda d, m: {"weight_map": {**m, "x": "../../../../etc/passwd"}}),
         ("../../../../etc/passwd", "not a file in")),
    Case(S, "index path into a subdirectory", _index(lambda d, m: {"weight_map": {**m, "x": "sub/a.safetensors"}}),
         ("sub/a.safetensors", "not a file in")),
]
