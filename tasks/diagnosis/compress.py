"""Log compression: drop the regular lines (metrics, init, framework chatter), keep the error lines and their
context, and say which templates were dropped.

A training log is millions of lines that differ only in their numbers. Candidate error lines are found by
keyword (`rules.ERROR_KEYWORDS`, each located with `bytes.find`, in C); a candidate is kept with `context` lines
before it when a rule matches it, or when its template (digits ignored) is still rare: a line such as "eval error
rate 0.12" that recurs with every eval is regular, kept only the first `repeats` times per chunk. Everything else
is counted under its template (digits mapped to 0 by one `bytes.translate` pass), and Drain3 (streaming template
mining; a maintained library) mines the distinct ones, so it sees hundreds of lines, not millions. Files are
read in chunks of about 8 MB that end at line ends; files of 32 MB and more are compressed by one process per
core, a chunk each (forkserver, so a threaded caller such as a Prefect flow is safe).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tasks.diagnosis.rules import ERROR_KEYWORDS, RULES, learned_rules

_DIGITS = b"0123456789"
_ZERO = bytes.maketrans(_DIGITS, b"0" * 10)
CHUNK = 8 << 20
MAX_LINE = 4096
"""Characters of a kept line that the rules see: a 100 MB line costs its bytes once, never quadratic regex time."""
MAX_TAIL = 1 << 20
"""A chunk ends at the next line end within this many bytes, else mid-line: memory stays bounded on a log with
no newlines."""
RULE_REPEATS = 50
"""Copies of one recurring template that a rule matches, kept per chunk: a million identical error lines are one
cause."""
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07?|[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """A log line safe to print and match: terminal escape sequences and control characters removed, cut to
    MAX_LINE characters."""
    text = _CONTROL.sub("", text)
    return text if len(text) <= MAX_LINE else text[:MAX_LINE] + f" ...[{len(text) - MAX_LINE} characters cut]"


@dataclass
class Kept:
    line_no: int
    text: str
    error: bool
    """An error line (False: context kept around one)."""


@dataclass
class Compressed:
    kept: list[Kept]
    lines: int
    bytes: int
    kept_bytes: int
    seconds: float
    templates: list[tuple[str, int]] = field(default_factory=list)
    """The most frequent dropped templates (Drain3's, numbers masked) and their line counts."""

    @property
    def ratio(self) -> float:
        return self.bytes / max(1, self.kept_bytes)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)


def _mine(counts: Counter, top: int) -> list[tuple[str, int]]:
    """Drain3 templates over the distinct masked lines, weighted by how often each occurred."""
    try:
        from drain3 import TemplateMiner
        from drain3.template_miner_config import TemplateMinerConfig
    except ImportError:  # still a useful report without the miner: the masked lines themselves
        return [(k.decode(errors="replace"), n) for k, n in counts.most_common(top)]
    cfg = TemplateMinerConfig()
    cfg.profiling_enabled = False
    miner = TemplateMiner(config=cfg)
    weight: Counter = Counter()
    for line, n in counts.items():
        text = line.decode(errors="replace").strip()
        if text:
            r = miner.add_log_message(text)
            weight[r["cluster_id"]] += n
    by_id = {c.cluster_id: c.get_template() for c in miner.drain.clusters}
    return [(by_id[cid], n) for cid, n in weight.most_common(top)]


def _is_rule(line: bytes, rules: list) -> bool:
    text = clean(line[:MAX_LINE * 2].decode(errors="replace"))
    return any(r.regex.search(text) for r in rules)


def _lines_with(chunk: bytes, low: bytes) -> list[int]:
    """Start offsets of the lines that hold an error keyword (each keyword found by `bytes.find`, in C)."""
    starts: set[int] = set()
    for kw in ERROR_KEYWORDS:
        pos = low.find(kw)
        while pos >= 0:
            starts.add(chunk.rfind(b"\n", 0, pos) + 1)
            end = chunk.find(b"\n", pos)
            if end < 0:
                break
            pos = low.find(kw, end)
    return sorted(starts)


@dataclass
class _Part:
    lines: int
    bytes: int
    kept: list[tuple[int, str, bool]]  # (line number within the part, text, error line)
    kept_bytes: int
    dropped: Counter


def _compress_chunk(chunk: bytes, context: int, repeats: int) -> _Part:
    """One chunk (whole lines): its error lines with context, and the rest counted by template."""
    seen: Counter = Counter()
    ruled: dict[bytes, bool] = {}
    rules = RULES + learned_rules()
    marks: dict[int, bool] = {}  # line start -> is an error line (False: context)
    for start in _lines_with(chunk, chunk.lower()):
        end = chunk.find(b"\n", start)
        line = chunk[start:end if end >= 0 else len(chunk)]
        key = line.translate(None, _DIGITS)
        seen[key] += 1
        if seen[key] > repeats:  # a recurring line: kept only if the rules know it (decided once per template)
            if key not in ruled:
                ruled[key] = _is_rule(line, rules)
            if not ruled[key] or seen[key] > RULE_REPEATS:
                continue
        marks[start] = True
        s = start
        for _ in range(context):
            if s == 0:
                break
            s = chunk.rfind(b"\n", 0, s - 1) + 1
            marks.setdefault(s, False)
    kept, kept_bytes, regular, prev, newlines, at = [], 0, [], 0, 0, 0
    for start in sorted(marks):
        end = chunk.find(b"\n", start)
        end = len(chunk) if end < 0 else end
        newlines += chunk.count(b"\n", at, start)  # lines before this one, counted once over the chunk
        at = start
        kept.append((newlines + 1, clean(chunk[start:min(end, start + MAX_LINE * 2)].decode(errors="replace")),
                     marks[start]))
        kept_bytes += end - start + 1
        regular.append(chunk[prev:start])
        prev = end + 1
    regular.append(chunk[prev:])
    dropped = Counter(b"".join(regular).translate(_ZERO).split(b"\n"))  # digits as 0: one C pass, not a regex
    dropped.pop(b"", None)
    return _Part(chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1), len(chunk), kept, kept_bytes, dropped)


def _compress_range(path: str, start: int, end: int, context: int, repeats: int) -> _Part:
    with open(path, "rb") as f:
        f.seek(start)
        return _compress_chunk(f.read(end - start), context, repeats)


def _ranges(path: Path, size: int) -> list[tuple[int, int]]:
    """Byte ranges of about CHUNK bytes that end at line ends."""
    out, start = [], 0
    with open(path, "rb") as f:
        while start < size:
            f.seek(min(size, start + CHUNK))
            tail = f.readline(MAX_TAIL) if start + CHUNK < size else b""
            end = min(size, start + CHUNK + len(tail))
            out.append((start, end))
            start = end
    return out


PARALLEL_MIN_BYTES = 32 << 20
"""Files at least this large are compressed by a pool of processes, one per core, a chunk each."""


def compress(source: Path | str | bytes, context: int = 2, top_templates: int = 10, repeats: int = 5,
             workers: int | None = None) -> Compressed:
    """Compress a log file (or its bytes) to its error lines with `context` lines before each. A recurring
    error-looking line no rule knows is kept `repeats` times per chunk of the file."""
    t0 = time.perf_counter()
    if isinstance(source, bytes):
        parts = [_compress_chunk(source, context, repeats)]
    else:
        path = Path(source)
        size = path.stat().st_size
        ranges = _ranges(path, size)
        n = workers or min(len(ranges), os.cpu_count() or 1)
        if size >= PARALLEL_MIN_BYTES and n > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            # forkserver: safe to start from a threaded process (a Prefect flow); workers import only this module
            with ProcessPoolExecutor(n, mp_context=mp.get_context("forkserver")) as pool:
                parts = list(pool.map(_compress_range, *zip(*[(str(path), a, b, context, repeats)
                                                                for a, b in ranges], strict=True)))
        else:
            parts = [_compress_range(str(path), a, b, context, repeats) for a, b in ranges]
    kept: list[Kept] = []
    dropped: Counter = Counter()
    lines = 0
    for part in parts:
        kept += [Kept(lines + no, text, err) for no, text, err in part.kept]
        dropped.update(part.dropped)
        lines += part.lines
    templates = _mine(dropped, top_templates) if dropped else []
    return Compressed(kept, lines, sum(p.bytes for p in parts), sum(p.kept_bytes for p in parts),
                      time.perf_counter() - t0, templates)
