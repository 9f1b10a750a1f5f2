"""The KV-cached, batched greedy decoder (tasks/evaluation/decode.py) against generation without a cache."""

from __future__ import annotations

import pytest
import torch

from tasks.evaluation.engine import LM, ModelInfo
from tasks.jobspec import ModelSpec
from tasks.training.model import GPT

PROMPTS = ["def add(a, b):\n", "x", "The quick brown fox jumps over the lazy dog, again and again and", "", "\n\n#"]


def _lm(model: dict, seq_len: int = 64, seed: int = 0) -> LM:
    spec = ModelSpec.model_validate(model)
    torch.manual_seed(seed)
    state = GPT(spec, seq_len).state_dict()
    return LM(state, ModelInfo(model=spec.model_dump(), seq_len=seq_len))


@pytest.mark.parametrize("model", [
    {"preset": "gpt-tiny"},  # learned positions, MHA, GELU
    {"preset": "gpt-tiny", "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "kv_heads": 2, "bias": False}])
def test_batched_cached_generation_matches_the_recompute_path_token_for_token(model):
    lm = _lm(model)
    ref = [lm.generate_recompute(p, 40) for p in PROMPTS]
    assert lm.generate_batch(PROMPTS, 40) == ref  # one batch, left-padded to the longest prompt
    assert [lm.generate(p, 40) for p in PROMPTS] == ref  # one at a time


def test_generation_past_the_context_slides_like_the_recompute_path():
    lm = _lm({"preset": "gpt-tiny"}, seq_len=32)
    prompts = ["a" * 50, "short"]  # 60 new tokens outgrow the context of 32 whatever the prompt keeps
    assert lm.generate_batch(prompts, 60) == [lm.generate_recompute(p, 60) for p in prompts]


def test_a_prompt_longer_than_the_context_is_cut_to_leave_room_for_the_new_tokens_and_stays_in_the_cache():
    lm = _lm({"preset": "gpt-tiny"}, seq_len=32, seed=2)
    long = "".join(chr(97 + i % 26) for i in range(50))
    full_windows: list[int] = []
    logits = lm.model.logits
    lm.model.logits = lambda idx, *a, **k: (full_windows.append(idx.shape[1]), logits(idx, *a, **k))[1]
    out = lm.generate_batch([long, "short"], 8)
    assert full_windows == []  # every token came from the cache: no row ran a full window
    lm.model.logits = logits
    # the first 50 - (32 - 8) characters are dropped (byte tokens), as lm-eval's HF backend truncates
    assert out == [lm.generate_batch([long[-24:]], 8)[0], lm.generate_batch(["short"], 8)[0]]
    assert out == [lm.generate_recompute(p, 8) for p in (long, "short")]


def test_stop_sequences_cut_each_row():
    lm = _lm({"preset": "gpt-tiny"}, seed=3)
    full = lm.generate_recompute("abc", 40)
    stop = full[5:7]
    assert stop and lm.generate_batch(["abc", "abc"], 40, stop=[stop]) == [full[:full.find(stop)]] * 2


def test_a_generation_dataset_decodes_its_chunk_in_batches_with_the_same_predictions():
    from tasks.evaluation.datasets import EvalContext, HumanEval

    lm = _lm({"preset": "gpt-tiny"}, seq_len=512)
    ds = HumanEval({"max_new_tokens": 24, "batch": 4}, EvalContext(seq_len=512))
    examples = [ds.example(i) for i in range(6)]  # two batches: 4 and 2
    assert ds.infer_batch(lm, examples) == [ds.infer(lm, ex) for ex in examples]


def test_sampling_is_reproducible_by_seed_and_top_k_1_is_greedy():
    from tasks.evaluation.decode import Sampling

    lm = _lm({"preset": "gpt-tiny"}, seed=1)
    greedy = lm.generate_batch(PROMPTS, 30)
    assert lm.generate_batch(PROMPTS, 30, sampling=Sampling(temperature=0.8, top_k=1, seed=5)) == greedy
    a = lm.generate_batch(PROMPTS, 30, sampling=Sampling(temperature=1.0, seed=7))
    assert a == lm.generate_batch(PROMPTS, 30, sampling=Sampling(temperature=1.0, seed=7))
    assert a != greedy  # an untrained model's distribution is flat: sampling leaves the argmax path
    assert a != lm.generate_batch(PROMPTS, 30, sampling=Sampling(temperature=1.0, seed=8))


def test_top_k_and_top_p_keep_only_the_likely_tokens():
    from tasks.evaluation.decode import Sampling, pick

    logits = torch.tensor([[5.0, 4.0, 1.0, 0.0, -1.0]]).repeat(2000, 1)
    gen = torch.Generator().manual_seed(0)
    assert set(pick(logits, Sampling(temperature=1.0, top_k=2), gen).tolist()) == {0, 1}
    # softmax mass: 0.71, 0.26, ... so top_p 0.9 keeps the first two and 0.5 only the first
    assert set(pick(logits, Sampling(temperature=1.0, top_p=0.9), gen).tolist()) == {0, 1}
    assert set(pick(logits, Sampling(temperature=1.0, top_p=0.5), gen).tolist()) == {0}
    with pytest.raises(ValueError, match="top_p"):
        Sampling(temperature=1.0, top_p=0.0)


def test_rows_that_finish_early_leave_the_batch_and_the_rest_decode_unchanged():
    """Rows ending at different steps leave the batch as they finish (a quarter of it at a time); every row's tokens
    equal its one-prompt-at-a-time generation."""
    from tasks.evaluation.decode import greedy

    lm = _lm({"preset": "gpt-tiny", "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False}, seed=2)
    rows = [lm.encode(f"row {i}: " + "ab" * i) for i in range(8)]
    free = [greedy(lm.model, [r], 30)[0] for r in rows]
    mixed = 0
    for eos in {f[k] for f in free for k in (2, 9)}:  # end tokens some rows reach early and others late or never
        solo = [greedy(lm.model, [r], 30, eos=eos)[0] for r in rows]
        assert greedy(lm.model, rows, 30, eos=eos) == solo
        longest = max(len(s) for s in solo)
        mixed += sum(len(s) < longest for s in solo) >= 2
    assert mixed  # some end token made two rows or more finish while others went on: they left the batch


def test_decode_weights_follow_in_place_updates_of_every_projection():
    """The decoder's fused inference weights (q|k|v as one) are rebuilt when a projection changes in place (as
    training between evaluations does): generation after the update equals a fresh model's with the same update."""
    lm = _lm({"preset": "gpt-tiny"}, seed=4)
    before = lm.generate_batch(PROMPTS, 20)
    fresh = _lm({"preset": "gpt-tiny"}, seed=4)
    with torch.no_grad():
        for m in (lm, fresh):
            for blk in m.model.blocks:
                blk.q.weight.mul_(-3.0)
                blk.proj.weight.mul_(-3.0)
                blk.fc2.weight.mul_(2.0)
    after = lm.generate_batch(PROMPTS, 20)
    assert after == fresh.generate_batch(PROMPTS, 20) == [fresh.generate_recompute(p, 20) for p in PROMPTS]
    assert after != before


def test_a_model_wider_than_its_byte_tokenizer_generates_only_byte_ids():
    from tasks.evaluation.decode import Sampling

    lm = _lm({"preset": "gpt-tiny", "vocab": 4096}, seq_len=64, seed=4)  # a 4k-id output layer on byte-level data
    with torch.no_grad():
        lm.model.lm_head.weight[256:] += 5.0  # make the ids past the bytes the likeliest
    for sampling in (None, Sampling(temperature=1.0, seed=3)):
        texts = lm.generate_batch(PROMPTS, 12, stop=["\n"], sampling=sampling)  # stop strings check bytes
        assert len(texts) == len(PROMPTS) and all(isinstance(t, str) for t in texts)
    assert lm.generate_batch(PROMPTS, 12) == [lm.generate_recompute(p, 12) for p in PROMPTS]
    assert lm.text_vocab == 256


def test_a_multibyte_stop_string_ends_a_row_under_a_byte_level_bpe(tmp_path):
    from tasks.training.tokenizer import train_bpe

    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200)  # no "€": BPE keeps it as 3 byte tokens
    tok = train_bpe([str(corpus)], tmp_path / "tok", vocab_size=300)
    spec = ModelSpec.model_validate({"preset": "gpt-tiny", "vocab": tok.vocab_size})
    lm = LM(GPT(spec, 64).state_dict(), ModelInfo(model=spec.model_dump(), seq_len=64, tokenizer=tok.path,
                                                  tokenizer_root=None))
    ids = lm.encode("ab €")
    assert len(ids) - len(lm.encode("ab ")) >= 2  # the stop spans tokens
    assert lm.stopper(["€"])(ids) and lm.stopper(["ab €"])(ids) and not lm.stopper(["€"])(lm.encode("ab "))
