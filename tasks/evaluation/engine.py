"""The inference side of a trial: a model loaded for batched scoring and batched greedy generation.

Models come from a checkpoint (`load_remote`: storage URI, manifest-verified shards, any training layout), from a
Hugging Face model directory (config.json + safetensors), or from the node's shared-memory copy a precursor made
(`load_shm`). Text goes through the tokenizer the model was trained with (the checkpoint root's tokenizer.json,
the model directory's, or UTF-8 bytes).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from tasks.errors import FrenzyError
from tasks.evaluation.decode import Sampling, greedy, prompt_room
from tasks.jobspec import ModelSpec
from tasks.training import checkpoint as ck
from tasks.training.checkpoint import CheckpointMismatch
from tasks.training.data import cache_dir
from tasks.training.model import GPT
from tasks.training.storage import Storage
from tasks.training.tokenizer import Tokenizer, load_tokenizer

#: The context a Hugging Face model is evaluated at when its config allows more (rotary tables are this long).
HF_EVAL_SEQ_LEN = 4096


class ModelInfo(dict):
    """What a trial needs besides weights: the model spec, context length, data spec, step, run, and where the
    tokenizer is (`tokenizer_root` + `tokenizer`: a storage root and key, or None + a local path; None: bytes)."""


def is_hf_dir(uri: str) -> bool:
    """A local Hugging Face model directory (evaluated as step 0 of a run named after it)."""
    p = Path(uri.removeprefix("file://")).expanduser()
    return "://" not in uri.removeprefix("file://") and p.is_dir() and (p / "config.json").is_file()


def hf_info(folder: str) -> ModelInfo:
    from tasks.hf.config import max_positions

    p = Path(folder.removeprefix("file://")).expanduser().resolve()
    spec = ModelSpec(hf=str(p))
    tok = str(p) if (p / "tokenizer.json").is_file() else None
    _check_hf_tokenizer(p, tok, spec.vocab)
    return ModelInfo(model=spec.shape_dump(), seq_len=min(max_positions(p), HF_EVAL_SEQ_LEN), data=None, step=0,
                     run=p.name, tokenizer_root=None, tokenizer=tok, source=str(p))


def _check_hf_tokenizer(folder: Path, tok: str | None, vocab: int) -> None:
    """A model directory's tokenizer must fit its embedding: without one the ids are bytes (vocab 256)."""
    from tasks.hf.config import HFError

    n = load_tokenizer(tok).vocab_size if tok else 256
    if tok is None and vocab != 256:
        raise HFError(f"{folder} has no tokenizer.json, so its text would be read as bytes, but its vocab is {vocab}; "
                      "copy the model's tokenizer.json into the directory")
    if n > vocab:
        raise HFError(f"{folder}/tokenizer.json has {n} tokens but the model's vocab_size is {vocab}; its ids would "
                      "index past the embedding: use the tokenizer the model was trained with")


def tokenizer_path(info: ModelInfo) -> str | None:
    """A local tokenizer.json (or model directory) for `info`, fetched from the checkpoint root once and cached by
    its content-addressed key; None for the byte tokenizer."""
    key, root = info.get("tokenizer"), info.get("tokenizer_root")
    if not key:
        return None
    if root is None:
        return key
    dest = cache_dir() / "tokenizers" / key
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        tmp.write_bytes(Storage(root).read(key))
        os.replace(tmp, dest)
    return str(dest)


def load_info_tokenizer(info: ModelInfo) -> Tokenizer:
    return load_tokenizer(tokenizer_path(info))


def split_uri(uri: str) -> tuple[str, int | None]:
    """(checkpoint root, step) from `<root>/step_00000040`, or (root, None) for a root (the newest commit)."""
    u = uri.rstrip("/")
    tail = u.rsplit("/", 1)[-1]
    if tail.startswith("step_") and tail[5:].isdigit():
        return u[: -len(tail) - 1], int(tail[5:])
    return u, None


def resolve_manifest(uri: str) -> tuple[Storage, ck.Manifest]:
    """The committed manifest a URI names (a step directory, or the newest committed step of a root)."""
    root, step = split_uri(uri)
    storage = Storage(root)
    if step is None:
        found = ck.committed(storage)
        if not found:
            raise ck.CheckpointError(f"{root} has no committed checkpoint; train first or give a step_NNNNNNNN URI")
        return storage, found[0]
    m = ck.read_manifest(storage, step)
    if m is None and (why := ck.retired(storage, step)):
        raise ck.RetiredCheckpoint(why)
    if m is None:
        raise ck.CheckpointError(f"{uri} is not a committed checkpoint (no manifest.json); "
                                 f"committed steps: {[x.step for x in ck.committed(storage)]}")
    return storage, m


def model_info(m: ck.Manifest, storage: Storage | None = None) -> ModelInfo:
    fp = m.fingerprint
    key = m.trainer.get("tokenizer")
    return ModelInfo(model=fp["model"], seq_len=fp["seq_len"], data=m.trainer.get("data"), step=m.step, run=m.run,
                     tokenizer_root=storage.uri if key and storage is not None else None, tokenizer=key)


def load_remote(uri: str) -> tuple[dict[str, torch.Tensor], ModelInfo]:
    """Full weights and model info from storage (every shard's sha256 is checked), or from a Hugging Face model
    directory."""
    if is_hf_dir(uri):
        from tasks.hf.convert import load_hf_state

        info = hf_info(uri)
        return load_hf_state(info["source"], ModelSpec.model_validate(info["model"]), int(info["seq_len"])), info
    storage, m = resolve_manifest(uri)
    return ck.read_full(storage, m), model_info(m, storage)


def write_shm(state: dict[str, torch.Tensor], info: ModelInfo, dest: Path) -> int:
    """Write a loaded model to `dest` (a directory in /dev/shm); returns bytes. Atomic: info.json comes last."""
    dest.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.contiguous() for k, v in state.items()}, dest / "model.pt")
    (dest / "info.tmp").write_text(json.dumps(info))
    (dest / "info.tmp").rename(dest / "info.json")
    return (dest / "model.pt").stat().st_size


def load_shm(src: Path) -> tuple[dict[str, torch.Tensor], ModelInfo]:
    if not (src / "info.json").exists():
        raise FileNotFoundError(f"{src} holds no preloaded model (its precursor did not finish)")
    state = torch.load(src / "model.pt", map_location="cpu", mmap=True, weights_only=True)
    return state, ModelInfo(json.loads((src / "info.json").read_text()))


class LM:
    """Batched greedy generation and batched log-likelihoods over Frenzy's GPT, through the model's tokenizer."""

    def __init__(self, state: dict[str, torch.Tensor], info: ModelInfo, device: str = "cpu") -> None:
        spec = ModelSpec.model_validate(info["model"])
        self.seq_len = int(info["seq_len"])
        self.device = torch.device(device)
        self.model = GPT(spec, self.seq_len)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("lm_head") or not spec.tied_embeddings]
        if missing or unexpected:
            raise CheckpointMismatch(f"checkpoint does not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
        self.model.to(self.device).eval()
        self.info = info
        self.tok = load_info_tokenizer(info)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tok.encode(text)]

    @property
    def text_vocab(self) -> int | None:
        """The ids generation may pick: the tokenizer's, where the model's output layer is wider (none: all)."""
        size = int(getattr(self.tok, "vocab_size", 0) or 0)
        return size if 0 < size < int(self.model.spec.vocab or 0) else None

    @torch.inference_mode()
    def nll(self, tokens: np.ndarray) -> tuple[float, int]:
        """Summed negative log-likelihood (nats) of tokens[1:] given the prefix, and the count."""
        t = torch.as_tensor(np.asarray(tokens[: self.seq_len + 1], dtype=np.int64), device=self.device)[None]
        logp = self.model.logits(t[:, :-1]).log_softmax(-1)
        nll = -logp.gather(-1, t[:, 1:, None]).sum()
        return float(nll), int(t.shape[1] - 1)

    @torch.inference_mode()
    def nll_batch(self, rows: list[list[int]] | list[np.ndarray], batch: int = 16) -> list[tuple[float, int]]:
        """(summed NLL, predicted tokens) of each token row (cut to the context + 1), right-padded in batches of
        similar length."""
        rows = [[int(t) for t in r[: self.seq_len + 1]] for r in rows]
        out: list[tuple[float, int]] = [(0.0, 0)] * len(rows)
        for part in _length_batches(rows, batch):
            width = max(len(rows[i]) for i in part)
            ids = torch.zeros(len(part), width, dtype=torch.long)
            for j, i in enumerate(part):
                ids[j, : len(rows[i])] = torch.as_tensor(rows[i])
            ids = ids.to(self.device)
            logp = self.model.logits(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
            for j, i in enumerate(part):
                n = len(rows[i]) - 1
                out[i] = (float(-logp[j, :n].sum()), n)
        return out

    @torch.inference_mode()
    def logliks_batch(self, requests: list[tuple[str, list[str]]], batch: int = 32) -> list[list[float]]:
        """log P(choice | context) of every choice of every request: each (context, choice) is one row, rows of
        similar length share a right-padded forward pass (a row's padding comes after it, so causal attention
        never sees it). Contexts are left-truncated so the longest choice fits."""
        rows: list[tuple[list[int], int]] = []  # (tokens, where the choice starts)
        for context, choices in requests:
            ctx = self.encode(context)
            outs = [self.encode(c) for c in choices]
            longest = max(len(o) for o in outs)
            if longest >= self.seq_len:
                raise FrenzyError(f"a choice of {longest} tokens does not fit the model's context of {self.seq_len}")
            keep = self.seq_len - longest
            ctx = ctx[-keep:] if len(ctx) > keep else ctx
            if not ctx:  # nothing to condition on: start from the end-of-text token (or a newline)
                ctx = [self.tok.eos_id] if self.tok.eos_id is not None else self.encode("\n")
            rows += [(ctx + o, len(ctx)) for o in outs]
        scores = [0.0] * len(rows)
        for part in _length_batches([r for r, _ in rows], batch):
            width = max(len(rows[i][0]) for i in part)
            ids = torch.zeros(len(part), width, dtype=torch.long)
            for j, i in enumerate(part):
                ids[j, : len(rows[i][0])] = torch.as_tensor(rows[i][0])
            ids = ids.to(self.device)
            logp = self.model.logits(ids[:, :-1]).log_softmax(-1)
            for j, i in enumerate(part):
                toks, a = rows[i]
                tgt = ids[j, a:len(toks)]
                scores[i] = float(logp[j, a - 1:len(toks) - 1].gather(-1, tgt[:, None]).sum())
        res, k = [], 0
        for _, choices in requests:
            res.append(scores[k:k + len(choices)])
            k += len(choices)
        return res

    def logliks(self, context: str, choices: list[str]) -> list[float]:
        """log P(choice | context) for each choice of one question."""
        return self.logliks_batch([(context, choices)])[0]

    def generate(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | None = None) -> str:
        """Greedy continuation of `prompt` (left-truncated to the context), cut at the first stop string."""
        return self.generate_batch([prompt], max_new_tokens, stop)[0]

    def stopper(self, stop: list[str] | None):  # noqa: ANN201 - a predicate over a row's new tokens
        if not stop:
            return None
        if self.tok.name == "byte":
            raw = [s.encode() for s in stop]
            return lambda toks: any(bytes(toks).find(s) >= 0 for s in raw)
        # a stop string can span tokens: decode the row's tail, the longest stop string's UTF-8 bytes' worth of
        # tokens (+1): a byte-level BPE splits a character it never merged into byte tokens ("€" is three), and every
        # token but a special one decodes to at least one byte
        tail = max(len(s.encode()) for s in stop) + 1

        def ended(toks: list[int]) -> bool:
            text = self.tok.decode(toks[-tail:])  # once for every stop string
            return any(s in text for s in stop)

        return ended

    def _cut(self, ids: list[int], stop: list[str] | None) -> str:
        if self.tok.eos_id is not None and self.tok.eos_id in ids:
            ids = ids[: ids.index(self.tok.eos_id)]
        text = self.tok.decode(ids)
        cut = min((text.find(s) for s in stop or [] if s in text), default=-1)
        return text[:cut] if cut >= 0 else text

    def generate_batch(self, prompts: list[str], max_new_tokens: int = 64, stop: list[str] | None = None,
                       sampling: Sampling | None = None) -> list[str]:
        """Continuations of many prompts at once (KV cache, left padding: `decode.greedy`), greedy or sampled,
        each ended by a stop string or the end-of-text token."""
        outs = greedy(self.model, [self.encode(p) for p in prompts], max_new_tokens, self.stopper(stop),
                      eos=self.tok.eos_id, empty=self.tok.eos_id if self.tok.eos_id is not None else 10,
                      sampling=sampling, vocab=self.text_vocab)
        return [self._cut(o, stop) for o in outs]

    @torch.inference_mode()
    def generate_recompute(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | None = None) -> str:
        """The same greedy continuation without a cache (the whole window per token, the prompt cut as the cached
        engine cuts it): the reference the cached engine is tested and benchmarked against."""
        keep = prompt_room(self.seq_len, max_new_tokens)
        toks = self.encode(prompt)[-keep:] or [self.tok.eos_id if self.tok.eos_id is not None else 10]
        out: list[int] = []
        stopper = self.stopper(stop)
        for _ in range(max_new_tokens):
            window = torch.as_tensor([toks[-self.seq_len:]], dtype=torch.int64, device=self.device)
            nxt = int(self.model.logits(window)[0, -1, :self.text_vocab].argmax())
            toks.append(nxt)
            out.append(nxt)
            if nxt == self.tok.eos_id or (stopper and stopper(out)):
                break
        return self._cut(out, stop)


def _length_batches(rows: list[list[int]], size: int) -> list[list[int]]:
    """Row indices grouped `size` at a time, longest first, so a batch pads little."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    return [order[k:k + size] for k in range(0, len(order), size)]


def perplexity(nll: float, tokens: int, nbytes: int | None = None) -> dict[str, float]:
    """Loss and perplexity per token; bits per byte over the text's UTF-8 bytes (comparable across tokenizers;
    equal to bits per token for the byte tokenizer)."""
    loss = nll / max(tokens, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
            "bits_per_byte": nll / math.log(2) / max(nbytes if nbytes is not None else tokens, 1)}
