"""Divergence read off the progress lines (issue 45, family 2): a loss that became NaN or inf and never came back.

A run that diverges often raises nothing: it keeps printing its ordinary metric lines with a non-finite loss
(`{'loss': nan, 'grad_norm': nan, ...}`, `iter 900: loss nan`, `| lm loss: NaN |`, a key | value table's
`| loss | nan |`, `loss=inf`, a JSON `NaN`, a headerless row's column that held a number in the row above, a
value in a list or a tensor's repr: `Loss:[tensor(nan, device='cuda:0')]`; unnamed: a line that starts with a
scalar tensor, what `print(loss)` writes, or a value in a progress bar's postfix, `21.7it/s, D=0.7, G=nan]`) until
it ends or is stopped. A person reading the log says "the loss diverged at step N": the first line of the last run
of non-finite losses, when no finite loss follows it. A non-finite gradient norm is the same failure seen one step
earlier (the loss printed is often the one before the update). A NaN that the run recovered from (fp16 overflow
steps that were skipped: one or a few prints) is not the failure, and a `loss scale` is not a loss; but STREAK
non-finite prints in a row are a divergence even where finite losses follow (a sweep's next configuration, a
restart from a checkpoint): that run did not recover by itself.

`track(low, chunk)` reads one chunk of a log (whole lines, lower-cased) and visits only the transitions: the next
non-finite token (`nan`, `inf`: a literal search in C, cheap even in a gigabyte of INFO lines), the line holding it
checked for a loss key, then the next finite loss (one regex search). A run of a million NaN lines costs one search.
Each pattern's next match is remembered (`_Next`), so a loss that flips between NaN and finite every few lines
costs a scan of the chunk per pattern, not one per flip (issue 45: 6 MB of flips did not finish in 10 min).
`fold` joins the chunks of a file in order. `trained_until`: an error line followed by SURVIVED lines that print a
finite loss is one the run went on training after (a start-up warning, a retried request), not what ended it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_TOKENS = (re.compile(rb"nan(?![a-z0-9_]| iterations)"), re.compile(rb"inf(?:inity)?(?![a-z0-9_])"))
"""Non-finite values as Python, torch and JSON print them (lower-cased); Megatron's `nan iterations` column is not
one."""
_KEY = (rb"(?:loss(?:es)?(?![_ ]?scale)|grad(?<![a-z]grad)(?:ient)?s?(?![_ ]?scal)|gnorm)[\w./-]*"
        rb"(?:['\"]?\s*[:=|]?|(?:\s[a-z][\w./-]*){1,2}\s*[:=|])\s*[\[(]?\s*['\"]?(?:tensor\(\s*)?")
"""A loss or gradient (norm) printed by name: `loss: nan`, `'grad_norm': inf`, `Grad=inf` (a gradient norm that is
not finite is the divergence a step early), or a name of a word or two after the key before its separator
(`Gen Loss Total :  nan`)."""
_BARE = rb"tensor\((?<=(?<![^\n])tensor\()"
"""A line that starts with a scalar tensor's repr (`tensor(2.31, device='cuda:0')`): what `print(loss)` writes each
step, the loss without its name (a vector's repr, `tensor([...`, is not a scalar and does not match)."""
_POSTFIX = rb"/(?:(?<=it/)s|(?<=s/)it)(?:,\s*[\w./-]+=[^,\]\n]*)*,\s*[\w./-]+="
"""A value in a progress bar's postfix (tqdm's `[07:11<00:00, 21.7it/s, D=0.71, G=nan]`): where a training loop puts
its losses, often under short names (a GAN's `D`/`G`), so any value there counts, whatever its name."""
_NONFINITE_VALUE, _FINITE_VALUE = rb"[-+]?(?:nan|inf(?:inity)?)(?![a-z0-9_])", rb"[-+]?\.?\d"
_NONFINITE = tuple(re.compile(k + _NONFINITE_VALUE) for k in (_KEY, _BARE, _POSTFIX))
_FINITE = tuple(re.compile(k + _FINITE_VALUE) for k in (_KEY, _BARE, _POSTFIX))
"""A loss printed by name, as a bare scalar tensor, or in a progress bar's postfix. Three patterns, not one with
three alternatives: each begins with a rare literal (`loss`/`grad`/`gnorm`, `tensor(`, `/`), so a search skips
ahead fast; one pattern whose alternatives begin with common letters scans a long chunk four times slower."""


def _first(patterns: tuple[re.Pattern[bytes], ...], low: bytes, pos: int = 0, end: int | None = None) -> int | None:
    """The offset of the earliest match of any of `patterns` in low[pos:end], or None. After a hit, the next pattern
    is searched only up to it (and a line's length past it): a chunk is not scanned to its end once per pattern."""
    end = len(low) if end is None else end
    best = None
    for p in patterns:
        if m := p.search(low, pos, end if best is None else min(end, best + MAX_LINE)):
            best = m.start() if best is None else min(best, m.start())
    return best


_AVERAGE = re.compile(_KEY + rb"[-+]?\d[\d.e+-]*\s*\(\s*[-+]?(?:nan|inf(?:inity)?)\s*\)")
"""A loss printed with its running average in parentheses (maskrcnn-benchmark's and FCOS's `loss: 23.37 (nan)`,
median then global average): an average that is non-finite means a non-finite loss went into it, the first sign of
the divergence, a print or more before the median turns."""
_DIGIT = re.compile(rb"\d")
_LOSS_TERMS = frozenset({b"box", b"obj", b"cls", b"dfl", b"giou", b"seg", b"total"})
"""Table columns that are losses without saying so: YOLO's loss terms."""
_NONFINITE_CELLS = frozenset({b"nan", b"inf", b"-inf", b"+inf", b"infinity", b"-infinity"})
_BRACKETS = b"[](),"
_CELL = re.compile(rb"\S+")
STREAK = 10
"""Non-finite loss prints in a row that make a divergence even where finite losses follow them."""
SURVIVED = 64
"""Lines printing a finite loss after an error line that show the run went on training after it."""
MAX_LINE = 8192
"""Bytes of a line read for a loss key: a huge line cannot make the check quadratic."""


@dataclass(frozen=True)
class LossTrack:
    """One chunk's loss history, as line numbers within the chunk (1-based)."""

    first: int | None = None
    """The first non-finite loss line, when no finite loss comes before it in the chunk (it may continue a
    divergence that began in an earlier chunk)."""
    last_start: int | None = None
    """The last non-finite loss line that follows a finite one in this chunk: where the last divergence began."""
    end: str | None = None
    """The loss at the chunk's end: `nan` (non-finite), `finite`, or None when the chunk prints no loss."""
    finite: tuple[int, ...] = ()
    """The last (up to SURVIVED) lines that print a finite loss: the run was still training there."""
    streak: int | None = None
    """The first line of the chunk's last run of at least STREAK non-finite loss prints (within the chunk)."""

    def shifted(self, lines: int) -> LossTrack:
        first, start, streak = (None if x is None else x + lines for x in (self.first, self.last_start, self.streak))
        return LossTrack(first, start, self.end, tuple(x + lines for x in self.finite), streak)


def _line_at(low: bytes, pos: int) -> tuple[int, int]:
    start = low.rfind(b"\n", 0, pos) + 1
    end = low.find(b"\n", pos)
    return start, len(low) if end < 0 else end


def _table_nonfinite(low: bytes, start: int, end: int) -> bool:
    """A table row (YOLO's `1/300  3.4G  nan  nan ...`) whose loss column is non-finite: the header is the nearest
    line above (within 64 KB) that names a loss or an epoch and holds no digit; a loss column is one named `*loss*`
    or one of YOLO's loss terms (older versions print `box obj cls`, `giou obj cls total`)."""
    lo = max(0, start - 65536)
    at = max(low.rfind(b"loss", lo, start), low.rfind(b"epoch", lo, start))
    if at < 0:
        return False
    hs, he = _line_at(low, at)
    header = low[hs:he]
    if _DIGIT.search(header):
        return False
    line = low[start:min(end, start + MAX_LINE)]
    row = [c.strip(_BRACKETS) for c in line.split()]
    if any(i < len(row) and row[i] in _NONFINITE_CELLS for i, h in enumerate(header.split())
           if b"loss" in h or h in _LOSS_TERMS):
        return True
    return _under_loss(header, line)


def _under_loss(header: bytes, line: bytes) -> bool:
    """A left-aligned table whose column names hold spaces (`Step  Train loss  Test loss`, DeepXDE's `[nan]`
    cells): a non-finite cell whose column span (from its start to the next cell's) lies under a `loss` heading."""
    cells = [(m.start(), m.group().strip(_BRACKETS)) for m in _CELL.finditer(line)]
    for n, (at, cell) in enumerate(cells):
        if cell in _NONFINITE_CELLS:
            until = cells[n + 1][0] if n + 1 < len(cells) else len(header)
            if b"loss" in header[at:until]:
                return True
    return False


_NUMBER = re.compile(rb"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")


def _row_nonfinite(low: bytes, start: int, end: int) -> bool:
    """A headerless progress row (the PyTorch tutorials' `35000 35% (1m 4s) nan Nam / Russian`: a step, a percentage,
    the time, then the loss, no name printed) whose cell is non-finite where the row above, of the same shape, printed a
    number: both rows start with a count, every cell before that one holds a digit in both, and the cell above is a
    finite number. A column that held a number and now holds `nan` is the quantity the loop prints, gone non-finite."""
    if start == 0:
        return False
    ps, pe = _line_at(low, start - 1)
    row = low[start:min(end, start + MAX_LINE)].split()
    above = low[ps:min(pe, ps + MAX_LINE)].split()
    if not row or not above or not row[0].isdigit() or not above[0].isdigit():
        return False
    for j, cell in enumerate(row[1:len(above)], 1):
        if cell.strip(_BRACKETS) in _NONFINITE_CELLS:
            return bool(_NUMBER.fullmatch(above[j].strip(_BRACKETS)))
        if not (_DIGIT.search(cell) and _DIGIT.search(above[j])):
            return False
    return False


class _Next:
    """The next match of one pattern at or after a position in one chunk, remembered: a search from `pos` that found
    its match at `hit` answers every later question for a position in [pos, hit] (and, when it found none, for any
    position past pos) without searching again. The questions `track` asks move forward through the chunk, so each
    pattern scans the chunk about once, however many times the loss flips between finite and non-finite (a fresh
    search per flip scanned to the chunk's end for a pattern that is not there: quadratic in the flips)."""

    __slots__ = ("hit", "lo", "low", "pattern", "searches")

    def __init__(self, pattern: re.Pattern[bytes], low: bytes) -> None:
        self.pattern, self.low, self.lo, self.hit, self.searches = pattern, low, len(low) + 1, None, 0

    def at(self, pos: int) -> int | None:
        """The start of the earliest match at or after `pos`, or None."""
        if pos < self.lo or (self.hit is not None and pos > self.hit):
            m = self.pattern.search(self.low, pos)
            self.lo, self.hit, self.searches = pos, None if m is None else m.start(), self.searches + 1
        return self.hit


def _earliest(cursors: tuple[_Next, ...], pos: int) -> int | None:
    """The earliest match at or after `pos` of any cursor's pattern, or None."""
    return min((h for c in cursors if (h := c.at(pos)) is not None), default=None)


def _next_nonfinite(low: bytes, pos: int, tokens: tuple[_Next, ...]) -> tuple[int, int] | None:
    """The (start, end) of the next line at or after `pos` that gives a loss a non-finite value (by its key, or by
    its column in a table); `tokens` find the non-finite values (_TOKENS) in `low`."""
    while (at := _earliest(tokens, pos)) is not None:
        start, end = _line_at(low, at)
        if start >= pos and (_first(_NONFINITE, low, start, min(end, start + MAX_LINE)) is not None
                             or _AVERAGE.search(low, start, min(end, start + MAX_LINE))
                             or _table_nonfinite(low, start, end) or _row_nonfinite(low, start, end)):
            return start, end
        pos = end + 1
    return None


def _is_streak(low: bytes, stop: int, until: int, tokens: tuple[_Next, ...]) -> bool:
    """Whether the non-finite loss line that ends at `stop` begins STREAK of them before `until` (at most STREAK - 1
    searches)."""
    pos = stop + 1
    for _ in range(STREAK - 1):
        hit = _next_nonfinite(low, pos, tokens)
        if hit is None or hit[0] >= until:
            return False
        pos = hit[1] + 1
    return True


def track(low: bytes) -> tuple[LossTrack, list[int]]:
    """The chunk's loss history and the byte offsets of the lines it names (to keep them in the compressed log)."""
    first = last_start = end = streak = None
    pos, tokens, finite = 0, tuple(_Next(t, low) for t in _TOKENS), tuple(_Next(f, low) for f in _FINITE)
    while (hit := _next_nonfinite(low, pos, tokens)) is not None:
        start, stop = hit
        if _first(_FINITE, low, pos, start) is not None:
            last_start = start
        elif first is None and last_start is None:
            first = start
        end = "nan"
        back = _earliest(finite, stop)
        while back is not None and _of_best(low, back):  # a summary's best loss is no later print
            back = _earliest(finite, back + 1)
        until = len(low) if back is None else _line_at(low, back)[0]
        if _is_streak(low, stop, until, tokens):
            streak = start
        if back is None:
            break
        pos, end = until, "finite"
    else:
        if end is None and _first(_FINITE, low) is not None:
            end = "finite"
    offsets = [o for o in (first, last_start, streak) if o is not None]
    last = _last_finite(low)
    line = _line_numbers(low, offsets + last)
    return LossTrack(line.get(first), line.get(last_start), end, tuple(line[o] for o in last),
                     line.get(streak)), sorted(set(offsets))


_BEST_KEY = re.compile(rb"\bbest[ _-]?(?:[a-z]+[ _-]?)?$")
"""`best` just before a loss key (`best loss`, `best_val_loss`, `best train-loss`): that value is the best so far. A
per-step line that prints the step's loss beside a best one (`loss 0.61 best_loss 0.52`, `best_acc`) still prints
the step's loss, which is read on its own."""
_SUMMARY_LINES = 8
"""Indented lines under a summary's heading read as part of it (DeepXDE prints three or four)."""


def _of_best(low: bytes, at: int) -> bool:
    """Whether the finite loss whose key starts at `at` is a best value (DeepXDE's `Best model at step 0:` over its
    indented `train loss: 5.47e+03`, a `best_val_loss: 0.35`): the minimum over the whole run, printed at its end,
    not a step the run trained after its non-finite prints, so no recovery. `best` just before the key
    (`_BEST_KEY`), or a heading that says best above the indented block the loss is in (up to _SUMMARY_LINES lines
    up)."""
    start, stop = _line_at(low, at)
    if _BEST_KEY.search(low, max(start, at - 24), at):
        return True
    for _ in range(_SUMMARY_LINES):  # up an indented block to its heading
        if start == 0 or low[start:start + 1] not in (b" ", b"\t"):
            return False
        start, stop = _line_at(low, start - 1)
        if b"best" in low[start:min(stop, start + MAX_LINE)] and low[start:start + 1] not in (b" ", b"\t"):
            return True
    return False


def _line_numbers(low: bytes, offsets: list[int]) -> dict[int, int]:
    """Offset -> 1-based line number, counting the newlines once over the chunk."""
    out, at, n = {}, 0, 1
    for o in sorted(set(offsets)):
        n += low.count(b"\n", at, o)
        out[o], at = n, o
    return out


def _last_finite(low: bytes) -> list[int]:
    """The offsets of the last SURVIVED lines that print a finite loss (oldest first), looking back over at most
    4 x SURVIVED lines that mention a loss."""
    end, out = len(low), []
    for _ in range(4 * SURVIVED):
        at = low.rfind(b"loss", 0, end)
        if at < 0 or len(out) == SURVIVED:
            break
        start, stop = _line_at(low, at)
        o = _first(_FINITE, low, start, min(stop, start + MAX_LINE))
        if o is not None and not _of_best(low, o):
            out.append(start)
        end = start
    return out[::-1]


def trained_until(tracks: Iterable[LossTrack]) -> int | None:
    """The line before which the run printed at least SURVIVED finite losses (line numbers file-wide): an error line
    above it is one the run went on training after. None when it printed fewer."""
    last: list[int] = []
    for t in tracks:
        last = (last + list(t.finite))[-SURVIVED:]
    return last[0] if len(last) == SURVIVED else None


def last_trained(tracks: Iterable[LossTrack]) -> int | None:
    """The last line that prints a finite loss (line numbers file-wide): the run was still training there."""
    return max((t.finite[-1] for t in tracks if t.finite), default=None)


def fold(tracks: Iterable[LossTrack]) -> int | None:
    """The line where the loss diverged, over a file's chunks (line numbers already file-wide): the start of the
    last run of non-finite losses when no finite loss follows it; else the start of the last STREAK-long run of
    them; else None."""
    root, state, streak = None, None, None
    for t in tracks:
        streak = t.streak if t.streak is not None else streak
        if t.end is None:
            continue
        if t.end == "finite":
            root, state = None, "finite"
            continue
        if t.last_start is not None:
            root = t.last_start
        elif state != "nan":
            root = t.first
        state = "nan"
    return root if state == "nan" else streak
