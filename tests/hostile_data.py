"""Hostile corpora and token shards (issue 32's third row): `frenzy data prepare` on broken jsonl/parquet/gzip, and
the trainer's reader (`load_corpus`, `check_vocab`) on shards that lie about themselves."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.hostile_kit import Case, Run, bpe_json, cli, lib

S = "data"


def _prepare(name: str, content: bytes | str, *extra: str) -> Callable[[Path], Run]:
    def act(root: Path) -> Run:
        f = root / name
        f.write_bytes(content.encode() if isinstance(content, str) else content)
        return cli("data", "prepare", str(f), "--out", str(root / "out"), *extra)
    return act


def _rows(*rows: object) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _docs(*texts: str) -> Callable[[Path, Run], bool]:
    """The prepared shards decode to exactly `texts`, each followed by the byte tokenizer's newline."""
    def check(root: Path, run: Run) -> bool:
        from tasks.jobspec import DataSpec
        from tasks.training.data import load_corpus

        toks = np.asarray(load_corpus(DataSpec(source="tokens", path=str(root / "out"))))
        return bytes(toks.astype(np.uint8)).decode() == "".join(t + "\n" for t in texts)
    return check


def _corpus(make: Callable[[Path], str], vocab: int | None = None) -> Callable[[Path], Run]:
    """`make` lays out shards under root and returns data.path; the trainer's reader loads it (and checks the
    vocab when given)."""
    def act(root: Path) -> Run:
        from tasks.jobspec import DataSpec
        from tasks.training.data import check_vocab, load_corpus

        path = make(root)

        def go() -> object:
            toks = load_corpus(DataSpec(source="tokens", path=path))
            if vocab:
                check_vocab(toks, vocab, path)
            return toks
        return lib(go)
    return act


def _shard(magic: int, version: int, count: int, tokens: np.ndarray) -> bytes:
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, count
    return header.tobytes() + tokens.tobytes()


def _one_file(data: bytes, name: str = "a.bin") -> Callable[[Path], str]:
    def make(root: Path) -> str:
        (root / name).write_bytes(data)
        return str(root / name)
    return make


def _prepared_then(change: Callable[[Path], None]) -> Callable[[Path], str]:
    """A real `frenzy data prepare` output (3 shards), then `change` applied to it."""
    def make(root: Path) -> str:
        (root / "c.txt").write_text("x" * 5000)
        r = cli("data", "prepare", str(root / "c.txt"), "--out", str(root / "out"), "--shard-tokens", "2000")
        assert r.rc == 0, r.err
        change(root / "out")
        return str(root / "out")
    return make


def _tokens_equal(n: int) -> Callable[[Path, Run], bool]:
    return lambda root, run: len(run.value) == n and int(np.asarray(run.value)[-1]) == (n - 1) % 251  # type: ignore[arg-type]


def _restamped(root: Path) -> Run:
    """The tokenization cache after a file is rewritten with the same size and mtime (`cp -p`, `rsync -t`)."""

    old = os.environ.get("FRENZY_CACHE")
    os.environ["FRENZY_CACHE"] = str(root / "cache")
    try:
        return _restamped_in(root)
    finally:
        if old is None:
            os.environ.pop("FRENZY_CACHE", None)
        else:
            os.environ["FRENZY_CACHE"] = old


def _restamped_in(root: Path) -> Run:
    from tasks.jobspec import DataSpec
    from tasks.training.data import load_corpus
    from tasks.training.tokenizer import load_tokenizer

    tok = load_tokenizer(str(bpe_json(root / "tok.json")))
    f = root / "c.jsonl"
    f.write_text(_rows({"text": "aaaa bbbb"}))
    spec = DataSpec(source="jsonl", path=str(f))
    first = tok.decode(np.asarray(load_corpus(spec, tok)))
    st = f.stat()
    f.write_text(_rows({"text": "cccc dddd"}))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = tok.decode(np.asarray(load_corpus(spec, tok)))
    return Run(0, out=json.dumps([first, second]), value=(first, second))


_N = 10_000
_U32 = (np.arange(_N) % 251).astype("<u4")
_U16 = (np.arange(_N) % 251).astype("<u2")
J = "c.jsonl"

CASES = [
    Case(S, "jsonl prepares exactly its text", _prepare(J, _rows({"text": "héllo"}, {"text": "wörld"})),
         _docs("héllo", "wörld")),
    Case(S, "jsonl row is a list", _prepare(J, _rows({"text": "a"}, [1, 2])), (J, ":2", "not an object")),
    Case(S, "jsonl row is a number", _prepare(J, _rows(5)), (J, ":1", "not an object")),
    Case(S, "jsonl text null is no document", _prepare(J, _rows({"text": "a"}, {"text": None}, {"text": "b"})),
         _docs("a", "b")),
    Case(S, "jsonl text an object", _prepare(J, _rows({"text": "a"}, {"text": {"a": 1}})),
         (J, "line 2", "dict, not a string", "text-field")),
    Case(S, "jsonl text a number", _prepare(J, _rows({"text": 5})), ("line 1", "int, not a string")),
    Case(S, "jsonl text a list", _prepare(J, _rows({"text": ["a"]})), ("line 1", "list, not a string")),
    Case(S, "jsonl not UTF-8", _prepare(J, b'{"text": "a"}\n{"text": "\xff"}\n'), (J, "line 2", "UTF-8")),
    Case(S, "jsonl line not JSON", _prepare(J, '{"text": "a"}\n{oops\n'), (J, ":2", "not JSON")),
    Case(S, "jsonl field missing", _prepare(J, _rows({"body": "a"})), (J, "'text'", "text_field")),
    Case(S, "jsonl.gz is decompressed", _prepare("c.jsonl.gz", gzip.compress(_rows({"text": "zipped"}).encode())),
         _docs("zipped")),
    Case(S, "jsonl.gz corrupt", _prepare("c.jsonl.gz", b"\x1f\x8b\x08\x00garbage"), ("c.jsonl.gz", "gzip")),
    Case(S, "txt.gz is decompressed", _prepare("c.txt.gz", gzip.compress(b"plain text")), _docs("plain text")),
    Case(S, "fake parquet", _prepare("c.parquet", b"PAR1 this is not parquet"), ("c.parquet", "not a parquet")),
    Case(S, "parquet binary column", lambda r: _parquet(r, [b"\xff\x00"]), ("c.parquet", "binary", "text_field")),
    Case(S, "parquet int column", lambda r: _parquet(r, [1, 2]), ("c.parquet", "int64", "not a string column")),
    Case(S, "parquet nulls are no document", lambda r: _parquet(r, ["a", None, "b"]), _docs("a", "b")),
    Case(S, "parquet column missing", lambda r: _parquet(r, ["a"], "--text-field", "body"), ("'body'", "column")),
    Case(S, "shard count -5", _prepare("c.txt", "text", "--shard-tokens", "-5"), ("--shard-tokens",)),
    Case(S, "input does not exist", lambda r: cli("data", "prepare", str(r / "nope"), "--out", str(r / "o")),
         ("nope", "does not exist")),
    Case(S, "a tokenizer that is not one", _prepare("c.txt", "text", "--tokenizer", "/nonexistent/tok.json"),
         ("tokenizer", "neither")),
    Case(S, "cache sees a file rewritten with the same size and mtime", _restamped,
         lambda root, run: run.value == ("aaaa bbbb<|endoftext|>", "cccc dddd<|endoftext|>")),  # type: ignore[comparison-overlap]
    # the trainer's reader
    Case(S, "valid uint32 llm.c shard", _corpus(_one_file(_shard(20240801, 7, _N, _U32))), _tokens_equal(_N)),
    Case(S, "valid uint16 llm.c shard", _corpus(_one_file(_shard(20240520, 1, _N, _U16))), _tokens_equal(_N)),
    Case(S, "valid headerless nanoGPT shard", _corpus(_one_file(_U16.tobytes())), _tokens_equal(_N)),
    Case(S, "uint32 shard with a neighbouring magic", _corpus(_one_file(_shard(20240802, 7, _N, _U32))),
         ("a.bin", "magic 20240802", "rewrite")),
    Case(S, "known magic, unknown version", _corpus(_one_file(_shard(20240801, 8, _N, _U32))),
         ("a.bin", "version 8")),
    Case(S, "header count below the file's tokens", _corpus(_one_file(_shard(20240801, 7, _N // 2, _U32))),
         ("a.bin", f"{_N // 2}", "appended")),
    Case(S, "header count above the file's tokens", _corpus(_one_file(_shard(20240801, 7, _N * 2, _U32))),
         ("a.bin", "truncated")),
    Case(S, "negative header count", _corpus(_one_file(_shard(20240520, 1, -3, _U16))), ("a.bin", "-3")),
    Case(S, "headerless odd size", _corpus(_one_file(b"abc")), ("a.bin", "odd size")),
    Case(S, "empty shard file", _corpus(_one_file(b"")), ("a.bin", "no tokens")),
    Case(S, "tokens directory without .bin files", _corpus(
        lambda r: [(r / "d").mkdir(), (r / "d" / "notes.txt").write_text("hello world!")] and str(r / "d")),
        ("notes.txt", ".bin")),
    Case(S, "a glob of two shards reads both", _corpus(lambda r: [
        (r / "d").mkdir(), (r / "d" / "a.bin").write_bytes(_U16.tobytes()),
        (r / "d" / "b.bin").write_bytes(_U16.tobytes())] and str(r / "d") + "/*"),
        lambda root, run: len(run.value) == 2 * _N),  # type: ignore[arg-type]
    Case(S, "a glob matching a stray text file reads the shard only", _corpus(lambda r: [
        (r / "d").mkdir(), (r / "d" / "a.bin").write_bytes(_U16.tobytes()),
        (r / "d" / "notes.txt").write_text("hello world!")] and str(r / "d") + "/*"), _tokens_equal(_N)),
    Case(S, "ids past the vocab after 4M tokens", _corpus(_one_file(_shard(
        20240520, 1, 5_000_000, np.concatenate([np.zeros(5_000_000 - 1, "<u2"), np.array([299], "<u2")]))), 256),
        ("299", "vocab is 256", "model.vocab")),
    Case(S, "prepared directory without its marker (killed prepare)", _corpus(_prepared_then(
        lambda d: (d / "prepared.json").unlink())), ("prepared.json", "did not finish", "--overwrite")),
    Case(S, "prepared directory with a shard not in its marker", _corpus(_prepared_then(
        lambda d: (d / "shard_000007.bin").write_bytes(_U16.tobytes()))), ("shard_000007.bin", "differ")),
    Case(S, "prepared directory missing a shard", _corpus(_prepared_then(
        lambda d: (d / "shard_000001.bin").unlink())), ("shard_000001.bin", "missing")),
    Case(S, "prepared marker not JSON", _corpus(_prepared_then(
        lambda d: (d / "prepared.json").write_text("{"))), ("prepared.json", "unreadable", "--overwrite")),
    Case(S, "prepared directory reads whole", _corpus(_prepared_then(lambda d: None)),
         lambda root, run: len(run.value) == 5001),  # type: ignore[arg-type]
]


def _parquet(root: Path, values: list, *extra: str) -> Run:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": values}), root / "c.parquet")
    return cli("data", "prepare", str(root / "c.parquet"), "--out", str(root / "out"), *extra)
