"""Token shards: the `.bin` format nanoGPT and llm.c write, corpus reading (text, jsonl, parquet; local or S3) and
`prepare`, which tokenizes a corpus into shards (what `frenzy data prepare` and the trainer's tokenization cache run).

A shard is llm.c's layout: a header of 256 little-endian int32 (magic, version, token count) then the tokens,
uint16 (magic 20240520, version 1: GPT-2 sized vocabularies) or uint32 (magic 20240801, version 7: Llama 3
sized). A file without the header is read as nanoGPT's raw uint16 tokens. Shards are memory-mapped; several of
them read as one sequence (`ShardedTokens`).
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.errors import FrenzyError
from tasks.userfiles import DuplicateKey, UserFileError, looks_binary, no_duplicate_keys, path_kind, regular_file

HEADER_INTS = 256
_FORMATS = {np.dtype(np.uint16): (20240520, 1), np.dtype(np.uint32): (20240801, 7)}
_BY_MAGIC = {(m, v): dt for dt, (m, v) in _FORMATS.items()}
TEXT_SUFFIXES = (".txt", ".md", ".py", ".text", ".rst", ".c", ".h", ".json")


class ShardError(FrenzyError, ValueError):
    """Token shards or a corpus that cannot be read; the message names the fix."""


def write_shard(path: Path, tokens: np.ndarray, dtype: np.dtype) -> None:
    """Write one shard atomically (llm.c header + tokens)."""
    dtype = np.dtype(dtype)
    if dtype not in _FORMATS:
        raise ShardError(f"shards hold uint16 or uint32 tokens, not {dtype}")
    if len(tokens) >= 2 ** 31:
        raise ShardError(f"a shard holds fewer than 2^31 tokens; got {len(tokens)}: use smaller --shard-tokens")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = _FORMATS[dtype]
    header[2] = len(tokens)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(header.tobytes())
        fh.write(np.ascontiguousarray(tokens, dtype=dtype.newbyteorder("<")).tobytes())
    os.replace(tmp, path)


def read_shard(path: Path) -> np.ndarray:
    """A shard's tokens, memory-mapped: llm.c's header (magic and version matched exactly, the token count equal to
    the file's), or nanoGPT's headerless uint16 when the first ints are no header at all."""
    size = path.stat().st_size
    if size == 0:
        return np.zeros(0, dtype=np.uint16)  # holds no tokens (`open_shards` names the files when none do)
    if size >= HEADER_INTS * 4:
        header = np.fromfile(path, dtype="<i4", count=3)
        magic, version, n = (int(x) for x in header)
        dtype = _BY_MAGIC.get((magic, version))
        if dtype is not None:
            if n < 0 or HEADER_INTS * 4 + n * dtype.itemsize != size:
                raise ShardError(f"{path}: the llm.c header says {n} {dtype} tokens ({HEADER_INTS * 4 + n * dtype.itemsize}"
                                 f" bytes with the header) but the file is {size} bytes: it is truncated or was "
                                 "appended to; write it again (`frenzy data prepare`)")
            if n == 0:
                return np.zeros(0, dtype=dtype)
            return np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", offset=HEADER_INTS * 4, shape=(n,))
        # an llm.c-like header we do not know: refuse rather than read its header and tokens as uint16 tokens
        looks_sized = n > 0 and size - HEADER_INTS * 4 in (2 * n, 4 * n)
        if 20_000_000 <= magic < 30_000_000 or looks_sized:
            raise ShardError(f"{path}: an llm.c-style header with magic {magic} version {version}, which is neither "
                             "uint16 (20240520, 1) nor uint32 (20240801, 7); rewrite the shard with `frenzy data "
                             "prepare` or llm.c's current writer")
    if size % 2:
        raise ShardError(f"{path} has no llm.c header and an odd size: not a token shard")
    return np.memmap(path, dtype="<u2", mode="r")  # nanoGPT: raw uint16


class ShardedTokens:
    """Several shards read as one sequence: `len`, slices (a lazy view) and `np.asarray` of a slice."""

    def __init__(self, parts: list[np.ndarray], start: int = 0, stop: int | None = None) -> None:
        self.parts = parts
        self.ends = np.cumsum([len(p) for p in parts])
        self.start, self.stop = start, int(self.ends[-1]) if stop is None else stop
        self.dtype = np.result_type(*[p.dtype for p in parts])

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key: slice) -> ShardedTokens:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ShardedTokens takes contiguous slices")
        a, b, _ = key.indices(len(self))
        return ShardedTokens(self.parts, self.start + a, self.start + max(a, b))

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        out = np.empty(len(self), dtype=self.dtype)
        pos, i = self.start, int(np.searchsorted(self.ends, self.start, side="right"))
        k = 0
        while pos < self.stop:
            begin = int(self.ends[i - 1]) if i else 0
            take = min(self.stop, int(self.ends[i])) - pos
            out[k:k + take] = self.parts[i][pos - begin:pos - begin + take]
            pos, k, i = pos + take, k + take, i + 1
        return out.astype(dtype) if dtype is not None else out


def open_shards(paths: list[Path]) -> np.ndarray | ShardedTokens:
    parts = [p for p in (read_shard(q) for q in paths) if len(p)]
    if not parts:
        raise ShardError(f"the shards {', '.join(map(str, paths[:3]))} hold no tokens")
    return parts[0] if len(parts) == 1 else ShardedTokens(parts)


# ------------------------------------------------------------------------------------------------ corpus files

def _fs(url: str):  # noqa: ANN202 - an fsspec filesystem
    import fsspec

    return fsspec.core.url_to_fs(url)


def list_files(path: str, suffixes: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """(url, state) of every file `path` names: a file, a directory (recursive), or a glob; local or `s3://`.
    `state` (size and modification time or ETag) keys the tokenization cache."""
    fs, root = _fs(path)
    proto = path.split("://", 1)[0] + "://" if "://" in path else ""
    local = proto in ("", "file://")
    if local and not any(c in root for c in "*?["):
        try:  # a symlink loop or a FIFO is named as such (fsspec calls a loop missing, and a FIFO would block)
            path_kind(root, "corpus file")
        except UserFileError as err:
            raise ShardError(str(err)) from None
    if any(c in root for c in "*?["):
        names = sorted(fs.glob(root))
        if not names:
            raise ShardError(f"data.path {path}: the pattern matches no file; check the directory and the pattern")
    elif fs.isdir(root):
        names = sorted(n for n in fs.find(root) if not fs.isdir(n))
    elif fs.exists(root):
        names = [root]
    else:
        raise ShardError(f"data.path {path} does not exist")
    if suffixes:
        names = [n for n in names if n.endswith(suffixes)] or names
    out = []
    for n in names:
        if local:
            try:
                regular_file(n, "corpus file")
            except UserFileError as err:
                raise ShardError(f"{err} (in data path {path})") from None
            # ctime and inode too: `cp -p` and `rsync -t` restore size and mtime, never ctime
            st = os.stat(n)
            state = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
        else:
            info = fs.info(n)
            state = f"{info.get('size')}:{info.get('ETag') or info.get('mtime') or info.get('LastModified')}"
        out.append((proto + n if proto and not n.startswith(proto) else n, state))
    if not out:
        raise ShardError(f"data.path {path} names no files")
    return out


def _text_value(url: str, n: int, value: object, text_field: str, unit: str) -> str | None:
    """A row's text: a string, None for a null (no document), else refused naming the row."""
    if value is None or isinstance(value, str):
        return value
    raise ShardError(f"{url}: {unit} {n}: {text_field!r} is a {type(value).__name__}, not a string; fix the data or "
                     "set --text-field / data.text_field to the text column")


def _jsonl(url: str, text_field: str) -> Iterator[str]:
    import fsspec

    with fsspec.open(url, "rb", compression="infer") as fh:
        try:
            # bytes, decoded line by line, so an encoding error names its line
            for n, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ShardError(f"{url}: line {n} is not UTF-8 ({err.reason} at column {err.start}); re-encode "
                                     "the file as UTF-8") from None
                if not line.strip():
                    continue
                try:  # lenient about NaN in other fields (a NaN score beside the text is common in corpora)
                    row = json.loads(line, object_pairs_hook=no_duplicate_keys)
                except json.JSONDecodeError as err:
                    raise ShardError(f"{url}:{n}: not JSON ({err}); fix the line or remove it") from None
                except DuplicateKey as err:  # which one is the document? refused, never guessed
                    raise ShardError(f"{url}:{n}: {err} in one object; keep one of them") from None
                except RecursionError:
                    raise ShardError(f"{url}:{n}: JSON nested too deeply to be a document; fix the line or remove "
                                     "it") from None
                if not isinstance(row, dict):
                    raise ShardError(f"{url}:{n}: a JSON {type(row).__name__}, not an object with a {text_field!r} "
                                     "field; each jsonl line must be one object")
                if text_field not in row:
                    raise ShardError(f"{url}:{n}: no {text_field!r} field (fields: {', '.join(row)}); "
                                     "set data.text_field")
                text = _text_value(url, n, row[text_field], text_field, "line")
                if text is not None:
                    yield text
        except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
            raise ShardError(f"{url}: cannot be read ({err}); a .gz file must be complete gzip") from None


def _parquet(url: str, text_field: str) -> Iterator[str]:
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as fh:
        try:
            pf = pq.ParquetFile(fh)
        except (pa.ArrowException, OSError) as err:
            raise ShardError(f"{url} is not a parquet file ({err}); give --format for its real format") from None
        schema = pf.schema_arrow
        if text_field not in schema.names:
            raise ShardError(f"{url}: no {text_field!r} column (columns: {', '.join(schema.names)}); "
                             "set data.text_field")
        kind = schema.field(text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ShardError(f"{url}: column {text_field!r} is {kind}, not a string column; set data.text_field "
                             "to the text column")
        row = 0
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            for x in batch.column(0).to_pylist():
                row += 1
                if _text_value(url, row, x, text_field, "row") is not None:
                    yield x


def iter_documents(source: str, urls: list[str], text_field: str = "text") -> Iterator[str]:
    """The documents of a corpus: each text file is one, each jsonl row's `text_field`, each parquet row's (a
    null is no document; any other non-string is refused with its row). `.gz` files are decompressed."""
    import fsspec

    for url in urls:
        if source == "text":
            with fsspec.open(url, "rb", compression="infer") as fh:
                try:
                    data = fh.read()
                except (OSError, EOFError) as err:
                    raise ShardError(f"{url}: cannot be read ({err}); a .gz file must be complete gzip") from None
            if looks_binary(data[:1 << 16]):
                raise ShardError(f"{url} looks binary (NUL or control bytes), not text; give text files, or --format "
                                 "for a jsonl or parquet corpus")
            yield data.decode("utf-8", errors="replace")
        elif source == "jsonl":
            yield from _jsonl(url, text_field)
        elif source == "parquet":
            yield from _parquet(url, text_field)
        else:
            raise ShardError(f"unknown corpus kind {source!r}")


def guess_source(urls: list[str]) -> str:
    if all(fnmatch.fnmatch(u, "*.jsonl") or u.endswith(".jsonl.gz") for u in urls):
        return "jsonl"
    if all(u.endswith(".parquet") for u in urls):
        return "parquet"
    return "text"


@dataclass
class Prepared:
    """What `prepare` wrote."""

    out_dir: str
    shards: list[str]
    tokens: int
    documents: int
    bytes: int
    seconds: float
    dtype: str

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def prepare(documents: Iterator[str], tokenizer: object, out_dir: Path, shard_tokens: int = 100_000_000,
            progress: Callable[[int, int], None] | None = None, batch_docs: int = 256,
            source: str = "the corpus") -> Prepared:
    """Tokenize `documents` (end-of-text between them, or a newline for tokenizers without one) into shards
    `out_dir/shard_NNNNNN.bin` of at most `shard_tokens` tokens; `progress(documents, tokens)` after each batch;
    `source` names the input in errors."""
    from tasks.training.tokenizer import token_dtype

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)  # type: ignore[attr-defined]
    dtype = np.dtype(np.uint16) if dtype == np.uint8 else dtype
    sep = np.asarray([tokenizer.eos_id] if tokenizer.eos_id is not None  # type: ignore[attr-defined]
                     else tokenizer.encode("\n"), dtype=dtype)  # type: ignore[attr-defined]
    buf = np.empty(shard_tokens, dtype=dtype)
    fill, total, docs, nbytes, shards = 0, 0, 0, 0, []

    def flush() -> None:
        nonlocal fill
        if fill:
            path = out_dir / f"shard_{len(shards):06d}.bin"
            write_shard(path, buf[:fill], dtype)
            shards.append(str(path))
            fill = 0

    def put(arr: np.ndarray) -> None:
        nonlocal fill
        pos = 0
        while pos < len(arr):
            take = min(len(arr) - pos, shard_tokens - fill)
            buf[fill:fill + take] = arr[pos:pos + take]
            fill, pos = fill + take, pos + take
            if fill == shard_tokens:
                flush()

    batch: list[str] = []

    def run_batch() -> None:
        nonlocal total, docs, nbytes
        for ids in tokenizer.encode_batch(batch):  # type: ignore[attr-defined]
            put(np.asarray(ids, dtype=dtype))
            put(sep)
            total += len(ids) + len(sep)
        docs += len(batch)
        nbytes += sum(len(d.encode("utf-8")) for d in batch)
        batch.clear()
        if progress:
            progress(docs, total)

    for doc in (d for d in documents if d):  # an empty file or row is no document: it adds no end-of-text token
        batch.append(doc)
        if len(batch) >= batch_docs:
            run_batch()
    if batch:
        run_batch()
    flush()
    if not shards:
        raise ShardError(f"{source}: no text to tokenize (every file or row is empty); give files with text")
    return Prepared(out_dir=str(out_dir), shards=shards, tokens=total, documents=docs, bytes=nbytes,
                    seconds=time.perf_counter() - t0, dtype=str(dtype))
