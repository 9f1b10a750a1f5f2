"""Real models and data: logit agreement with `transformers` on imported Hugging Face models, and whether the data
loader keeps up with `frenzy train` on pre-tokenized shards (the CLI a user runs).

  * import: random Llama / Llama 3.1 (RoPE scaling) / Mistral / Qwen2 / GPT-2 models of a few layers made with
    `transformers`, saved, imported into Frenzy's GPT; max |logit difference| on the same tokens, fp32; and the
    same after `export_hf` + `AutoModelForCausalLM.from_pretrained` of a Frenzy model;
  * data: `frenzy tokenizer train` (BPE, 8192) and `frenzy data prepare` on the built-in corpus, then
    `frenzy train --json` of a gpt-mini-shaped model on the shards: `data_fraction` (time in the loader / loop time)
    from the trainer's own result, next to the byte-level builtin corpus.

    python benchmarks/real_models.py         # writes benchmarks/results/real_models.{json,md}
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.hf.convert import export_hf, load_into  # noqa: E402
from tasks.jobspec import ModelSpec  # noqa: E402
from tasks.training.model import GPT  # noqa: E402

SHAPE = dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=1376, vocab_size=32000, max_position_embeddings=512)


def _hf_model(kind: str):
    import transformers as T

    torch.manual_seed(0)
    if kind == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=50257, n_positions=512))
    if kind == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(**SHAPE, rope_theta=1e6, rms_norm_eps=1e-6))
    if kind == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(**SHAPE, sliding_window=None))
    extra = {}
    if kind == "llama3.1":
        extra = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 128}}
    return T.LlamaForCausalLM(T.LlamaConfig(**SHAPE, **extra))


def logit_agreement(tmp: Path) -> list[dict]:
    import transformers as T

    rows = []
    for kind in ("llama", "llama3.1", "mistral", "qwen2", "gpt2"):
        hf = _hf_model(kind).eval()
        with torch.no_grad():  # random norms and biases too: ones and zeros would hide a mapping error
            for name, p in hf.named_parameters():
                if "norm" in name or "ln_" in name or name.endswith("bias"):
                    p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
        folder = tmp / kind
        hf.save_pretrained(folder)
        spec = ModelSpec(hf=str(folder))
        gpt = GPT(spec, 512).eval()
        t0 = time.perf_counter()
        load_into(gpt, folder, 512)
        load_s = time.perf_counter() - t0
        idx = torch.randint(0, spec.vocab, (4, 512), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want, got = hf(idx).logits.float(), gpt.logits(idx)
        diff = float((want - got).abs().max())
        # and out again: the Frenzy model exported, loaded by transformers
        out = export_hf(gpt.state_dict(), spec, 512, tmp / f"{kind}-export")
        back = T.AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            diff_back = float((back(idx).logits - got).abs().max())
        rows.append({"model": kind, "params": sum(p.numel() for p in gpt.parameters()), "tokens": idx.numel(),
                     "max_abs_diff": diff, "max_abs_logit": float(want.abs().max()), "export_max_abs_diff": diff_back,
                     "import_s": load_s})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _frenzy(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "cli", *args, "--json"], capture_output=True, text=True, cwd=REPO)
    if r.returncode:
        raise SystemExit(f"frenzy {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def loader_vs_step(tmp: Path, steps: int) -> list[dict]:
    from tasks.training.data import build_builtin_corpus

    corpus = str(build_builtin_corpus())
    tok = _frenzy("tokenizer", "train", corpus, "--out", str(tmp / "tok"), "--vocab-size", "8192")
    prep = _frenzy("data", "prepare", corpus, "--tokenizer", tok["path"], "--out", str(tmp / "shards"))
    rows = []
    for name, model, data in (
            ("bpe-8192 shards", {"layers": 6, "hidden": 384, "heads": 6, "vocab": 8192},
             {"source": "tokens", "path": str(tmp / "shards")}),
            ("byte builtin", {"preset": "gpt-mini"}, {"source": "builtin"})):
        job = {"name": "loader", "model": model, "training": {
            "seq_len": 256, "global_batch": 8, "precision": "fp32", "steps": steps, "log_every_steps": 10,
            "trace_every_steps": 0, "checkpoint": {"every_steps": 10 ** 6, "uri": f"file://{tmp / name / 'ckpt'}"},
            "data": data}}
        path = tmp / f"{name.replace(' ', '_')}.yaml"
        path.write_text(yaml.safe_dump(job))
        res = _frenzy("train", str(path), "--run-dir", str(tmp / name / "run"))
        rows.append({"data": name, "steps": res["steps_run"], "step_s": (res["elapsed_s"] / max(res["steps_run"], 1)),
                     "tokens_per_s": res["tokens_per_s"], "data_s_total": res["data_s_total"],
                     "data_fraction": res["data_fraction"]})
        print(rows[-1], file=sys.stderr, flush=True)
    return [{"tokenizer": tok, "prepare": prep}, *rows]


def main() -> int:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["FRENZY_CACHE"] = str(tmp / "cache")
        agree = logit_agreement(tmp)
        setup, *loader = loader_vs_step(tmp, int(os.environ.get("BENCH_STEPS", "30")))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, no GPU"
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": machine, "logits": agree, "loader": loader,
           "tokenizer_train": {k: setup["tokenizer"][k] for k in ("vocab_size", "bytes", "seconds")},
           "prepare": {k: setup["prepare"][k] for k in ("tokens", "documents", "bytes", "seconds", "tokens_per_s")}}
    out = REPO / "benchmarks" / "results"
    (out / "real_models.json").write_text(json.dumps(doc, indent=1))
    p = doc["prepare"]
    lines = [f"# Real models and data ({doc['date']}, {machine})", "",
             "`python benchmarks/real_models.py`", "",
             "## Imported Hugging Face models: logits against `transformers` (fp32, 4 x 512 tokens)", "",
             "| model | parameters | max abs diff (import) | max abs diff (export -> transformers) | max abs logit |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['max_abs_diff']:.2e} | {r['export_max_abs_diff']:.2e} | "
              f"{r['max_abs_logit']:.2f} |" for r in agree]
    lines += ["", "## The loader against `frenzy train` (gpt-mini shape, seq 256, batch 8, fp32)", "",
              f"BPE trained on the built-in corpus ({doc['tokenizer_train']['bytes'] / 1e6:.1f} MB) in "
              f"{doc['tokenizer_train']['seconds']:.1f} s; `frenzy data prepare` wrote {p['tokens']:,} tokens in "
              f"{p['seconds']:.1f} s ({p['tokens_per_s']:,.0f} tokens/s).", "",
              "| data | steps | s/step | tokens/s | loader s | loader / loop (target < 5%) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['data']} | {r['steps']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['data_s_total']:.3f} | "
              f"**{100 * r['data_fraction']:.2f}%** |" for r in loader]
    (out / "real_models.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
