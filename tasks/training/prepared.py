"""A prepared token directory: `frenzy data prepare`'s output, written whole (tasks/outdir.py) and marked complete by
`prepared.json`, which names every shard with its token count; readers accept the directory only with that marker
and only when the shards on disk are exactly the ones it names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from tasks.outdir import atomic_dir
from tasks.training import shards as S
from tasks.userfiles import load_json

MARKER = "prepared.json"


def prepare_dir(documents: Iterator[str], tokenizer: object, out: str | Path, meta: dict, shard_tokens: int,
                overwrite: bool = False, progress: Callable[[int, int], None] | None = None,
                source: str = "the corpus") -> S.Prepared:
    """Tokenize into a temp directory, write the marker last, then rename it onto `out` (one writer at a time)."""
    out = Path(out).expanduser().absolute()
    with atomic_dir(out, "data prepare", overwrite=overwrite) as tmp:
        res = S.prepare(documents, tokenizer, tmp, shard_tokens=shard_tokens, progress=progress, source=source)
        counts = {Path(p).name: len(S.read_shard(Path(p))) for p in res.shards}
        res.out_dir, res.shards = str(out), [str(out / Path(p).name) for p in res.shards]
        doc = {**res.__dict__, **meta, "shard_tokens": counts}
        (tmp / MARKER).write_text(json.dumps(doc, indent=1))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return res


def check_prepared(folder: Path, found: list[Path]) -> None:
    """Refuse a directory of `shard_NNNNNN.bin` (Frenzy's own names) without its completion marker, or whose shards
    differ from the ones the marker names; shards named otherwise (llm.c's, nanoGPT's) carry no marker."""
    ours = [p for p in found if re.fullmatch(r"shard_\d{6}\.bin", p.name) and p.parent == folder]
    if not ours:
        return
    marker = folder / MARKER
    if not marker.is_file():
        raise S.ShardError(f"{folder} holds shard_*.bin but no {MARKER}: a `frenzy data prepare` into it did not "
                           "finish (killed?), so the shards may be partial; prepare it again with --overwrite")
    try:
        doc = load_json(marker, "prepared-shards marker")
        named = doc.get("shard_tokens")  # per-shard counts; markers written before them name the shards only
        names = set(named) if isinstance(named, dict) else {Path(p).name for p in doc["shards"]}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise S.ShardError(f"{marker} is unreadable ({err!r}); prepare the directory again with --overwrite") \
            from None
    have = {p.name for p in ours}
    if have != names:
        extra, missing = sorted(have - names), sorted(names - have)
        raise S.ShardError(f"{folder}: the shards differ from {MARKER} (not named there: {extra[:3]}, missing: "
                           f"{missing[:3]}); two prepares wrote into it, or files were moved: prepare it again "
                           "with --overwrite")
    if isinstance(named, dict):
        for p in ours:
            if len(S.read_shard(p)) != named[p.name]:
                raise S.ShardError(f"{p}: {len(S.read_shard(p))} tokens but {MARKER} says {named[p.name]}; "
                                   "prepare the directory again with --overwrite")
