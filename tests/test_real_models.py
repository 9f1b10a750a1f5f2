"""The real-model path end to end, through the real trainer: a Hugging Face Llama directory (made here with
`transformers`, tokenizer trained on text the project ships) is trained on from its own weights over pre-tokenized
shards, resumed, evaluated through its tokenizer, exported, and loaded back by `transformers`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.jobspec import parse_job
from tasks.training import data as D
from tests.trainer_util import progress, run

transformers = pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from tasks.training.prepared import prepare_dir
    from tasks.training.tokenizer import load_tokenizer, train_bpe

    root = tmp_path_factory.mktemp("real")
    old_cache = os.environ.get("FRENZY_CACHE")
    os.environ["FRENZY_CACHE"] = str(root / "cache")
    model_dir = root / "llama"
    train_bpe([str(REPO / "README.md"), str(REPO / "tasks")], model_dir, vocab_size=512)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=512, max_position_embeddings=256,
                                   rope_theta=500000.0, tie_word_embeddings=False)
    hf_model = transformers.LlamaForCausalLM(cfg).eval()
    hf_model.save_pretrained(model_dir)
    tok = load_tokenizer(str(model_dir))
    files = sorted((REPO / "tasks").rglob("*.py"))
    prepare_dir(iter([f.read_text() for f in files]), tok, root / "shards", {"tokenizer": tok.name},
                shard_tokens=40_000)
    job = parse_job({"name": "real", "model": {"hf": str(model_dir)}, "training": {
        "seq_len": 64, "global_batch": 4, "precision": "fp32", "steps": 6, "lr": 1e-3, "warmup_steps": 1,
        "log_every_steps": 1, "trace_every_steps": 0, "spike": {"min_steps": 100},
        "checkpoint": {"every_steps": 3, "uri": f"file://{root / 'ckpt'}", "keep": 3},
        "data": {"source": "tokens", "path": str(root / "shards")}}})
    result = run(job, root / "run", timeout=600)
    yield {"root": root, "model_dir": model_dir, "hf_model": hf_model, "job": job, "result": result, "tok": tok}
    if old_cache is None:
        os.environ.pop("FRENZY_CACHE", None)
    else:
        os.environ["FRENZY_CACHE"] = old_cache


def test_training_starts_from_the_model_directory_weights(world):
    job, tok = world["job"], world["tok"]
    assert world["result"]["final_step"] == 6
    tokens = D.load_corpus(job.training.data, tok)
    train_tokens, _ = D.split(tokens)
    loader = D.BatchLoader(train_tokens, 64, 4, job.training.seed)
    x, y = loader.batch(loader.next_indices(D.Cursor()))
    with torch.no_grad():
        want = float(world["hf_model"](x, labels=None).logits.flatten(0, 1).log_softmax(-1)
                     .gather(-1, y.flatten()[:, None]).neg().mean())
    first = next(r for r in progress(world["root"] / "run") if r["event"] == "step")
    assert first["step"] == 1 and abs(first["loss"] - want) < 1e-3  # the loss of the HF model on batch 1


def test_checkpoints_carry_the_tokenizer_and_resume_on_it(world):
    from tasks.training import checkpoint as ck
    from tasks.training.storage import Storage

    st = Storage(world["job"].training.checkpoint.uri)
    m = ck.committed(st)[0]
    key = m.trainer["tokenizer"]
    assert st.read(key) == (world["model_dir"] / "tokenizer.json").read_bytes()
    assert m.fingerprint["tokenizer_sha256"] == world["tok"].sha256 and m.trainer["eos_id"] == world["tok"].eos_id
    job = world["job"].model_copy(deep=True)
    job.training.steps = 8
    res = run(job, world["root"] / "run", resume=True, timeout=600)
    assert res["final_step"] == 8 and any(r["event"] == "resume" and r["step"] == 6 for r in progress(world["root"] / "run"))


def test_evaluation_reads_text_through_the_tokenizer(world, tmp_path):
    from tasks.evaluation.runner import EvalOptions, evaluate
    from tasks.evaluation.suite import load_suite

    suite_file = tmp_path / "s.yaml"
    suite_file.write_text(
        "name: real\ndatasets:\n"
        "  - {name: heldout-loss, examples: 8, mode: ppl, infer_s_per_example: 0.004}\n"
        "  - {name: heldout-cloze, examples: 8, mode: ppl, infer_s_per_example: 0.006}\n"
        "  - {name: heldout-line, examples: 4, mode: gen, infer_s_per_example: 0.06, options: {max_new_tokens: 8}}\n")
    suite = load_suite(str(suite_file))
    res = evaluate(world["job"].training.checkpoint.uri, suite, EvalOptions(out_dir=str(tmp_path / "e"),
                                                                            learn_priors=False))
    loss = res.scores["heldout-loss"]
    # bits per byte counts the text's bytes: a BPE token covers several, so it is below bits per token
    assert 0 < loss["bits_per_byte"] < loss["loss"] / np.log(2)
    assert 0.0 <= res.scores["heldout-cloze"]["accuracy"] <= 1.0
    # the model directory itself evaluates too (step 0, its own tokenizer)
    res0 = evaluate(str(world["model_dir"]), suite, EvalOptions(out_dir=str(tmp_path / "e0"), learn_priors=False))
    assert res0.step == 0 and res0.run == "llama" and res0.scores["heldout-loss"]["loss"] > loss["loss"]


def test_exported_checkpoint_loads_in_transformers_with_its_logits(world, tmp_path):
    from tasks.evaluation.engine import LM, load_remote

    out = tmp_path / "export"
    r = subprocess.run([sys.executable, "-m", "cli", "export", world["job"].training.checkpoint.uri, str(out),
                        "--json"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["architecture"] == "LlamaForCausalLM" and doc["tokenizer"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    state, info = load_remote(world["job"].training.checkpoint.uri)
    lm = LM(state, info)
    ids = torch.tensor([lm.encode("def train(job):\n    return job.name")])
    with torch.no_grad():
        assert float((hf(ids).logits - lm.model.logits(ids)).abs().max()) < 2e-4
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert fast.encode("def train(job):") == lm.encode("def train(job):")


def test_plan_takes_a_model_directory(world):
    r = subprocess.run([sys.executable, "-m", "cli", "plan", str(world["model_dir"]), "--global-batch", "16",
                        "--seq-len", "128", "--json", "--top", "3"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"] == "llama" and len(doc["plans"]) == 3


def test_a_tokenizer_larger_than_the_model_vocab_is_refused(world, tmp_path):
    bad = world["root"] / "small"
    shutil.copytree(world["model_dir"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vocab_size"] = 300
    (bad / "config.json").write_text(json.dumps(cfg))
    job = world["job"].model_copy(deep=True)
    job.model = job.model.model_validate({"hf": str(bad)})
    job.training.checkpoint.uri = f"file://{tmp_path / 'c'}"
    from tests.trainer_util import start

    p = start(job, tmp_path / "run")
    assert p.wait(timeout=300) != 0
    assert "has 512 tokens but model vocab is 300" in (tmp_path / "run" / "train.log").read_text()


def test_a_large_vocab_with_no_tokenizer_asks_for_one(tmp_path):
    from tests.trainer_util import start, tiny_job

    job = tiny_job(f"file://{tmp_path / 'c'}", steps=2)
    job.model = job.model.model_validate({"preset": "gpt-tiny", "vocab": 50257})
    p = start(job, tmp_path / "run")
    assert p.wait(timeout=300) != 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "no tokenizer is given" in log and "data.tokenizer: byte" in log
