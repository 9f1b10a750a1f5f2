"""Tokenizers: the zero-setup byte-level one, and any Hugging Face `tokenizer.json` (the `tokenizers` library).

`load_tokenizer(name)` takes `byte`, a `tokenizer.json` file or a model directory holding one; `train_bpe` builds a
byte-level BPE from local text (what `frenzy tokenizer train` runs). Nothing here downloads anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.errors import FrenzyError
from tasks.outdir import atomic_file
from tasks.userfiles import LIMITS, UserFileError, json_loads, load_json, looks_binary, path_kind, read_bytes

#: Names models use for their end-of-text token, in the order they are tried when the directory does not say.
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>", "<|eot_id|>")


class TokenizerError(FrenzyError, ValueError):
    """A tokenizer that cannot be loaded or used; the message names the fix."""


class ByteTokenizer:
    """UTF-8 bytes are the tokens (vocab 256); no end-of-text token."""

    name = "byte"
    vocab_size = 256
    eos_id: int | None = None
    sha256 = "byte"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.uint8)).decode(
            "utf-8", errors="replace")

    def to_json(self) -> str | None:
        return None


class HFTokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json; `eos_id` from the model directory's tokenizer_config.json or
    the usual end-of-text names."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            raw = read_bytes(path, "tokenizer file", LIMITS["json"])
            json_loads(raw, str(path))  # the project's strict JSON first: no NaN, no duplicate keys
            self.tok = Tokenizer.from_str(raw.decode("utf-8"))
        except UserFileError as err:
            raise TokenizerError(str(err)) from None
        except Exception as err:  # noqa: BLE001 - the library raises a bare Exception on a bad file
            raise TokenizerError(f"{path} is not a tokenizer.json the `tokenizers` library reads: {err}") from None
        self.path = path
        self.name = str(path)
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._eos(path.parent)

    def _eos(self, folder: Path) -> int | None:
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            try:
                doc = load_json(cfg, "tokenizer config")
            except UserFileError as err:
                raise TokenizerError(f"{err}; fix or remove it") from None
            if not isinstance(doc, dict):
                raise TokenizerError(f"{cfg} holds a {type(doc).__name__}, not a JSON object; fix or remove it")
            eos = doc.get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and self.tok.token_to_id(eos) is not None:
                return self.tok.token_to_id(eos)
        for name in _EOS_NAMES:
            if self.tok.token_to_id(name) is not None:
                return self.tok.token_to_id(name)
        return None

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Many texts at once (the library spreads them over its threads)."""
        encs = self.tok.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str | None:
        return self.path.read_text()


Tokenizer = ByteTokenizer | HFTokenizer


def load_tokenizer(name: str | None) -> Tokenizer:
    """`byte` (or empty), a tokenizer.json file, or a directory holding tokenizer.json (a Hugging Face model)."""
    if not name or name == "byte":
        return ByteTokenizer()
    p = Path(name).expanduser()
    try:
        kind = path_kind(p, "tokenizer file")
    except UserFileError as err:
        raise TokenizerError(str(err)) from None
    if kind == "dir":
        if not (p / "tokenizer.json").is_file():
            raise TokenizerError(f"{p} has no tokenizer.json; give the file itself, `byte`, or train one with "
                                 "`frenzy tokenizer train`")
        p = p / "tokenizer.json"
    if kind == "missing":
        raise TokenizerError(f"tokenizer {name!r} is neither `byte` nor an existing tokenizer.json or model directory")
    return HFTokenizer(p)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id."""
    return np.dtype(np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.uint32)


@dataclass
class TrainedTokenizer:
    path: str
    vocab_size: int
    files: int
    bytes: int
    seconds: float


def _text_files(inputs: list[str]) -> list[Path]:
    files: list[Path] = []
    for name in inputs:
        p = Path(name).expanduser()
        try:
            kind = path_kind(p, "text file")
        except UserFileError as err:
            raise TokenizerError(str(err)) from None
        if kind == "dir":
            files += sorted(q for q in p.rglob("*") if q.is_file())  # regular files only: a FIFO would block
        elif kind == "file":
            files.append(p)
        else:
            raise TokenizerError(f"{p} does not exist")
    if not files:
        raise TokenizerError(f"no files under {', '.join(inputs)}")
    for f in files:  # before the training: a binary file would teach it merges of noise
        with f.open("rb") as fh:
            if looks_binary(fh.read(1 << 16)):
                raise TokenizerError(f"{f} looks binary (NUL or control bytes), not text; give text files")
    if not any(f.stat().st_size for f in files):
        raise TokenizerError(f"every file under {', '.join(inputs)} is empty; a tokenizer needs text to learn from")
    return files


def _lines(files: list[Path], progress: Callable[[int, int], None] | None) -> Iterator[str]:
    total = sum(f.stat().st_size for f in files)
    done = 0
    for f in files:
        with f.open(encoding="utf-8", errors="replace") as fh:
            block: list[str] = []
            for line in fh:
                block.append(line)
                if len(block) == 1000:
                    yield "".join(block)
                    block = []
            if block:
                yield "".join(block)
        done += f.stat().st_size
        if progress:
            progress(done, total)


def _tokenizer_dest(out: str | Path) -> Path:
    """Where `train_bpe` writes: `out` itself (a file path) or `out/tokenizer.json`; never a model's own file."""
    dest = Path(out).expanduser()
    if dest.is_dir() or not dest.suffix:
        dest = dest / "tokenizer.json"
    if (dest.parent / "config.json").is_file() or any(dest.parent.glob("*.safetensors")):
        raise TokenizerError(f"{dest.parent} is a model directory; its tokenizer.json belongs to the model's "
                             "weights and is never replaced: give another --out")
    return dest


def train_bpe(inputs: list[str], out: str | Path, vocab_size: int = 8192, min_frequency: int = 2,
              progress: Callable[[int, int], None] | None = None, overwrite: bool = False) -> TrainedTokenizer:
    """A byte-level BPE (GPT-2 style: every byte representable, no unknown token) trained on local UTF-8 text,
    with `<|endoftext|>` as its end-of-text token; written to `out` (a tokenizer.json, or a directory for one)."""
    import time

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise TokenizerError(f"vocab_size {vocab_size} leaves no room for merges; byte-level BPE needs > 256 "
                             "(or use the `byte` tokenizer)")
    files = _text_files(inputs)
    dest = _tokenizer_dest(out)
    if dest.exists() and not overwrite:  # checked before the training, again under the lock when writing
        raise TokenizerError(f"{dest} exists; give --overwrite to replace it, or another --out")
    t0 = time.perf_counter()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_lines(files, progress), trainer=trainer)
    # `--out DIR` names a directory for tokenizer.json: made, as a directory output is; a file's directory must exist
    named_dir = dest.parent == Path(out).expanduser() and dest.parent.parent.is_dir()
    atomic_file(dest, tok.to_str().encode(), "tokenizer train", overwrite=overwrite, make_parent=named_dir)
    return TrainedTokenizer(path=str(dest), vocab_size=tok.get_vocab_size(with_added_tokens=True), files=len(files),
                            bytes=sum(f.stat().st_size for f in files), seconds=time.perf_counter() - t0)
