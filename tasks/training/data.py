"""Training data: a byte-level tokenizer, the offline corpus Frenzy builds, and a loader whose cursor is state.

The loader is a pure function of (corpus, seed, cursor): the batch of a step depends only on how many
samples were consumed before it and on the skipped ranges, so saving the cursor in a checkpoint and
restoring it replays exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tasks.errors import FrenzyError
from tasks.jobspec import DataSpec
from tasks.training import shards as S
from tasks.training.prepared import check_prepared
from tasks.training.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from tasks.userfiles import UserFileError, path_kind

#: Stdlib packages whose source text makes the built-in corpus (code and English docstrings, all offline).
_CORPUS_PACKAGES = ("json", "email", "http", "logging", "unittest", "asyncio", "xml", "importlib",
                    "concurrent", "urllib", "collections", "sqlite3", "html", "wsgiref", "zoneinfo")
_CORPUS_MAX_BYTES = 16 << 20
HELDOUT_FRACTION = 0.05


class DataError(FrenzyError, ValueError):
    """Training data that cannot be used; the message names the fix."""


def encode(text: str) -> np.ndarray:
    """Byte-level tokenizer: UTF-8 bytes are the tokens (vocab 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def decode(tokens: np.ndarray | list[int]) -> str:
    return bytes(np.asarray(tokens, dtype=np.uint8)).decode("utf-8", errors="replace")


def cache_dir() -> Path:
    """Frenzy's cache (tokenized corpora, tokenizers, evaluation priors): $FRENZY_CACHE, else ~/.cache/frenzy."""
    return Path(os.environ.get("FRENZY_CACHE") or Path.home() / ".cache" / "frenzy").expanduser()


def check_cache(sub: str = "corpus") -> Path:
    """`cache_dir()/sub` if it can be written (nothing is created), else an error that names where the cache's place
    comes from ($FRENZY_CACHE, or HOME) and how to move it: what `frenzy submit` checks before placement and what
    the trainer meets."""
    from tasks.outdir import check_writable

    d = cache_dir() / sub
    try:
        return check_writable(d, "the cache directory")
    except FrenzyError as err:
        src = (f"FRENZY_CACHE={os.environ['FRENZY_CACHE']}" if os.environ.get("FRENZY_CACHE")
               else f"HOME={os.environ.get('HOME', Path.home())} (the cache is $HOME/.cache/frenzy)")
        raise type(err)(f"{err}. Frenzy's cache (tokenized corpora, tokenizers, evaluation priors) comes from {src}; "
                        "set FRENZY_CACHE to a directory you may write (e.g. FRENZY_CACHE=/tmp/$USER-frenzy), "
                        "or fix HOME") from None


def cache_subdir(sub: str) -> Path:
    """`cache_dir()/sub`, made (checked first, so that an unusable cache names HOME / FRENZY_CACHE)."""
    d = check_cache(sub)
    d.mkdir(parents=True, exist_ok=True)
    return d


def build_builtin_corpus(dest: Path | None = None) -> Path:
    """Concatenate the source of a fixed list of stdlib packages into one byte file (built once, cached)."""
    ver = f"py{sys.version_info.major}{sys.version_info.minor}"
    dest = dest or cache_subdir("corpus") / f"builtin-{ver}.bin"
    if dest.exists():
        return dest
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[bytes] = []
    total = 0
    for pkg in _CORPUS_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            if "test" in f.parts[len(root.parts):-1]:
                continue
            data = f.read_bytes()
            parts.append(data)
            total += len(data)
            if total >= _CORPUS_MAX_BYTES:
                break
    if total < 1 << 20:
        raise DataError(f"the Python stdlib at {root} has only {total} bytes of source; use data.source: text")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(b"\n".join(parts)[:_CORPUS_MAX_BYTES])
    os.replace(tmp, dest)
    return dest


def resolve_tokenizer(spec: DataSpec, model_hf: str | None = None) -> Tokenizer:
    """The tokenizer a job trains with: `data.tokenizer`, else the Hugging Face model directory's, else bytes."""
    if spec.tokenizer:
        return load_tokenizer(spec.tokenizer)
    if model_hf and (Path(model_hf).expanduser() / "tokenizer.json").is_file():
        return load_tokenizer(model_hf)
    return ByteTokenizer()


def _text_corpus_bytes(spec: DataSpec) -> Path:
    """The byte-level path of a local `text` source (as before shards existed): one cached file per directory."""
    if not spec.path:
        raise DataError("data.source is 'text' but data.path is not set; give a UTF-8 file or directory")
    p = Path(spec.path).expanduser()
    pattern = any(c in str(p) for c in "*?[")
    try:
        kind = "dir" if pattern else path_kind(p, "corpus file")  # a glob's files are cached as a directory's
        files = [Path(u.removeprefix("file://")) for u, _ in S.list_files(str(p))] if kind == "dir" else [p]
    except (UserFileError, S.ShardError) as err:
        raise DataError(f"data.path: {err}") from None
    if pattern and not files:
        raise DataError(f"data.path {p}: the pattern matches no file; check the directory and the pattern")
    if kind == "missing":
        raise DataError(f"data.path {p} does not exist")
    if not any(q.stat().st_size for q in files):
        raise DataError(f"data.path {p} holds no text (every file is empty); give UTF-8 text files")
    if kind == "dir":
        # cached per directory state (names, sizes, mtimes): rebuilt only when a file changed
        key = "\n".join(f"{q}:{q.stat().st_size}:{q.stat().st_mtime_ns}" for q in files)
        path = cache_subdir("corpus") / f"text-{hashlib.sha256(key.encode()).hexdigest()[:16]}.bin"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(b"\n".join(q.read_bytes() for q in files))
            os.replace(tmp, path)
        return path
    return p


def _local_shards(spec: DataSpec) -> list[Path]:
    """The shard files `data.path` names; S3 shards are copied to the cache once (keyed by their ETag)."""
    import fsspec

    files = S.list_files(spec.path or "", (".bin",))
    single = len(files) == 1 and files[0][0].rstrip("/").endswith((spec.path or "").removeprefix("file://").rstrip("/"))
    if not single and not all(u.endswith(".bin") for u, _ in files):
        odd = [u for u, _ in files if not u.endswith(".bin")]
        raise DataError(f"data.path {spec.path} names files that are not token shards ({', '.join(odd[:3])}); "
                        "shards end in .bin: point data.path at them (a glob such as DIR/*.bin), or run "
                        "`frenzy data prepare` on the text")
    local = Path((spec.path or "").removeprefix("file://")).expanduser()
    if "://" not in (spec.path or "").removeprefix("file://") and local.is_dir():
        check_prepared(local.absolute(), [Path(u).absolute() for u, _ in files])
    out = []
    for url, state in files:
        if "://" not in url or url.startswith("file://"):
            out.append(Path(url.removeprefix("file://")))
            continue
        dest = cache_dir() / "shards" / hashlib.sha256(f"{url}:{state}".encode()).hexdigest()[:16] / Path(url).name
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
            with fsspec.open(url, "rb") as src, tmp.open("wb") as dst:
                while chunk := src.read(16 << 20):
                    dst.write(chunk)
            os.replace(tmp, dest)
        out.append(dest)
    return out


def _tokenized_cache(spec: DataSpec, tok: Tokenizer) -> list[Path]:
    """Shards of a text/jsonl/parquet (or builtin) corpus under a non-byte tokenizer, tokenized once into the cache
    (keyed by the files' state, the source kind, the text field and the tokenizer's sha256)."""
    if spec.source == "builtin":
        urls = [(str(build_builtin_corpus()), "builtin")]
        kind = "text"
    else:
        if not spec.path:
            raise DataError(f"data.source is {spec.source!r} but data.path is not set")
        urls = S.list_files(spec.path, {"jsonl": (".jsonl",), "parquet": (".parquet",)}.get(spec.source))
        kind = spec.source
    key = hashlib.sha256(json.dumps([urls, kind, spec.text_field, tok.sha256]).encode()).hexdigest()[:16]
    out = cache_subdir("corpus") / f"tok-{key}"
    if not (out / "done.json").exists():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        res = S.prepare(S.iter_documents(kind, [u for u, _ in urls], spec.text_field), tok, tmp,
                        source=f"data.path {spec.path}")
        (tmp / "done.json").write_text(json.dumps({"tokens": res.tokens, "documents": res.documents}))
        try:  # several ranks may tokenize at once: the first rename wins, the others drop their copy
            os.replace(tmp, out)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(out.glob("shard_*.bin"))


def load_corpus(spec: DataSpec, tok: Tokenizer | None = None) -> np.ndarray | S.ShardedTokens:
    """The whole corpus as tokens (memory-mapped; several shards read as one sequence)."""
    tok = tok or ByteTokenizer()
    try:
        if spec.source == "tokens":
            if not spec.path:
                raise DataError("data.source is 'tokens' but data.path is not set; give a shard file, directory or "
                                "glob (`frenzy data prepare` writes them)")
            return S.open_shards(_local_shards(spec))
        if isinstance(tok, ByteTokenizer) and spec.source == "builtin":
            return np.memmap(build_builtin_corpus(), dtype=np.uint8, mode="r")
        if isinstance(tok, ByteTokenizer) and spec.source == "text" and "://" not in (spec.path or ""):
            return np.memmap(_text_corpus_bytes(spec), dtype=np.uint8, mode="r")
        return S.open_shards(_tokenized_cache(spec, tok))
    except S.ShardError as err:
        raise DataError(str(err)) from None


def check_vocab(tokens: np.ndarray | S.ShardedTokens, vocab: int, what: str) -> None:
    """Refuse a corpus whose token ids do not fit the model's embedding: every token, streamed in 16M-token chunks
    (about 1 GB/s; an id past the vocab anywhere would crash the embedding mid-run), unless the dtype already
    bounds the ids below the vocab."""
    if np.iinfo(tokens.dtype).max < vocab:
        return
    top = 0
    for i in range(0, len(tokens), 1 << 24):
        top = max(top, int(np.asarray(tokens[i:i + (1 << 24)]).max()))
    if top >= vocab:
        raise DataError(f"{what} holds token id {top} but the model's vocab is {vocab}: set model.vocab >= {top + 1} "
                        "or use the tokenizer the shards were made with")


def held_out_text(spec: DataSpec, tok: Tokenizer, max_tokens: int = 1 << 21) -> np.ndarray:
    """The held-out 5% as UTF-8 bytes (what evaluation's held-out datasets read): the tokens themselves for the
    byte tokenizer, else the decoded text of up to `max_tokens` of them."""
    _, held = split(load_corpus(spec, tok))
    if isinstance(tok, ByteTokenizer):
        return np.asarray(held)
    ids = np.asarray(held[: min(len(held), max_tokens)])
    return np.frombuffer(tok.decode(ids).encode("utf-8"), dtype=np.uint8)


def split(tokens: np.ndarray | S.ShardedTokens) -> tuple[np.ndarray | S.ShardedTokens, np.ndarray | S.ShardedTokens]:
    """(train, held-out): the last 5% of the corpus is never trained on (evaluation's perplexity set)."""
    cut = int(len(tokens) * (1 - HELDOUT_FRACTION))
    return tokens[:cut], tokens[cut:]


def fingerprint(tokens: np.ndarray | S.ShardedTokens) -> str:
    """sha256 of the corpus bytes, recorded in manifests so a resume on other data is refused."""
    h = hashlib.sha256()
    for i in range(0, len(tokens), 1 << 24):
        h.update(np.ascontiguousarray(tokens[i:i + (1 << 24)]).tobytes())
    return h.hexdigest()


@dataclass
class Cursor:
    """How far the data stream has been read: samples consumed plus the sample ranges to skip."""

    samples: int = 0
    skips: list[tuple[int, int]] = field(default_factory=list)
    """Half-open [start, end) sample ranges never trained on (loss-spike windows)."""

    def to_dict(self) -> dict:
        return {"samples": self.samples, "skips": [list(s) for s in self.skips]}

    @classmethod
    def from_dict(cls, d: dict) -> Cursor:
        return cls(int(d["samples"]), [(int(a), int(b)) for a, b in d.get("skips", [])])


class BatchLoader:
    """Random windows of `seq_len + 1` tokens, a fresh permutation per epoch, rank slices of each global batch."""

    def __init__(self, tokens: np.ndarray | S.ShardedTokens, seq_len: int, global_batch: int, seed: int,
                 noise_samples: list[tuple[int, int]] | None = None) -> None:
        self.tokens, self.seq_len, self.global_batch, self.seed = tokens, seq_len, global_batch, seed
        self.n_windows = (len(tokens) - 1) // seq_len
        if self.n_windows < global_batch:
            raise DataError(f"corpus of {len(tokens)} tokens has {self.n_windows} windows of {seq_len + 1}; "
                            f"need at least global_batch={global_batch}: use a bigger corpus or smaller seq_len")
        self.noise = noise_samples or []
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def _window(self, sample: int) -> np.ndarray:
        epoch, pos = divmod(sample, self.n_windows)
        if epoch != self._perm_epoch:
            g = np.random.default_rng([self.seed, epoch])
            self._perm, self._perm_epoch = g.permutation(self.n_windows), epoch
        if any(a <= sample < b for a, b in self.noise):
            # fault injection: uniform random bytes, a batch no language model predicts (a loss spike)
            return np.random.default_rng([self.seed, sample, 7]).integers(0, 256, self.seq_len + 1).astype(self.tokens.dtype)
        start = int(self._perm[pos]) * self.seq_len
        return np.asarray(self.tokens[start:start + self.seq_len + 1])

    def next_indices(self, cursor: Cursor) -> list[int]:
        """The global sample indices of the next step; advances `cursor` past them and any skipped range."""
        out: list[int] = []
        s = cursor.samples
        while len(out) < self.global_batch:
            for a, b in cursor.skips:
                if a <= s < b:
                    s = b
            out.append(s)
            s += 1
        cursor.samples = s
        return out

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of shape [len(indices), seq_len] as int64."""
        w = torch.from_numpy(np.stack([self._window(i) for i in indices]).astype(np.int64))
        return w[:, :-1], w[:, 1:]


def record_samples(run_dir: Path, rank: int, step: int, indices: list[int]) -> None:
    """With `FRENZY_SAMPLE_LOG=1`, append the global sample ids this rank trains on at `step` to
    `<run_dir>/samples-rankNNNNN.jsonl` (an audit of data continuation across resumes and layout changes: the
    union over ranks of one step is that step's global batch)."""
    if os.environ.get("FRENZY_SAMPLE_LOG") != "1":
        return
    with open(run_dir / f"samples-rank{rank:05d}.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "samples": [int(i) for i in indices]}) + "\n")


def sample_order(run_dir: Path, tp: int = 1) -> dict[int, list[int]]:
    """Read `record_samples`' audit back: step -> the global batch's sample ids in data-parallel rank order (one
    tensor-parallel rank per group, as ranks are numbered dp-major). A step a rank logged twice (a resumed run
    training again the steps after its commit) keeps the later record; give each layout its own run directory
    (a rank the later layout lacks would keep its stale record)."""
    per: dict[int, dict[int, list[int]]] = {}
    for f in sorted(run_dir.glob("samples-rank*.jsonl")):
        rank = int(f.stem.removeprefix("samples-rank"))
        if rank % tp:
            continue
        for line in f.read_text().splitlines():
            r = json.loads(line)
            per.setdefault(r["step"], {})[rank // tp] = r["samples"]
    return {s: [i for dp in sorted(v) for i in v[dp]] for s, v in per.items()}
