"""The inference side of a trial: a checkpointed model loaded for scoring and greedy generation.

Models come from a checkpoint (`load_remote`: storage URI, manifest-verified shards, any training layout) or
from the node's shared-memory copy a precursor made (`load_shm`). Tokens are UTF-8 bytes, as in training.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from tasks.evaluation.decode import greedy
from tasks.jobspec import ModelSpec
from tasks.training import checkpoint as ck
from tasks.training.data import encode
from tasks.training.model import GPT
from tasks.training.storage import Storage


class ModelInfo(dict):
    """What a trial needs besides weights: the model spec, context length, data spec, step, run (JSON)."""


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
    if m is None:
        raise ck.CheckpointError(f"{uri} is not a committed checkpoint (no manifest.json); "
                                 f"committed steps: {[x.step for x in ck.committed(storage)]}")
    return storage, m


def model_info(m: ck.Manifest) -> ModelInfo:
    fp = m.fingerprint
    return ModelInfo(model=fp["model"], seq_len=fp["seq_len"], data=m.trainer.get("data"), step=m.step, run=m.run)


def load_remote(uri: str) -> tuple[dict[str, torch.Tensor], ModelInfo]:
    """Full weights and model info from storage (every shard's sha256 is checked)."""
    storage, m = resolve_manifest(uri)
    return ck.read_full(storage, m), model_info(m)


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
    """Greedy generation and log-likelihoods over a byte-level GPT."""

    def __init__(self, state: dict[str, torch.Tensor], info: ModelInfo, device: str = "cpu") -> None:
        spec = ModelSpec.model_validate(info["model"])
        self.seq_len = int(info["seq_len"])
        self.device = torch.device(device)
        self.model = GPT(spec, self.seq_len)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("lm_head") or not spec.tied_embeddings]
        if missing or unexpected:
            raise ValueError(f"checkpoint does not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
        self.model.to(self.device).eval()
        self.info = info

    @torch.inference_mode()
    def nll(self, tokens: np.ndarray) -> tuple[float, int]:
        """Summed negative log-likelihood (nats) of tokens[1:] given the prefix, and the count."""
        t = torch.as_tensor(np.asarray(tokens[: self.seq_len + 1], dtype=np.int64), device=self.device)[None]
        logp = self.model.logits(t[:, :-1]).log_softmax(-1)
        nll = -logp.gather(-1, t[:, 1:, None]).sum()
        return float(nll), int(t.shape[1] - 1)

    @torch.inference_mode()
    def logliks(self, context: str, choices: list[str]) -> list[float]:
        """log P(choice | context) for each choice, scored in one batch (context left-truncated to fit)."""
        ctx = encode(context)
        outs = [encode(c) for c in choices]
        longest = max(len(o) for o in outs)
        if longest >= self.seq_len:
            raise ValueError(f"a choice of {longest} bytes does not fit the model's context of {self.seq_len}")
        ctx = ctx[-(self.seq_len - longest):] if len(ctx) + longest > self.seq_len else ctx
        rows = [np.concatenate([ctx, o]) for o in outs]
        width = max(len(r) for r in rows)
        batch = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            batch[i, : len(r)] = r
        t = torch.as_tensor(batch, device=self.device)
        logp = self.model.logits(t[:, :-1]).log_softmax(-1)
        res = []
        for i, o in enumerate(outs):
            a = len(ctx)
            idx = t[i, a:a + len(o)]
            res.append(float(logp[i, a - 1:a - 1 + len(o)].gather(-1, idx[:, None]).sum()))
        return res

    def generate(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | None = None) -> str:
        """Greedy continuation of `prompt` (left-truncated to the context), cut at the first stop string."""
        return self.generate_batch([prompt], max_new_tokens, stop)[0]

    def generate_batch(self, prompts: list[str], max_new_tokens: int = 64, stop: list[str] | None = None
                       ) -> list[str]:
        """Greedy continuations of many prompts at once (KV cache, left padding: `decode.greedy`)."""
        outs = greedy(self.model, [list(encode(p)) for p in prompts], max_new_tokens,
                      [s.encode() for s in stop] if stop else None)
        texts = []
        for o in outs:
            text = bytes(o).decode("utf-8", errors="replace")
            cut = min((text.find(s) for s in stop or [] if s in text), default=-1)
            texts.append(text[:cut] if cut >= 0 else text)
        return texts

    @torch.inference_mode()
    def generate_recompute(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | None = None) -> str:
        """The same greedy continuation without a cache (the whole window per token): the reference the cached
        engine is tested and benchmarked against."""
        toks = list(encode(prompt)[-(self.seq_len - 1):]) or [10]
        out = bytearray()
        for _ in range(max_new_tokens):
            window = torch.as_tensor([toks[-self.seq_len:]], dtype=torch.int64, device=self.device)
            nxt = int(self.model.logits(window)[0, -1].argmax())
            toks.append(nxt)
            out.append(nxt)
            if stop:
                text = out.decode("utf-8", errors="replace")
                cut = min((text.find(s) for s in stop if s in text), default=-1)
                if cut >= 0:
                    return text[:cut]
        return out.decode("utf-8", errors="replace")


def perplexity(nll: float, tokens: int) -> dict[str, float]:
    loss = nll / max(tokens, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "bits_per_byte": loss / math.log(2)}
