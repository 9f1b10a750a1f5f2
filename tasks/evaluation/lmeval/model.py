"""`frenzy`: a Frenzy checkpoint as an lm-eval model.

    lm_eval --model frenzy --model_args uri=file:///runs/x/ckpt --tasks ...        # newest committed step
    lm_eval --model frenzy --model_args uri=s3://bucket/run/ckpt/step_00000400 --tasks ...

`uri` is a committed checkpoint (a `step_NNNNNNNN` directory or a checkpoint root, file:// or s3://, written on any
data x tensor layout) or a Hugging Face model directory; the weights are read as the evaluator reads them (every
shard's sha256 checked) and never exported. Registered as `frenzy` through the `lm_eval.models` entry point (and,
for lm-eval releases that do not read it, `python -m tasks.evaluation.lmeval.plugin install`).

Other `model_args`: `max_length` (default the model's context), `batch_tokens` (padded tokens per log-likelihood
forward pass, default 8192), `threads` (torch threads; default torch's). `--batch_size N` sets the generation
batch (default 16; `auto` keeps the default). `--device cuda[:N]` uses a GPU where there is one, else the CPU, as
lm-eval's HF backend does.
"""

from __future__ import annotations

import logging

import torch
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM as HarnessLM
from lm_eval.api.registry import register_model

from tasks.evaluation.engine import LM, load_remote
from tasks.evaluation.lmeval.requests import Harness, RequestError

log = logging.getLogger(__name__)


def _device(device: str | None) -> str:
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("frenzy: device %s asked for but CUDA is not available; using the CPU", device)
        return "cpu"
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def _gen_batch(batch_size: int | str | None) -> int:
    if batch_size is None or str(batch_size).startswith("auto"):
        return 16
    try:
        n = int(batch_size)
    except ValueError:
        raise RequestError(f"--batch_size {batch_size!r} is not a number or auto") from None
    if n < 1:
        raise RequestError(f"--batch_size {n} must be at least 1")
    return n


@register_model("frenzy")
class FrenzyLM(HarnessLM):
    """lm-eval's model interface over a Frenzy checkpoint, with the request semantics of its HF backend."""

    def __init__(self, uri: str | None = None, device: str | None = None, batch_size: int | str | None = None,
                 max_batch_size: int | None = None, max_length: int | None = None, batch_tokens: int = 8192,
                 threads: int | None = None, **unknown: object) -> None:
        super().__init__()
        if unknown:
            raise RequestError(f"model_args {sorted(unknown)} are not frenzy's; it takes uri, max_length, batch_tokens, "
                               "threads (e.g. --model_args uri=file:///runs/x/ckpt)")
        if not uri:
            raise RequestError("the frenzy model needs a checkpoint: --model_args uri=file:///path/to/ckpt (or s3://, "
                               "a step_NNNNNNNN directory, or a Hugging Face model directory)")
        if threads:
            torch.set_num_threads(int(threads))
        state, info = load_remote(str(uri))
        self.lm = LM(state, info, _device(device))
        self.harness = Harness(self.lm, int(max_length) if max_length else None, int(batch_tokens),
                               _gen_batch(batch_size))
        self.uri, self.info = str(uri), info

    @property
    def max_length(self) -> int:
        return self.harness.max_length

    @property
    def tokenizer_name(self) -> str:
        return str(self.info.get("tokenizer") or "byte")

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = self.harness.loglikelihood([r.args for r in requests])  # type: ignore[misc]
        for r, ans in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", r.args, ans)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        out = self.harness.loglikelihood_rolling([r.args[0] for r in requests])
        for r, ans in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, ans)
        return out

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        out = self.harness.generate_until([(r.args[0], dict(r.args[1])) for r in requests])
        for r, ans in zip(requests, out, strict=True):
            self.cache_hook.add_partial("generate_until", r.args, ans)
        return out

    def get_model_info(self) -> dict:
        """What lm-eval adds to its results' config (whose `model` key stays the model's name)."""
        return {"uri": self.uri, "run": self.info.get("run"), "step": self.info.get("step"),
                "seq_len": self.info.get("seq_len"), "model_shape": self.info.get("model")}
