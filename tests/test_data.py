"""Tokenizers, token shards and corpus sources (text, jsonl, parquet; local and S3 on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.jobspec import DataSpec
from tasks.training import data as D
from tasks.training import shards as S
from tasks.training.tokenizer import ByteTokenizer, TokenizerError, load_tokenizer, train_bpe

REPO = Path(__file__).resolve().parents[1]
SHIPPED_TEXT = [str(REPO / "README.md"), str(REPO / "tasks" / "training")]  # text the project ships


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    res = train_bpe(SHIPPED_TEXT, out, vocab_size=1000)
    assert res.vocab_size == 1000 and Path(res.path) == out / "tokenizer.json"
    return out / "tokenizer.json"


def test_trained_bpe_roundtrips_text_and_compresses_it(bpe):
    tok = load_tokenizer(str(bpe))
    text = (REPO / "tasks" / "training" / "loop.py").read_text()[:4000] + " héllo ✓ 日本"
    ids = tok.encode(text)
    assert tok.decode(ids) == text  # byte-level: every string survives, unseen characters too
    assert len(ids) < len(text.encode()) / 2  # merges learned from the shipped code
    assert tok.eos_id == tok.tok.token_to_id("<|endoftext|>") and tok.vocab_size == 1000
    assert load_tokenizer(str(bpe.parent)).sha256 == tok.sha256  # a directory holding tokenizer.json


def test_bad_tokenizers_are_named():
    with pytest.raises(TokenizerError, match="neither `byte` nor"):
        load_tokenizer("/no/such/tokenizer.json")
    with pytest.raises(TokenizerError, match="needs > 256"):
        train_bpe(SHIPPED_TEXT, "/tmp/x", vocab_size=100)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_shard_has_the_llmc_header_and_reads_back(tmp_path, dtype):
    toks = np.arange(1000, dtype=np.int64) * (70 if dtype == np.uint32 else 3)
    S.write_shard(tmp_path / "s.bin", toks, np.dtype(dtype))
    header = np.fromfile(tmp_path / "s.bin", dtype="<i4", count=3)
    assert tuple(header) == ((20240520, 1, 1000) if dtype == np.uint16 else (20240801, 7, 1000))
    assert np.array_equal(S.read_shard(tmp_path / "s.bin"), toks)


def test_headerless_nanogpt_bin_reads_as_uint16_and_truncation_is_caught(tmp_path):
    raw = np.arange(3000, dtype=np.uint16)
    raw.tofile(tmp_path / "train.bin")  # nanoGPT's prepare.py writes exactly this
    assert np.array_equal(S.read_shard(tmp_path / "train.bin"), raw)
    S.write_shard(tmp_path / "cut.bin", np.arange(5000), np.dtype(np.uint16))
    with open(tmp_path / "cut.bin", "r+b") as fh:
        fh.truncate(1024 + 100)
    with pytest.raises(S.ShardError, match="truncated"):
        S.read_shard(tmp_path / "cut.bin")


def test_several_shards_read_as_one_sequence(tmp_path):
    parts = [np.arange(a, b) for a, b in ((0, 700), (700, 1000), (1000, 2500))]
    for i, p in enumerate(parts):
        S.write_shard(tmp_path / f"shard_{i:06d}.bin", p, np.dtype(np.uint16))
    seq = S.open_shards(sorted(tmp_path.glob("*.bin")))
    full = np.arange(2500)
    assert len(seq) == 2500
    for a, b in ((0, 10), (690, 710), (650, 1200), (999, 1001), (2490, 2500)):
        assert np.array_equal(np.asarray(seq[a:b]), full[a:b])
    train, held = D.split(seq)
    assert np.array_equal(np.asarray(held[3:9]), full[len(train) + 3:len(train) + 9])
    assert D.fingerprint(seq) == D.fingerprint(full.astype(np.uint16))
    loader = D.BatchLoader(seq, 16, 4, seed=1)
    x, y = loader.batch(loader.next_indices(D.Cursor()))
    assert x.shape == (4, 16) and np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())
    assert all(np.array_equal(r.numpy(), np.arange(int(r[0]), int(r[0]) + 16)) for r in x)  # windows span shards


def _write_corpora(d: Path) -> list[str]:
    docs = [f"document {i}: " + "the quick brown fox " * (i % 7 + 1) for i in range(300)]
    (d / "c.jsonl").write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(docs)) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": docs}), d / "c.parquet")
    return docs


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_prepare_tokenizes_rows_with_end_of_text_between_them(tmp_path, bpe, fmt):
    docs = _write_corpora(tmp_path)
    tok = load_tokenizer(str(bpe))
    urls = [u for u, _ in S.list_files(str(tmp_path / f"c.{fmt}"))]
    res = S.prepare(S.iter_documents(fmt, urls, "body"), tok, tmp_path / fmt, shard_tokens=2000)
    assert res.documents == 300 and len(res.shards) > 1
    toks = np.asarray(S.open_shards([Path(p) for p in res.shards]))
    assert len(toks) == res.tokens and int((toks == tok.eos_id).sum()) == 300
    first = toks[: int(np.flatnonzero(toks == tok.eos_id)[0])]
    assert tok.decode(first) == docs[0]
    with pytest.raises(S.ShardError, match="no 'text' field"):
        list(S.iter_documents("jsonl", [str(tmp_path / "c.jsonl")], "text"))


def test_training_corpus_under_a_bpe_tokenizer_is_tokenized_once_and_cached(tmp_path, bpe, monkeypatch):
    monkeypatch.setenv("FRENZY_CACHE", str(tmp_path / "cache"))
    _write_corpora(tmp_path)
    spec = DataSpec(source="jsonl", path=str(tmp_path / "c.jsonl"), text_field="body", tokenizer=str(bpe))
    tok = D.resolve_tokenizer(spec)
    a = D.load_corpus(spec, tok)
    cached = list((tmp_path / "cache" / "corpus").glob("tok-*/shard_*.bin"))
    mtime = cached[0].stat().st_mtime_ns
    b = D.load_corpus(spec, tok)
    assert np.array_equal(np.asarray(a), np.asarray(b)) and cached[0].stat().st_mtime_ns == mtime
    with pytest.raises(D.DataError, match="model's vocab is 256"):
        D.check_vocab(a, 256, "the corpus")
    held = D.held_out_text(spec, tok)
    assert b"quick brown fox" in held.tobytes()


def test_byte_tokenizer_keeps_the_builtin_corpus_as_bytes():
    spec = DataSpec()
    toks = D.load_corpus(spec, ByteTokenizer())
    assert toks.dtype == np.uint8 and len(toks) > 1 << 20


def test_token_source_needs_a_path_and_missing_paths_are_named(tmp_path):
    with pytest.raises(D.DataError, match="data.path is not set"):
        D.load_corpus(DataSpec(source="tokens"))
    with pytest.raises(D.DataError, match="does not exist"):
        D.load_corpus(DataSpec(source="tokens", path=str(tmp_path / "nope")))


def test_frenzy_data_prepare_cli(tmp_path, bpe):
    _write_corpora(tmp_path)
    r = subprocess.run([sys.executable, "-m", "cli", "data", "prepare", str(tmp_path / "c.jsonl"), "--tokenizer",
                        str(bpe), "--text-field", "body", "--out", str(tmp_path / "out"), "--json"],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["documents"] == 300 and doc["format"] == "jsonl" and (tmp_path / "out" / "prepared.json").exists()
    again = subprocess.run([sys.executable, "-m", "cli", "data", "prepare", str(tmp_path / "c.jsonl"),
                            "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 2 and "--overwrite" in again.stderr


moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3_bucket():
    from tests.s3_endpoint import free_port

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("corpus")
    yield fs
    for k, v in old.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def test_corpus_and_shards_on_s3(tmp_path, bpe, s3_bucket, monkeypatch):
    monkeypatch.setenv("FRENZY_CACHE", str(tmp_path / "cache"))
    docs = _write_corpora(tmp_path)
    s3_bucket.put(str(tmp_path / "c.parquet"), "corpus/text/c.parquet")
    spec = DataSpec(source="parquet", path="s3://corpus/text/", text_field="body", tokenizer=str(bpe))
    tok = D.resolve_tokenizer(spec)
    toks = np.asarray(D.load_corpus(spec, tok))
    assert tok.decode(toks[: int(np.flatnonzero(toks == tok.eos_id)[0])]) == docs[0]
    S.write_shard(tmp_path / "shard_000000.bin", toks, np.dtype(np.uint16))
    s3_bucket.put(str(tmp_path / "shard_000000.bin"), "corpus/shards/shard_000000.bin")
    remote = D.load_corpus(DataSpec(source="tokens", path="s3://corpus/shards"))
    assert np.array_equal(np.asarray(remote), toks)
