"""Log compression: drop the regular lines (metrics, init, framework chatter), keep the error lines and their
context, and say which templates were dropped.

A training log is millions of lines that differ only in their numbers. Candidate error lines are found by
keyword (`rules.ERROR_KEYWORDS`, each located with `bytes.find`, in C, in the chunk's distinct templates), the
lines where the loss turned non-finite by `progress.track`, and the line after a chain marker such as NCCL's
`Last error:` (or after an exception class whose message is on the next line) is kept with it; a candidate is kept with `context` lines
before it when a rule matches it, or when its template (digits ignored) is still rare: a line such as "eval error
rate 0.12" that recurs with every eval is regular, kept only the first `repeats` times per chunk. Everything else
is counted under its template (digits mapped to 0 by one `bytes.translate` pass), and Drain3 (streaming template
mining; a maintained library) mines the distinct ones, so it sees hundreds of lines, not millions. Files are
read in chunks of about 8 MB that end at line ends; files of 32 MB and more are compressed by one worker process
per core (`serve`: a plain subprocess that imports only this module, so a threaded caller such as a Prefect flow
is safe), two chunks in flight per worker: memory is bounded by the chunk size, MAX_KEPT_BYTES of kept text and
MAX_TEMPLATES, not by the file.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tasks.diagnosis.chains import MESSAGE_BELOW, NEXT_LINE
from tasks.diagnosis.progress import LossTrack, fold, last_trained, track, trained_until
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
MAX_KEPT_BYTES = 2 << 20
"""Kept text past which only the lines a rule names are kept (RULE_REPEATS per failure type): memory stays bounded
on a log whose every line looks like an error."""
MINE_MIN = 200
MAX_TEMPLATES = 5000
"""Distinct dropped templates counted per chunk (the most frequent): a log whose lines all differ stays bounded."""
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07?|[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """A log line safe to print and match: terminal escape sequences and control characters removed, cut to
    MAX_LINE characters. A line a progress bar redrew with carriage returns reads as its last draw (the text
    after the last `\r` that holds any): what the terminal showed last, such as the shell's `Killed` written over
    the bar when the process was killed."""
    if "\r" in text.rstrip("\r\n"):
        text = next((d for d in reversed(text.split("\r")) if d.strip()), text)
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
    divergence: int | None = None
    """The line where the loss turned non-finite for good (tasks/diagnosis/progress.py), if it did."""
    capped: bool = False
    """More than MAX_KEPT_BYTES of error-looking lines: past that, only lines a rule names were kept."""
    trained_until: int | None = None
    """The line before which the run printed progress.SURVIVED finite losses: it went on training after the error
    lines above it."""
    last_trained: int | None = None
    """The last line that prints a finite loss."""
    restarts: tuple[int, ...] = ()
    """The lines where the log's first line is printed again (`head_of`): a new run appended to the same log."""
    tail: list[Kept] = field(default_factory=list)
    """The log's last lines (TAIL_LINES), kept or not: read where no rule names any line (tasks/diagnosis/named.py)."""

    @property
    def ratio(self) -> float:
        return self.bytes / max(1, self.kept_bytes)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)


def _mine(counts: Counter, top: int) -> list[tuple[str, int]]:
    """Drain3 templates over the distinct masked lines, weighted by how often each occurred. A short log (at most
    MINE_MIN distinct masked lines) is its own template list: mining would merge little and importing the miner
    costs more than reading the log."""
    if len(counts) <= MINE_MIN:
        return [(k.decode(errors="replace").strip(), n) for k, n in counts.most_common(top)]
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


def _keyword_lines(blob: bytes) -> set[bytes]:
    """The lines of `blob` that hold an error keyword (each keyword found by `bytes.find`, in C)."""
    out: set[bytes] = set()
    for kw in ERROR_KEYWORDS:
        pos = blob.find(kw)
        while pos >= 0:
            start = blob.rfind(b"\n", 0, pos) + 1
            end = blob.find(b"\n", pos)
            out.add(blob[start:len(blob) if end < 0 else end])
            if end < 0:
                break
            pos = blob.find(kw, end)
    return out


@dataclass
class _Part:
    lines: int
    bytes: int
    kept: list[tuple[int, str, bool]]  # (line number within the part, text, error line)
    kept_bytes: int
    dropped: Counter
    loss: LossTrack
    restarts: tuple[int, ...] | None = ()
    """Lines (within the part) that repeat the log's first line; None: it recurs too often to start runs."""


_NEXT_LINE = re.compile(NEXT_LINE.pattern.encode())
_MESSAGE_BELOW = re.compile(MESSAGE_BELOW.pattern.encode())
"""An exception class whose message is on the next line (`ImportError:` then `DeepSpeed is not installed`): that
line states the error, and is kept with it though it holds no keyword."""


def _mark(chunk: bytes, marks: dict[int, bool], start: int, context: int) -> None:
    """Keep the line at `start` as an error line, with `context` lines before it."""
    marks[start] = True
    s = start
    for _ in range(context):
        if s == 0:
            break
        s = chunk.rfind(b"\n", 0, s - 1) + 1
        marks.setdefault(s, False)


FIND_MAX = 16
"""Up to this many keyword templates in a chunk, each template's lines are found with `bytes.find` (a few C
scans); beyond it, one pass over the chunk's lines (a log of distinct error lines must not cost a scan each)."""


def _occurrences(zeroed: bytes, lines: list[bytes], hit: set[bytes], done: set[bytes]) -> Iterator[tuple[int, bytes]]:
    """(offset, template) of the lines whose template is in `hit`, each template's in order; a template put in
    `done` is not looked for further."""
    if len(hit) <= FIND_MAX:
        padded = b"\n" + zeroed + b"\n"  # padded[i] is the newline before the line at chunk offset i
        for t in hit:
            pos = padded.find(b"\n" + t + b"\n")
            while pos >= 0 and t not in done:
                yield pos, t
                pos = padded.find(b"\n" + t + b"\n", pos + len(t) + 1)
        return
    pos = 0
    for t in lines:
        if t in hit and t not in done:
            yield pos, t
        pos += len(t) + 1


def _error_lines(chunk: bytes, zeroed: bytes, lines: list[bytes], counts: Counter, context: int,
                 repeats: int) -> dict[int, bool]:
    """Line start -> error line (False: context) for the lines worth keeping: keyword lines, the line after a chain
    marker such as NCCL's `Last error:` (it states the cause), and the context before each. The keywords are looked
    for in the chunk's distinct templates (`counts`; `zeroed` is the chunk with digits as 0, so a template's offsets
    are its lines'), not in every line: a training log repeats a few templates a million times. A template is kept
    `repeats` times, or RULE_REPEATS times when a rule knows it."""
    distinct = list(counts)
    lowered = [t.lower() for t in distinct]
    found = _keyword_lines(b"\n".join(lowered))
    hit = {t for t, low in zip(distinct, lowered, strict=True) if low in found}
    rules = RULES + learned_rules()
    marks: dict[int, bool] = {}
    seen: Counter = Counter()
    limit: dict[bytes, int] = {}
    done: set[bytes] = set()
    for pos, t in _occurrences(zeroed, lines, hit, done):
        end = pos + len(t)
        line = chunk[pos:end]
        if t not in limit:  # a recurring line the rules know is kept more often
            limit[t] = RULE_REPEATS if counts[t] > repeats and _is_rule(line, rules) else repeats
        seen[t] += 1
        if seen[t] >= limit[t]:
            done.add(t)
        _mark(chunk, marks, pos, context)
        if end < len(chunk) and (_NEXT_LINE.search(line.rstrip()) or _MESSAGE_BELOW.search(line.rstrip())):
            marks[end + 1] = True
    return marks


MAX_RESTARTS = 64
"""Recurrences of the log's first line per chunk past which it is a regular line (a progress print), not the first
line of a new run appended to the log."""
HEAD_BYTES = 1 << 16
_FRAME_LINE = re.compile(rb'^\s|File "')


def head_of(first: bytes) -> bytes:
    """The template (digits as 0) of the first non-empty line of a log's first bytes, when it can mark a run's start:
    not an error-looking line, not a traceback's frame (a pasted traceback starts every rank's copy the same way),
    with some words in it. Empty when it cannot."""
    for line in first.split(b"\n")[:-1]:
        if line.strip():
            low = line.lower()
            words = sum(ch.isalpha() for ch in line.decode(errors="replace"))
            if words < 4 or _FRAME_LINE.search(line) or any(kw in low for kw in ERROR_KEYWORDS):
                return b""
            return line.translate(_ZERO)
    return b""


def _restarts(zeroed: bytes, counts: Counter, head: bytes) -> tuple[int, ...] | None:
    """The 1-based lines of a chunk (digits as 0) that repeat the log's first line `head`; None when it recurs more
    than MAX_RESTARTS times."""
    n = counts.get(head, 0) if head else 0
    if n == 0 or n > MAX_RESTARTS:
        return () if n == 0 else None
    padded, out, line, at = b"\n" + zeroed + b"\n", [], 1, 0  # a copy of the chunk only where its head recurs
    pos = padded.find(b"\n" + head + b"\n")
    while pos >= 0:  # padded[pos] is the newline before the line at chunk offset pos
        line += zeroed.count(b"\n", at, pos)
        at = pos
        out.append(line)
        pos = padded.find(b"\n" + head + b"\n", pos + len(head) + 1)
    return tuple(out)


def _compress_chunk(chunk: bytes, context: int, repeats: int, head: bytes = b"") -> _Part:
    """One chunk (whole lines): its error lines with context, the lines where its loss turned non-finite, and the
    rest counted by template (digits as 0: one C pass, not a regex)."""
    zeroed = chunk.translate(_ZERO)
    lines = zeroed.split(b"\n")
    counts = Counter(lines)
    restarts = _restarts(zeroed, counts, head)
    loss, diverged = track(chunk.lower())
    marks = _error_lines(chunk, zeroed, lines, counts, context, repeats)
    del lines
    for start in diverged:
        _mark(chunk, marks, start, context)
    kept, kept_bytes, newlines, at = [], 0, 0, 0
    for start in sorted(marks):
        end = chunk.find(b"\n", start)
        end = len(chunk) if end < 0 else end
        newlines += chunk.count(b"\n", at, start)  # lines before this one, counted once over the chunk
        at = start
        kept.append((newlines + 1, clean(chunk[start:min(end, start + MAX_LINE * 2)].decode(errors="replace")),
                     marks[start]))
        kept_bytes += end - start + 1
        counts[zeroed[start:end]] -= 1  # a kept line is not a dropped one
    dropped = +counts  # positive counts only
    dropped.pop(b"", None)
    return _Part(chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1), len(chunk), kept, kept_bytes,
                 _top(dropped, MAX_TEMPLATES), loss, restarts)


def _top(counts: Counter, n: int) -> Counter:
    """The n most frequent templates: a log whose every line differs (hashes, hex addresses) stays bounded."""
    return counts if len(counts) <= n else Counter(dict(counts.most_common(n)))


def _compress_range(path: str, start: int, end: int, context: int, repeats: int, head: bytes = b"") -> _Part:
    with open(path, "rb") as f:
        f.seek(start)
        return _compress_chunk(f.read(end - start), context, repeats, head)


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
"""Files at least this large are compressed by worker processes, one per core, a chunk at a time each."""
_ROOT = str(Path(__file__).resolve().parents[2])


def serve() -> None:
    """A compression worker (`python -c "from tasks.diagnosis.compress import serve; serve()"`): reads pickled
    (path, start, end, context, repeats, head) requests on stdin and answers each with its pickled `_Part` on stdout.
    A plain subprocess, not multiprocessing: multiprocessing's spawn and forkserver children import the caller's
    `__main__` (for the CLI, every command group and torch) in every worker; this one imports only this module."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            req = pickle.load(inp)
        except EOFError:
            return
        pickle.dump(_compress_range(*req), out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


def _workers(n: int) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
    return [subprocess.Popen([sys.executable, "-c", "from tasks.diagnosis.compress import serve; serve()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) for _ in range(n)]


def _parts(path: Path, context: int, repeats: int, workers: int | None, head: bytes = b"") -> Iterator[_Part]:
    """The file's chunks compressed, in order: by worker processes (one per core) for a large file, chunk k by
    worker k mod n, at most two chunks in flight per worker, so that memory does not grow with the file."""
    size = path.stat().st_size
    ranges = _ranges(path, size)
    n = min(workers or os.cpu_count() or 1, len(ranges))
    if size < PARALLEL_MIN_BYTES or n <= 1:
        for a, b in ranges:
            yield _compress_range(str(path), a, b, context, repeats, head)
        return
    procs = _workers(n)
    try:
        def send(k: int) -> None:
            if k < len(ranges):
                pickle.dump((str(path), *ranges[k], context, repeats, head), procs[k % n].stdin)
                procs[k % n].stdin.flush()

        for k in range(2 * n):
            send(k)
        for k in range(len(ranges)):
            try:
                part = pickle.load(procs[k % n].stdout)
            except EOFError:
                raise RuntimeError(f"a log compression worker died (exit {procs[k % n].wait()}) on {path}") from None
            send(k + 2 * n)
            yield part
    finally:
        for p in procs:
            p.stdin.close()
            p.stdout.close()
            p.wait()


_COARSE = re.compile(r"(?=\S*\d)\S{6,}")
"""Tokens of six or more characters with a digit (ids, hashes, addresses, paths): a line without them is the key of
the over-budget rule verdicts, so a million lines that differ only in a request id cost one rule check."""
MAX_VERDICTS = 20000
"""Distinct line keys checked against the rules past MAX_KEPT_BYTES; later new keys are dropped unchecked: the time
to diagnose a log of a million distinct error lines stays bounded too."""


@dataclass
class _Merge:
    """The parts of a file joined in order, within MAX_KEPT_BYTES of kept text: past it, only error lines a rule
    names are kept (RULE_REPEATS of each failure type, with their context) and the lines where the loss turned
    non-finite, so a log whose every line looks like an error is still diagnosed in bounded memory and time."""

    context: int
    kept: list[Kept] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    tracks: list[LossTrack] = field(default_factory=list)
    lines: int = 0
    bytes: int = 0
    kept_bytes: int = 0
    text_bytes: int = 0
    capped: bool = False
    over: Counter = field(default_factory=Counter)
    verdicts: dict[str, str | None] = field(default_factory=dict)
    rules: list = field(default_factory=list)
    restarts: list[int] | None = field(default_factory=list)
    """Lines that repeat the log's first line (None: it recurs too often to mark runs)."""

    def _worth(self, text: str) -> bool:
        """Past the budget: whether an error line is kept (a rule names it, RULE_REPEATS per failure type)."""
        key = _COARSE.sub("", text)
        if key not in self.verdicts:
            if len(self.verdicts) >= MAX_VERDICTS:
                return False
            self.rules = self.rules or RULES + learned_rules()
            self.verdicts[key] = next((r.type for r in self.rules if r.regex.search(text)), None)
        kind = self.verdicts[key]
        if kind is None or self.over[kind] >= RULE_REPEATS:
            return False
        self.over[kind] += 1
        return True

    def add(self, part: _Part) -> None:
        pending: deque = deque(maxlen=max(1, self.context))
        loss_lines = {part.loss.first, part.loss.last_start, part.loss.streak}
        for no, text, err in part.kept:
            if self.text_bytes > MAX_KEPT_BYTES:
                self.capped = True
                if not err:
                    pending.append((no, text, err))
                    continue
                if no not in loss_lines and not self._worth(text):
                    continue
                self.kept += [Kept(self.lines + n, t, e) for n, t, e in pending if n >= no - self.context]
                pending.clear()
            self.kept.append(Kept(self.lines + no, text, err))
            self.text_bytes += len(text)
        self.dropped.update(part.dropped)
        if len(self.dropped) > 2 * MAX_TEMPLATES:
            self.dropped = _top(self.dropped, MAX_TEMPLATES)
        self.tracks.append(part.loss.shifted(self.lines))
        if part.restarts is None or self.restarts is None or len(self.restarts) > 4 * MAX_RESTARTS:
            self.restarts = None
        else:
            self.restarts += [self.lines + n for n in part.restarts]
        self.lines += part.lines
        self.bytes += part.bytes
        self.kept_bytes += part.kept_bytes


TAIL_BYTES = 8192
_QUOTE_END = re.compile(r"^\W{0,6}$")
"""A line that closes a quote (a code fence, a docstring's quotes) or is blank: not the log's last line of text."""


TAIL_LINES = 8
"""Lines of the log's end kept in `Compressed.tail`."""


def _tail(source: Path | str | bytes, lines: int) -> list[tuple[int, str]]:
    """The log's last TAIL_LINES lines (within its last TAIL_BYTES), numbered, without the empty one after the
    last line end."""
    if isinstance(source, bytes):
        tail = source[-TAIL_BYTES:]
    else:
        with open(source, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            tail = f.read()
    text = tail.decode(errors="replace").split("\n")[-TAIL_LINES - 1:]
    if text and text[-1] == "":
        text.pop()
    text = text[-min(TAIL_LINES, lines):] if lines else []
    return list(zip(range(lines - len(text) + 1, lines + 1), text, strict=True))


def _last_frame(numbered: list[tuple[int, str]], lines: int) -> list[Kept]:
    """A traceback's last frame where the log ends in it (its `File "..."` line and the code line under it, at most
    two blank or quote-closing lines after them), as context lines: an excerpt or a log a crash cut before the
    exception line. The code line holds no keyword when it raises nothing (`x = table[key]`); the diagnosis reads
    it only where no line names a failure. Empty where the log ends otherwise."""
    numbered = numbered[-6:]
    while numbered and len(numbered) > 2 and _QUOTE_END.match(numbered[-1][1]) and lines - numbered[-1][0] < 2:
        numbered.pop()
    if len(numbered) < 2 or lines - numbered[-1][0] > 2:
        return []
    (n_frame, frame), (n_code, code) = numbered[-2:]
    if not re.match(r'\s*File "[^"]+", line \d+', frame) or not code.strip() or 'File "' in code:
        return []
    return [Kept(n_frame, clean(frame), False), Kept(n_code, clean(code), False)]


def compress(source: Path | str | bytes, context: int = 2, top_templates: int = 10, repeats: int = 5,
             workers: int | None = None) -> Compressed:
    """Compress a log file (or its bytes) to its error lines with `context` lines before each. A recurring
    error-looking line no rule knows is kept `repeats` times per chunk of the file. A file is streamed: memory is
    bounded by the chunk size and MAX_KEPT_BYTES, not by the file."""
    t0 = time.perf_counter()
    m = _Merge(context)
    if isinstance(source, bytes):
        m.add(_compress_chunk(source, context, repeats, head_of(source[:HEAD_BYTES])))
    else:
        with open(source, "rb") as f:
            head = head_of(f.read(HEAD_BYTES))
        for part in _parts(Path(source), context, repeats, workers, head):
            m.add(part)
    templates = _mine(m.dropped, top_templates) if m.dropped else []
    last = m.kept[-1].line_no if m.kept else 0
    tail = _tail(source, m.lines)
    m.kept += [k for k in _last_frame(tail, m.lines) if k.line_no > last]
    return Compressed(m.kept, m.lines, m.bytes, m.kept_bytes, time.perf_counter() - t0, templates,
                      divergence=fold(m.tracks), capped=m.capped, trained_until=trained_until(m.tracks),
                      last_trained=last_trained(m.tracks), restarts=tuple(m.restarts[1:]) if m.restarts else (),
                      tail=[Kept(n, clean(t), False) for n, t in tail])
