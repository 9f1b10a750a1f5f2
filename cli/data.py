"""`frenzy tokenizer train`, `frenzy data prepare` and `frenzy export`: tokenizers, token shards and Hugging Face
model directories (tasks/training/tokenizer.py, tasks/training/shards.py, tasks/hf)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cli.argtypes import bounded_int
from cli.output import emit
from tasks.errors import FrenzyError


def _progress(label: str) -> Callable[[int, int], None]:
    """A progress line on stderr, at most twice a second."""
    last = [0.0]

    def show(a: int, b: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5:
            last[0] = now
            print(f"\r{label(a, b) if callable(label) else label}", end="", file=sys.stderr, flush=True)

    return show


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from tasks.training.tokenizer import load_tokenizer, train_bpe

    if args.action == "train":
        if not args.inputs:
            raise FrenzyError("frenzy tokenizer train needs text files or directories to learn from")
        res = train_bpe(args.inputs, args.out, vocab_size=args.vocab_size, min_frequency=args.min_frequency,
                        progress=_progress(lambda a, b: f"read {a / 1e6:,.1f} / {b / 1e6:,.1f} MB"),
                        overwrite=args.overwrite)
        print(file=sys.stderr)
        doc = res.__dict__
        human = f"wrote {res.path}: byte-level BPE, {res.vocab_size} tokens, from {res.files} files " \
                f"({res.bytes / 1e6:,.1f} MB) in {res.seconds:.1f}s"
    else:  # show
        tok = load_tokenizer(args.out)
        text = args.text
        ids = [int(i) for i in tok.encode(text)]
        doc = {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "text": text, "ids": ids,
               "bytes_per_token": len(text.encode()) / max(len(ids), 1)}
        human = (f"{tok.name}: vocab {tok.vocab_size}, end-of-text id {tok.eos_id}\n{len(ids)} tokens "
                 f"({doc['bytes_per_token']:.2f} bytes each): {ids[:32]}")
    emit(args, doc, lambda: human)
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from tasks.training import shards as S
    from tasks.training.prepared import prepare_dir
    from tasks.training.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    urls: list[str] = []
    for inp in args.inputs:
        urls += [u for u, _ in S.list_files(inp)]
    kind = args.format or S.guess_source(urls)
    out = Path(args.out).expanduser()
    t0 = time.perf_counter()
    res = prepare_dir(S.iter_documents(kind, urls, args.text_field), tok, out, {
        "tokenizer": tok.name, "vocab_size": tok.vocab_size, "inputs": args.inputs, "format": kind},
        shard_tokens=args.shard_tokens, overwrite=args.overwrite, source=", ".join(args.inputs),
        progress=_progress(lambda d, n: f"{d:,} documents, {n:,} tokens, "
                                        f"{n / max(time.perf_counter() - t0, 1e-9):,.0f} tokens/s"))
    print(file=sys.stderr)
    doc = {**res.__dict__, "tokens_per_s": res.tokens_per_s, "tokenizer": tok.name, "format": kind}
    human = (f"wrote {len(res.shards)} shard(s) to {out}: {res.tokens:,} {res.dtype} tokens from {res.documents:,} "
             f"{kind} documents ({res.bytes / 1e6:,.1f} MB) in {res.seconds:.1f}s ({res.tokens_per_s:,.0f} tokens/s)\n"
             f"train on them with data: {{source: tokens, path: {out}}}")
    emit(args, doc, lambda: human)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tasks.evaluation.engine import load_remote, tokenizer_path
    from tasks.hf.convert import export_hf
    from tasks.jobspec import ModelSpec
    from tasks.training.tokenizer import load_tokenizer

    state, info = load_remote(args.checkpoint)
    spec = ModelSpec.model_validate(info["model"])
    tpath = tokenizer_path(info)
    tok = load_tokenizer(tpath) if tpath else None
    out = export_hf(state, spec, int(info["seq_len"]), args.out, tok.to_json() if tok else None,
                    tok.eos_id if tok else None, overwrite=args.overwrite)
    doc = {"checkpoint": args.checkpoint, "step": info["step"], "out": str(out),
           "architecture": json.loads((out / "config.json").read_text())["architectures"][0],
           "tokenizer": bool(tok), "parameters": int(sum(t.numel() for k, t in state.items()))}
    note = "" if tok else " (byte-level model: no tokenizer.json; its token ids are UTF-8 bytes)"
    human = f"exported step {info['step']} as {doc['architecture']} to {out}{note}"
    emit(args, doc, lambda: human)
    return 0


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("tokenizer", cmd_tokenizer)
    sp.add_argument("action", choices=["train", "show"])
    sp.add_argument("inputs", nargs="*", help="train: text files or directories")
    sp.add_argument("--text", default="def hello(world):\n    return 42", help="show: the text to encode")
    sp.add_argument("--out", required=True, help="train: tokenizer.json (or a directory) to write; show: the tokenizer "
                                                 "(`byte`, a tokenizer.json or a model directory)")
    sp.add_argument("--vocab-size", type=bounded_int(257, 1 << 20), default=8192, help="train: tokens (default 8192)")
    sp.add_argument("--min-frequency", type=bounded_int(1, 1 << 20), default=2,
                    help="train: a merge needs at least this many occurrences (default 2)")
    sp.add_argument("--overwrite", action="store_true", help="train: replace an existing tokenizer file")

    sp = add("data", cmd_data)
    sp.add_argument("action", choices=["prepare"])
    sp.add_argument("inputs", nargs="+", help="files, directories or globs (local or s3://)")
    sp.add_argument("--out", required=True, help="directory for shard_NNNNNN.bin (llm.c format)")
    sp.add_argument("--tokenizer", default="byte", help="`byte`, a tokenizer.json or a model directory (default byte)")
    sp.add_argument("--format", choices=["text", "jsonl", "parquet"], help="default: from the file names")
    sp.add_argument("--text-field", default="text", help="jsonl field / parquet column with the text (default text)")
    sp.add_argument("--shard-tokens", type=bounded_int(1024, (1 << 31) - 1), default=100_000_000,
                    help="tokens per shard (default 100M)")
    sp.add_argument("--overwrite", action="store_true", help="replace a non-empty --out directory")

    sp = add("export", cmd_export)
    sp.add_argument("checkpoint", help="checkpoint root (its newest commit) or a step_NNNNNNNN URI")
    sp.add_argument("out", help="directory to write config.json, model.safetensors and tokenizer.json into")
    sp.add_argument("--overwrite", action="store_true", help="replace a non-empty directory (all its files)")
