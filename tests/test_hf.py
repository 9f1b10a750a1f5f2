"""Hugging Face interop against `transformers` itself: small random Llama, Qwen2, GPT-2 (and Llama 3.1 RoPE
scaling) models are made locally, saved, imported into Frenzy's GPT and compared logit for logit; Frenzy models
exported and loaded back by `transformers`."""

from __future__ import annotations

import json

import pytest
import torch

from tasks.hf.config import HFError
from tasks.hf.convert import export_hf, hf_architecture, load_into
from tasks.jobspec import ModelSpec
from tasks.training.model import GPT

transformers = pytest.importorskip("transformers")

TOL = 2e-4  # fp32 on CPU: the two implementations order their sums differently


def _make(kind: str, folder, **extra):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=64, **extra)
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=160, vocab_size=300,
                                       max_position_embeddings=128, **extra)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=160, vocab_size=300,
                                       max_position_embeddings=128, **extra)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # random biases and norms too, so a mapping error cannot hide behind ones and zeros
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    model.eval().save_pretrained(folder)
    return model


def _max_diff(hf_model, gpt: GPT, seq: int = 40) -> float:
    idx = torch.randint(0, 300, (3, seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model(idx).logits.float()
        got = gpt.logits(idx)
    return float((want - got).abs().max())


@pytest.mark.parametrize("kind,extra", [
    ("llama", {}),
    ("llama", {"rope_theta": 500000.0}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    ("qwen2", {}),
    ("gpt2", {}),
])
def test_imported_model_gives_the_logits_of_transformers(tmp_path, kind, extra):
    hf_model = _make(kind, tmp_path, **extra)
    spec = ModelSpec(hf=str(tmp_path))
    gpt = GPT(spec, 64).eval()
    load_into(gpt, tmp_path, 64)
    assert _max_diff(hf_model, gpt) < TOL


def test_spec_from_config_reads_the_shape(tmp_path):
    _make("qwen2", tmp_path)
    spec = ModelSpec(hf=str(tmp_path))
    assert (spec.layers, spec.hidden, spec.heads, spec.n_kv_heads, spec.ffn, spec.vocab) == (2, 64, 4, 2, 160, 300)
    assert spec.attn_bias and not spec.bias and spec.mlp == "swiglu" and spec.position == "rope"
    assert spec.display_name == tmp_path.name


@pytest.mark.parametrize("preset", ["gpt-tiny", None])
def test_exported_frenzy_model_loads_in_transformers_with_the_same_logits(tmp_path, preset):
    spec = ModelSpec(preset=preset) if preset else ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, vocab=300,
                                                             mlp="swiglu", norm="rmsnorm", position="rope", bias=False,
                                                             tied_embeddings=False, rope_theta=50000.0)
    torch.manual_seed(3)
    gpt = GPT(spec, 64).eval()
    out = export_hf(gpt.state_dict(), spec, 64, tmp_path / "export")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == ("gpt2" if preset else "llama")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    vocab = spec.vocab
    idx = torch.randint(0, vocab, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert float((hf_model(idx).logits - gpt.logits(idx)).abs().max()) < TOL
    # and back: the exported directory imports to the same weights
    again = GPT(ModelSpec(hf=str(out)), 64).eval()
    load_into(again, out, 64)
    assert all(torch.equal(a, b) for a, b in zip(gpt.state_dict().values(), again.state_dict().values(), strict=True))


def test_unsupported_shapes_and_models_are_refused_with_the_reason(tmp_path):
    with pytest.raises(HFError, match="GPT-2 only"):
        hf_architecture(ModelSpec(layers=2, hidden=64, heads=4, vocab=300, mlp="swiglu"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match="model_type 'mamba' is not supported"):
        ModelSpec(hf=str(tmp_path))
    with pytest.raises(ValueError, match="no config.json"):
        ModelSpec(hf=str(tmp_path / "nope"))


def test_gpt2_seq_len_beyond_its_positions_is_refused(tmp_path):
    _make("gpt2", tmp_path)
    gpt = GPT(ModelSpec(hf=str(tmp_path)), 128)
    with pytest.raises(HFError, match="exceeds the model's 64 learned positions"):
        load_into(gpt, tmp_path, 128)


def test_a_sliding_window_shorter_than_the_context_is_refused(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=128, vocab_size=300, sliding_window=32)
    transformers.MistralForCausalLM(cfg).save_pretrained(tmp_path)
    spec = ModelSpec(hf=str(tmp_path))
    load_into(GPT(spec, 32), tmp_path, 32)  # within the window: the same attention
    with pytest.raises(HFError, match="sliding window of 32"):
        load_into(GPT(spec, 64), tmp_path, 64)


def test_a_job_naming_an_hf_directory_relative_to_its_file_resolves(tmp_path, monkeypatch):
    """Red team 41k D4: `model: {hf: DIR}` in a job file failed `frenzy train` with an internal AttributeError: making
    the path absolute re-ran the model's shape validators on a partial model. The job resolves, its shape the config's."""
    from pathlib import Path

    from tasks.jobspec import parse_job
    from tasks.paths import resolve_job

    _make("gpt2", tmp_path / "hfdir")  # a config with no key-value heads, as Frenzy's own export writes
    monkeypatch.chdir(tmp_path)  # where `frenzy train job.yaml` runs
    job = parse_job({"name": "ft", "model": {"hf": "hfdir"}, "training": {"seq_len": 32, "global_batch": 4}})
    got = resolve_job(job, tmp_path, tmp_path / "run")
    assert got.model.hf == str(tmp_path / "hfdir") and Path(got.model.hf).is_absolute()
    assert (got.model.layers, got.model.hidden, got.model.heads, got.model.n_kv_heads) == (2, 64, 4, 4)
