"""lm-eval's request contract on Frenzy's GPT, with the numbers of lm-eval's Hugging Face backend.

Tokenisation and truncation follow lm-eval 0.4's `HFLM` so that the same text gives the same token rows:
- a context's trailing whitespace moves to the continuation, which is the tail of the whole text's encoding;
- an empty context is the prefix token (BOS, else EOS); text is encoded with the tokenizer's special-token template
  unless it already starts with that token's text;
- a (context, continuation) row keeps its last `max_length + 1` tokens; a generation context keeps its last
  `max_length - max_gen_toks`;
- `loglikelihood_rolling` scores disjoint windows of `max_length` tokens, the first conditioned on the prefix token;
- generation is greedy up to `max_gen_toks` (default 256); the text, special tokens skipped, is cut at the first
  stop string (the task's `until` plus the end-of-text token's text).

What differs is how it is computed:
- Shared prefixes (the choices of a multiple-choice question) run once. A question is one packed row: its context,
  then each choice's tokens, with an attention mask that lets a choice see the context and itself only and positions
  that restart after the context for every choice, so each choice gets exactly the attention it gets alone.
- The output projection and softmax run only where a continuation token is predicted, not at every position.
- Generation uses the KV-cached batched decoder (`decode.greedy`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.errors import FrenzyError
from tasks.evaluation.decode import embed, greedy, run_blocks
from tasks.evaluation.engine import LM

#: The start of an empty context for a tokenizer without an end-of-text token (the byte tokenizer): a newline.
NO_EOS_PREFIX = 10
#: lm-eval's default `max_gen_toks`.
DEFAULT_MAX_GEN_TOKS = 256
#: generation kwargs that do not change greedy decoding (the sampling knobs are checked separately)
_GREEDY_KEYS = {"until", "max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens", "do_sample",
                "temperature", "top_p", "top_k"}
#: transformers' `clean_up_tokenization` (applied on decode when a tokenizer_config.json asks for it)
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class RequestError(FrenzyError):
    """A request Frenzy cannot answer as lm-eval's HF backend would; names the setting and the fix."""


@dataclass(frozen=True)
class GenSettings:
    """A generation request's settings, normalised as lm-eval does."""

    until: tuple[str, ...]
    max_gen_toks: int


def gen_settings(kwargs: dict, eos_text: str | None) -> GenSettings:
    """`until` (with the end-of-text token's text) and `max_gen_toks` of lm-eval generation kwargs; sampling and
    beam search are refused (Frenzy runs lm-eval generation greedily)."""
    unknown = sorted(set(kwargs) - _GREEDY_KEYS)
    if unknown:
        raise RequestError(f"generation_kwargs {unknown} are not supported (Frenzy decodes greedily with `until` and "
                           "`max_gen_toks`); remove them from the task's generation_kwargs")
    temperature = float(kwargs.get("temperature", 0.0) or 0.0)
    if kwargs.get("do_sample") or (temperature > 0 and kwargs.get("do_sample") is not False):
        raise RequestError(f"generation_kwargs ask for sampling (do_sample={kwargs.get('do_sample')}, temperature="
                           f"{temperature}); Frenzy runs lm-eval generation greedily: set do_sample: false")
    until = kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    if eos_text is not None and eos_text not in until:
        until.append(eos_text)
    limit = next((kwargs[k] for k in ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
                  if kwargs.get(k) is not None), DEFAULT_MAX_GEN_TOKS)
    return GenSettings(tuple(until), int(limit))


def cut_at_stops(text: str, until: Sequence[str]) -> str:
    """lm-eval's post-processing: the text before the first occurrence of each stop string in turn."""
    for term in until:
        if term:
            text = text.split(term)[0]
    return text


def rolling_windows(tokens: list[int], prefix: int, max_len: int) -> list[tuple[list[int], list[int]]]:
    """Disjoint (context, continuation) windows that together predict every token once: the first `max_len`
    tokens after `prefix`, then each further block of up to `max_len` after the `max_len` tokens before it."""
    if not tokens:
        return []
    first = min(max_len, len(tokens))
    out = [([prefix], tokens[:first])]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_len)
        end = done + n
        out.append((tokens[max(end - max_len - 1, 0):end - n], tokens[end - n:end]))
        done = end
    return out


def _tokenizer_config(lm: LM) -> dict:
    path = getattr(lm.tok, "path", None)
    cfg = Path(path).parent / "tokenizer_config.json" if path else None
    if cfg is None or not cfg.is_file():
        return {}
    try:
        doc = json.loads(cfg.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}  # the tokenizer loader reports a damaged file; here it only tunes decoding
    return doc if isinstance(doc, dict) else {}


def _token_name(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Harness:
    """Answers lm-eval requests with a loaded Frenzy `LM`."""

    def __init__(self, lm: LM, max_length: int | None = None, batch_tokens: int = 8192, gen_batch: int = 16) -> None:
        self.lm, self.model, self.tok = lm, lm.model, lm.tok
        self.max_length = int(max_length or lm.seq_len)
        if self.max_length > lm.seq_len:
            raise RequestError(f"max_length {self.max_length} exceeds the model's context of {lm.seq_len}")
        self.batch_tokens, self.gen_batch = int(batch_tokens), int(gen_batch)
        cfg = _tokenizer_config(lm)
        self.cleanup = bool(cfg.get("clean_up_tokenization_spaces", False))
        bos = _token_name(cfg.get("bos_token"))
        bos_id = self.tok.tok.token_to_id(bos) if bos and hasattr(self.tok, "tok") else None
        self.eos_id = self.tok.eos_id
        self.prefix_id = bos_id if bos_id is not None else self.eos_id if self.eos_id is not None else NO_EOS_PREFIX
        self.prefix_text = self._decode([self.prefix_id], skip_special=False)
        self.eos_text = self._decode([self.eos_id], skip_special=False) if self.eos_id is not None else None

    # ------------------------------------------------------------------------------------------ tokenisation

    def encode(self, text: str, special: bool | None = None) -> list[int]:
        """Token ids of `text`; `special` None: with the tokenizer's special-token template unless the text already
        starts with the prefix token's text (lm-eval's `tok_encode`)."""
        if not hasattr(self.tok, "tok"):  # the byte tokenizer has no special tokens
            return [int(t) for t in self.tok.encode(text)]
        if special is None:
            special = not (self.prefix_text and text.startswith(self.prefix_text))
        return list(self.tok.tok.encode(text, add_special_tokens=special).ids)

    def _decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        if not hasattr(self.tok, "tok"):
            return self.tok.decode(ids)
        text = self.tok.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)
        if self.cleanup:
            for a, b in _CLEANUP:
                text = text.replace(a, b)
        return text

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context, continuation) token ids as lm-eval splits them."""
        if context == "":
            cont = self.encode(continuation, special=False)
            return ([self.prefix_id], cont) if not cont or cont[0] != self.prefix_id else (cont[:1], cont[1:])
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        whole, ctx = self.encode(context + continuation), self.encode(context)
        return ctx, whole[len(ctx):]

    # ------------------------------------------------------------------------------------------ requests

    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """(log P(continuation | context), whether greedy decoding would produce it) of each pair."""
        return self.loglikelihood_tokens([self.encode_pair(c, x) for c, x in pairs])

    def loglikelihood_rolling(self, texts: Sequence[str]) -> list[float]:
        """log P(text) of each text, over disjoint windows of the context length."""
        windows, owner = [], []
        for i, t in enumerate(texts):
            for w in rolling_windows(self.encode(t), self.prefix_id, self.max_length):
                windows.append(w)
                owner.append(i)
        totals = [0.0] * len(texts)
        for i, (ll, _) in zip(owner, self.loglikelihood_tokens(windows), strict=True):
            totals[i] += ll
        return totals

    def loglikelihood_tokens(self, reqs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[tuple[float, bool]]:
        """(log-likelihood, is greedy) of token-level (context, continuation) requests; rows sharing a context are
        scored in one packed row (see the module docstring)."""
        groups: dict[tuple[int, ...], dict[tuple[int, ...], list[int]]] = {}
        for i, (ctx, cont) in enumerate(reqs):
            if not cont or not ctx:
                raise RequestError(f"request {i} has an empty {'continuation' if not cont else 'context'}")
            if len(cont) > self.max_length:
                raise RequestError(f"a continuation of {len(cont)} tokens does not fit the context of "
                                   f"{self.max_length}")
            seq = (list(ctx) + list(cont))[-(self.max_length + 1):]
            groups.setdefault(tuple(seq[:-len(cont)]), {}).setdefault(tuple(cont), []).append(i)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(reqs)
        rows = [r for p, conts in groups.items() for r in _pack(list(p), conts, self.max_length)]
        for batch in _batches(rows, self.batch_tokens):
            for row, scores in zip(batch, _score_rows(self.model, batch), strict=True):
                for owners, score in zip(row.owners, scores, strict=True):
                    for i in owners:
                        out[i] = score
        return out

    def generate_until(self, reqs: Sequence[tuple[str, dict]]) -> list[str]:
        """Greedy continuations of each (context, generation kwargs), cut at the stop strings."""
        out = [""] * len(reqs)
        by_kwargs: dict[str, list[int]] = {}
        for i, (_, kwargs) in enumerate(reqs):
            by_kwargs.setdefault(json.dumps(kwargs, sort_keys=True, default=str), []).append(i)
        for idx in by_kwargs.values():
            st = gen_settings(reqs[idx[0]][1], self.eos_text)
            keep = self.max_length - st.max_gen_toks
            if keep <= 0:
                raise RequestError(f"max_gen_toks {st.max_gen_toks} leaves no room for a context in the model's "
                                   f"{self.max_length} tokens; lower max_gen_toks in the task's generation_kwargs")
            enc = {i: self.encode(reqs[i][0])[-keep:] for i in idx}
            order = sorted(idx, key=lambda i: -len(enc[i]))
            stop = self.lm.stopper(list(st.until))
            for k in range(0, len(order), self.gen_batch):
                part = order[k:k + self.gen_batch]
                toks = greedy(self.model, [enc[i] for i in part], st.max_gen_toks, stop, eos=self.eos_id,
                              empty=self.prefix_id, vocab=self.lm.text_vocab)
                for i, t in zip(part, toks, strict=True):
                    out[i] = cut_at_stops(self._decode(t), st.until)
        return out


# ---------------------------------------------------------------------------------------------- packed rows

@dataclass
class _Row:
    """One shared context and the distinct continuations scored after it (`owners`: the requests of each)."""

    prefix: list[int]
    conts: list[tuple[int, ...]]
    owners: list[list[int]]

    @property
    def length(self) -> int:
        return len(self.prefix) + sum(len(c) - 1 for c in self.conts)


def _pack(prefix: list[int], conts: dict[tuple[int, ...], list[int]], max_length: int) -> list[_Row]:
    """The continuations of one context in as few rows as keep each row within the context length (or one
    continuation's own row, when that is longer): a row's attention costs the square of its length, so packing a
    short context with long continuations (rolling windows after the prefix token) would cost more than it saves."""
    cap = max(max_length, len(prefix) + max(len(c) for c in conts) - 1)
    rows: list[_Row] = []
    for c, owners in conts.items():
        if rows and rows[-1].length + len(c) - 1 <= cap:
            rows[-1].conts.append(c)
            rows[-1].owners.append(owners)
        else:
            rows.append(_Row(prefix, [c], [owners]))
    return rows


def _batches(rows: list[_Row], budget: int) -> list[list[_Row]]:
    """Rows longest first, each batch at most `budget` padded tokens and `budget`^2 / 4 attention cells (the mask
    and the score matrix grow with the square of the padded length)."""
    rows = sorted(rows, key=lambda r: -r.length)
    out: list[list[_Row]] = []
    for r in rows:
        if out:
            width = out[-1][0].length
            n = len(out[-1]) + 1
            if n * width <= budget and n * width * width <= budget * budget // 4:
                out[-1].append(r)
                continue
        out.append([r])
    return out


def _layout(rows: list[_Row], device: torch.device) -> tuple:
    """Token ids, positions and the attention mask of packed rows (None: plain causal, when no row shares its
    context), plus per continuation the flat index of the position predicting each of its tokens and the tokens."""
    width = max(r.length for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    seg = torch.full((len(rows), width), -1, dtype=torch.long)  # -1 padding, 0 the context, k+1 continuation k
    where, targets = [], []
    for b, r in enumerate(rows):
        p = len(r.prefix)
        ids[b, :p] = torch.as_tensor(r.prefix)
        pos[b, :p] = torch.arange(p)
        seg[b, :p] = 0
        at = p
        for k, c in enumerate(r.conts):
            n = len(c) - 1  # the last token is only predicted, never fed
            ids[b, at:at + n] = torch.as_tensor(c[:-1], dtype=torch.long)
            pos[b, at:at + n] = torch.arange(p, p + n)
            seg[b, at:at + n] = k + 1
            where.append([b * width + p - 1] + [b * width + at + j for j in range(n)])
            targets.append(list(c))
            at += n
    if all(len(r.conts) == 1 for r in rows):  # nothing shared: causal attention (padding only at the ends)
        return ids.to(device), pos.to(device), None, where, targets
    col = torch.arange(width)
    causal = col[None, :] <= col[:, None]
    sees = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])
    mask = (causal[None] & sees & (seg[:, :, None] >= 0)) | torch.eye(width, dtype=torch.bool)[None]
    return ids.to(device), pos.to(device), mask[:, None].to(device), where, targets


@torch.inference_mode()
def _score_rows(model: torch.nn.Module, rows: list[_Row], chunk: int = 2048) -> list[list[tuple[float, bool]]]:
    """(log-likelihood, is greedy) of every continuation of every row, in one forward pass over the batch; the
    output projection runs on the predicting positions only, `chunk` at a time."""
    device = next(model.parameters()).device
    ids, pos, mask, where, targets = _layout(rows, device)
    x = run_blocks(model, embed(model, ids, pos), pos, mask)  # type: ignore[arg-type]
    flat = x.reshape(-1, x.shape[-1])
    index = torch.as_tensor([i for w in where for i in w], device=device)
    target = torch.as_tensor([t for ts in targets for t in ts], device=device)
    lp, hit = [], []
    for k in range(0, len(index), chunk):
        logits = model.lm_head(model.norm_f(flat[index[k:k + chunk]])).float()
        tgt = target[k:k + chunk]
        lp.append(logits.log_softmax(-1).gather(-1, tgt[:, None])[:, 0])
        hit.append(logits.argmax(-1) == tgt)
    logp, greedy_hit = torch.cat(lp), torch.cat(hit)
    scores, at = [], 0
    for r in rows:
        mine = []
        for c in r.conts:
            n = len(c)
            mine.append((float(logp[at:at + n].sum()), bool(greedy_hit[at:at + n].all())))
            at += n
        scores.append(mine)
    return scores
