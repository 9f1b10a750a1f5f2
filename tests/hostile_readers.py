"""Issue 44's reader families, as a matrix: every reader of a user file (job, cluster, suite, meta and catalog YAML,
trace CSV, JSONL datasets, corpora, tokenizers, priors, score histories, ledgers, model configs) meets every hostile
kind of file that applies to it (a FIFO nobody writes, a character device, a symlink loop, a dangling link, a
directory, a duplicate key, an alias bomb, a non-finite number, a file past its size limit, bytes that are not
text). Each must be refused at once (exit 2) with a message that names what the file is; none may block, guess or
crash. A new reader is one row of `READERS`; a new kind, one entry of `KINDS`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.hostile_kit import Case, Run, cli, lib

R = "readers"
REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "examples/jobs/tiny.yaml")

JOB = "name: x\nmodel: {preset: gpt-tiny}\ntraining:\n  seq_len: 64\n  global_batch: 8\n  lr: 0.001\n"
CLUSTER = "name: c\nnodes:\n  - {name: a, gpu: A100-40GB-SXM, count: 8, inter_node_gbs: 12.5}\n"
SUITE = ("name: s\nmodel_load_s: {remote: 5.0, shm: 1.0}\ndatasets:\n"
         "  - {name: heldout-loss, examples: 32, mode: ppl, infer_s_per_example: 0.004}\n")
META = "dp_size: 2\npp_size: 2\ntp_size: 1\n"
CATALOG = ("- {name: X1, memory_gib: 40.0, bf16_tflops: 100.0, fp16_tflops: 100.0, fp32_tflops: 20.0, "
           "mem_bw_gbs: 1000.0, link_gbs: 100.0}\n")
TRACE = "submit_time,duration,num_gpus\n0,3600.0,1\n60,1800.0,2\n"
JSONL = '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n'
PRIORS = '{"cpu/gpt": {"datasets": {"d": {"infer_s_per_example": 0.5, "metric_s_per_example": 0.0}}}}\n'
HISTORY = '{"suite": "s", "step": 2, "uri": "file:///x", "scores": {}}\n'
CONFIG = ('{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, '
          '"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160, "vocab_size": 300, '
          '"max_position_embeddings": 128}\n')


@dataclass
class Reader:
    """A command (or the library call a command makes) that reads the file at `path(root)`."""

    name: str
    file: str
    """The file's name under the case directory."""
    valid: str
    """A valid content, mutated by the content kinds."""
    fmt: str
    """yaml, csv, jsonl, json or text: which content kinds apply."""
    act: Callable[[Path, Path], Run]
    """(root, path) -> what the user sees."""
    non_finite: str = ""
    """The valid content with a non-finite number where a number is expected."""
    duplicate: str = ""
    """The valid content with one key given twice (YAML)."""


def _meta_analyze(root: Path, p: Path) -> Run:
    (root / "t").mkdir(exist_ok=True)
    assert cli("stragglers", "generate", str(root / "t" / "a.parquet"), "--dp", "2", "--pp", "2", "--steps", "2").rc == 0
    return cli("stragglers", "analyze", str(root / "t" / "a.parquet"), "--meta", str(p))


def _catalog(p: Path) -> Run:
    from cluster.catalog import load_catalog

    return lib(lambda: load_catalog(p))


def _jsonl(p: Path) -> Run:
    from tasks.evaluation.datasets import resolve

    return lib(lambda: resolve(str(p), "gen"))


def _priors(p: Path) -> Run:
    from tasks.evaluation.priors import load_priors

    return lib(lambda: load_priors(p))


def _history(root: Path) -> Run:
    from tasks.evaluation import history

    return lib(lambda: history.read(root / "evals", "run"))


def _model_dir(root: Path, p: Path) -> Run:
    return cli("plan", str(root / "m"))


READERS = [
    Reader("job YAML", "job.yaml", JOB, "yaml", lambda root, p: cli("plan", str(p)),
           JOB.replace("0.001", ".nan"), JOB + "training: {}\n"),
    Reader("cluster YAML", "c.yaml", CLUSTER, "yaml", lambda root, p: cli("plan", TINY, "--cluster", str(p)),
           CLUSTER.replace("12.5", ".inf"), CLUSTER.replace("count: 8", "count: 8, count: 4")),
    Reader("suite YAML", "s.yaml", SUITE, "yaml", lambda root, p: cli("eval-plan", "--suite", str(p)),
           SUITE.replace("0.004", "-.inf"), SUITE.replace("shm: 1.0", "shm: 1.0, shm: 2.0")),
    Reader("meta YAML", "t/meta-x.yaml", META, "yaml", _meta_analyze, META.replace("dp_size: 2", "dp_size: .nan"),
           META + "pp_size: 4\n"),
    Reader("GPU catalog YAML", "cat.yaml", CATALOG, "yaml", lambda root, p: _catalog(p),
           CATALOG.replace("memory_gib: 40.0", "memory_gib: .nan"), CATALOG.replace("name: X1", "name: X1, name: X2")),
    Reader("trace CSV", "w.csv", TRACE, "csv", lambda root, p: cli("simulate", "--trace", str(p), "--policy", "fcfs"),
           TRACE.replace("3600.0", "inf")),
    Reader("JSONL dataset", "d.jsonl", JSONL, "jsonl", lambda root, p: _jsonl(p), JSONL.replace('"2"', "NaN")),
    Reader("corpus", "corpus.txt", "def f(x):\n    return x\n" * 50, "text",
           lambda root, p: cli("data", "prepare", str(p), "--out", str(root / "out"))),
    Reader("tokenizer", "tok.json", "{}", "json", lambda root, p: cli("tokenizer", "show", "--out", str(p)),
           '{"version": "1.0", "x": NaN}'),
    Reader("priors", "priors.json", PRIORS, "json", lambda root, p: _priors(p), PRIORS.replace("0.5", "NaN")),
    Reader("score history", "evals/run/history.jsonl", HISTORY, "jsonl", lambda root, p: _history(root),
           HISTORY.replace("2,", "Infinity,")),
    Reader("model config", "m/config.json", CONFIG, "json", _model_dir, CONFIG.replace("64", "Infinity")),
    Reader("ledger", "l.db", "", "db", lambda root, p: cli("cluster", "show", "--ledger", str(p))),
]


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _link(target: str) -> Callable[[Path], None]:
    return lambda p: p.symlink_to(target)


def _loop(p: Path) -> None:
    p.symlink_to(p.with_name(p.name + ".other"))
    p.with_name(p.name + ".other").symlink_to(p)


def _content(fn: Callable[[Reader], bytes]) -> Callable[[Reader], Callable[[Path], None]]:
    return lambda r: (lambda p: p.write_bytes(fn(r)))


def _bomb(r: Reader) -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return ("\n".join(lines) + "\n" + r.valid).encode()


_BIG = {"yaml": 5 << 20, "json": 65 << 20}

# kind -> (the formats it applies to, how to make the file from the reader, words the refusal must hold)
KINDS: dict[str, tuple[tuple[str, ...], Callable[[Reader], Callable[[Path], None]], tuple[str, ...]]] = {
    "a FIFO nobody writes": (("yaml", "csv", "jsonl", "json", "text", "db"), lambda r: _fifo, ("FIFO",)),
    "a character device": (("yaml", "csv", "jsonl", "json", "text", "db"), lambda r: _link("/dev/zero"),
                           ("character device",)),
    "a symlink loop": (("yaml", "csv", "jsonl", "json", "text", "db"), lambda r: _loop, ("symlink loop",)),
    "a dangling symlink": (("yaml", "csv", "jsonl", "json", "text"), lambda r: _link("/nonexistent/x"),
                           ("symlink to a missing file",)),
    "a duplicate key": (("yaml",), _content(lambda r: r.duplicate.encode()), ("duplicate key",)),
    "an alias bomb": (("yaml",), _content(_bomb), ("refused",)),
    "a non-finite number": (("yaml", "csv", "jsonl", "json"), _content(lambda r: r.non_finite.encode()),
                            ("finite",)),
    "bytes that are not text": (("yaml", "csv", "jsonl"), _content(lambda r: b"\xff\xfe\x00garbage\x9c" * 10),
                                ("UTF-8",)),
    "a file past its size limit": (("yaml", "json"), _content(lambda r: b" " * _BIG[r.fmt] + r.valid.encode()),
                                   ("past the size limit",)),
}


def _act(reader: Reader, make: Callable[[Path], None]) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        p = root / reader.file
        p.parent.mkdir(parents=True, exist_ok=True)
        make(p)
        return reader.act(root, p)
    return act


def _accepted(root: Path, run: Run) -> bool:
    return run.rc == 0 and not run.err.strip().startswith("frenzy")


def _cases() -> list[Case]:
    """Every reader with its valid content (the control: the reader still reads), then every kind that applies."""
    out = [Case(R, f"{r.name}: a valid file is read", _act(r, _content(lambda r: r.valid.encode())(r)), _accepted,
                timeout_s=60) for r in READERS if r.name not in ("tokenizer", "ledger")]  # no valid content here
    for kind, (formats, make, words) in KINDS.items():
        for r in READERS:
            if r.fmt in formats:
                out.append(Case(R, f"{r.name}: {kind}", _act(r, make(r)), words, timeout_s=60))
    return out


CASES = _cases()
