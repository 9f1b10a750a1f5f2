"""Cause chains: where one error line wraps another, which line states the cause (issue 45, family 1 and 4).

A failed run's log often holds a wrapper and, beneath or above it, the line that says what went wrong:

- NCCL's error-code line under its `NCCL error ...` (`ncclSystemError: System call (socket, ...) failed.`), and
  NCCL's `Last error:` (the line after it, or the rest of its line, is the cause of the `NCCL error in: ...` /
  `ncclSystemError: ...` lines above it); `Caused by:` and transformers' `because of the following error` likewise;
- Python's `The above exception was the direct cause of the following exception:` (the exception above the marker
  caused the one below it);
- an exception re-raised from another process: torch's `Original Traceback` (a DataLoader worker, a replica),
  `-- Process N terminated with the following error:` (torch.multiprocessing), Ray's `RayTaskError(...)`: the
  wrapper line is above, the cause is the exception that ends the traceback below it;
- an exception whose message ends in a colon (`Error(s) in loading state_dict for Model:`): the detail line after it
  (`size mismatch for ...`) is the cause, where a rule names it;
- TensorFlow's `N root error(s) found.`: the first error it lists below it, `(0) Kind: message`, is the cause;
- an exception class with its message on the next line (a paste that moved a line end, a debugger's banner): the
  next line is the cause;
- inside one line: `Original reason for failure was:`, `terminated with exception:`, `what():`, `failed with error:`:
  the text after the marker is the cause (`segments`).

`links(kept)` maps each wrapper line (an index into the kept lines) to the line that states its cause; the
diagnosis follows the links to the innermost cause, which takes the wrapper's place and standing. Lines are paired
within one rank: merged multi-rank logs interleave, and a `[rankN]:` prefix says whose line it is (a wrapper with no
prefix, a launcher's line, pairs with any rank's marker below it). Two links point down the log, to the exception
that ended the run:

- an exception header whose message ends in a colon and whose next line states no cause (TensorFlow's
  `ValueError: in user code:`, then the user's frames, then the same class with the message that says what failed):
  the next exception of its class within HEADER_SPAN lines;
- Python's `During handling of the above exception, another exception occurred`: each exception of the chain yields
  to the one that ends it, the exception that propagated and ended the run, when the chain is a side error inside a
  handler (the exception that ends it is the one that started it: a launcher's `SignalException`, a logging call's
  `KeyError` in between). Where the chain ends in a different exception, the first error is often one the code
  expected (a `KeyError` caught to raise a clearer error), and the rules' priorities decide.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

RANK = [re.compile(p) for p in (
    r"\[(?:rank|Rank)\s*(\d+)\]", r"\[default(\d+)\]", r"\[(?:PG [^\]]*?)?Rank (\d+)\]", r"\brank\s*[:=]?\s*(\d+)\b",
    r"\(local_rank: (\d+)\)")]
_PREFIX = re.compile(r"^\s*(?:\[(?:rank|Rank|default)\s*(\d+)\]:?|\((?:pid=\d+|\w+ pid=\d+)[^)]*\)|\d+:)")
"""The per-process prefix a launcher puts on a line: torchrun's `[rankN]:`, Ray's `(pid=N)`, `N:` of srun -l."""
EXCEPTION = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*|\([^)]*pid=\d+[^)]*\)\s*|\d+:\s*)?(?:[A-Za-z_][\w]*\.)*"
                       r"[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?:\([\w.]*\))?(?::|\s*$)")
"""A Python exception line as the interpreter prints it: a (module-qualified) class name ending in Error,
Exception, ..., at the start of the line (after a launcher's prefix), then a colon or nothing."""
NEXT_LINE = re.compile(r"(?:Last error:|because of the following error[^:]*:|Caused by:)\s*$")
"""A marker whose cause is the next line: NCCL's `Last error:`, transformers' lazy-import error, `Caused by:`."""
_SAME_LINE = re.compile(r"(?:Last error:|Caused by:)\s*(\S.*)$")
_DIRECT = re.compile(r"The above exception was the direct cause of the following exception")
_CLASS = re.compile(r"([A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))\b")
_DURING = re.compile(r"During handling of the above exception, another exception occurred")
REMOTE = re.compile(r"Original Traceback \(most recent call last\)|-- Process \d+ terminated with the following "
                     r"error|RemoteTraceback|\bRayTaskError\b|\bRaySystemError\b: System error: ")
"""A traceback re-raised from another process: the cause is the exception that ends it."""
_DETAIL = re.compile(r":\s*$")
"""An exception whose message ends in a colon: its details follow on the next lines (the first names the cause)."""
MESSAGE_BELOW = re.compile(r"(?:^|\s)(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception):?\s*$|"
                            r"(?:Exception has occurred|发生异常): *[A-Z]\w*|"
                            r"^\s*[A-Z]\w*(?:Error|Exception)\s+\(note: full exception trace is shown")
"""An exception class whose message is on the next line: a pasted log that lost a line end after `IndexError:`, a
debugger's banner (VS Code's `Exception has occurred: OutOfMemoryError`, in English or Chinese, or debugpy's
`ImportError       (note: full exception trace is shown but execution is paused at: ...)`)."""
NCCL_WRAPPER = re.compile(r"(?i)\bNCCL error\b")
NCCL_DETAIL = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?nccl[A-Z]\w*Error:\s*\S")
"""NCCL's error-code explanation under the error it raised (`NCCL error in: ..., unhandled system error` then
`ncclSystemError: System call (socket, malloc, munmap, etc) failed.`): the line that says which call failed."""
ROOT_ERRORS = re.compile(r"\b\d+ root error\(s\) found\.?\s*$")
FIRST_ROOT = re.compile(r"^\s*\(0\) \S")
"""TensorFlow's summary of a failed graph run (`ResourceExhaustedError: 2 root error(s) found.`) and the first of the
errors it lists on the lines below (`  (0) Resource exhausted: OOM when allocating ...`): the summary only counts
them; the listed line states what failed."""
TRACEBACK = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?Traceback \(most recent call last\):?\s*$")
"""A traceback's header: where it follows an exception class printed alone (a handler's `print(type(e).__name__)`),
the class's message is the exception line that ends the traceback, not the header."""
INLINE = re.compile(r"Original reason for failure was:|terminated with exception:|\bwhat\(\):|Caused by:|"
                    r"because of the following error[^:]*:|Last error:|\bfailed with error:")
"""In-line chain markers: the text after the last one is the innermost cause. `X failed with error: Y` is a
runner's report of a step that raised (a pipeline's node, a task, a backend's call): Y is what the step said."""
WINDOW = 6
"""How far (in log lines) a wrapper may be from its marker, and a marker from the cause it announces."""
HEADER_SPAN = 80
"""How far (in log lines) below an exception header the exception that states its cause may be: the user's frames
of a TensorFlow graph error lie between them."""


class Line(Protocol):
    line_no: int
    text: str


def rank_of(text: str) -> int | None:
    for p in RANK:
        m = p.search(text)
        if m:
            return int(m.group(1))
    return None


def _who(text: str) -> str | None:
    """The process a line belongs to, from its launcher prefix (None: no prefix)."""
    m = _PREFIX.match(text)
    return m.group(0).strip() if m else None


def segments(text: str) -> list[str]:
    """A line cut at its in-line chain markers, innermost (the last) first; one segment when there is none."""
    parts = INLINE.split(text)
    return [p for p in reversed(parts) if p.strip()] or [text]


def _after(kept: Sequence[Line], i: int, limit: int, want) -> int | None:
    """The first kept line after i, of i's process and within `limit` log lines, for which `want(j)` holds."""
    who, start = _who(kept[i].text), kept[i].line_no
    for j in range(i + 1, len(kept)):
        if kept[j].line_no - start > limit:
            return None
        if _who(kept[j].text) == who and want(j):
            return j
    return None


def _before(kept: Sequence[Line], i: int, limit: int, want) -> list[int]:
    """The kept lines before i (nearest first), of i's process and within `limit` log lines, for which `want(j)`
    holds."""
    who, start, out = _who(kept[i].text), kept[i].line_no, []
    for j in range(i - 1, -1, -1):
        if start - kept[j].line_no > limit:
            break
        if _who(kept[j].text) in (who, None) and want(j):  # a line with no prefix: the launcher's, any process's
            out.append(j)
    return out


def links(kept: Sequence[Line], found: set[int]) -> dict[int, int]:
    """Wrapper line -> the line that states its cause, as indices into `kept`; `found` holds the indices of the lines
    a rule names (the wrappers and causes worth linking)."""
    out: dict[int, int] = {}
    is_exc = [bool(EXCEPTION.match(k.text)) for k in kept]
    for i, k in enumerate(kept):
        text = k.text
        if i in found and NCCL_WRAPPER.search(text) and not NCCL_DETAIL.match(text):  # NCCL's code, then what failed
            detail = _after(kept, i, 1, lambda j: bool(NCCL_DETAIL.match(kept[j].text)))
            if detail is not None:
                out.setdefault(i, detail)
        if i in found and ROOT_ERRORS.search(text):  # TensorFlow's count of root errors, then the first of them
            first = _after(kept, i, 3, lambda j: bool(FIRST_ROOT.match(kept[j].text)))
            if first is not None:
                out.setdefault(i, first)
        if NEXT_LINE.search(text) or _SAME_LINE.search(text):  # the cause is the next line (or the rest of this one)
            cause = i if _SAME_LINE.search(text) else _after(kept, i, 2, lambda j: bool(kept[j].text.strip()))
            if cause is not None:
                above = _before(kept, i, 3, lambda j: j in found or bool(NCCL_DETAIL.match(kept[j].text)))
                for w in [i] * (cause != i) + above:
                    out.setdefault(w, cause)
        elif i in found and ((is_exc[i] and _DETAIL.search(text)) or MESSAGE_BELOW.search(text)):
            cause = _message_below(kept, i)
            if cause is not None and TRACEBACK.match(kept[cause].text):  # a class printed alone, then its traceback
                below = _same_class_below(kept, i, is_exc)
                if below is not None:
                    out.setdefault(i, below)
            elif cause is not None and (cause in found or MESSAGE_BELOW.search(text)):
                out.setdefault(i, cause)
            elif is_exc[i]:  # a header: the next exception of its class states what failed
                below = _same_class_below(kept, i, is_exc)
                if below is not None:
                    out.setdefault(i, below)
        elif _DIRECT.search(text):  # the exception above the marker caused the one below it
            above = _before(kept, i, 4 * WINDOW, lambda j: is_exc[j])
            below = _after(kept, i, 8 * WINDOW, lambda j: is_exc[j])
            if above and below is not None:
                out.setdefault(below, above[0])
        elif REMOTE.search(text):  # re-raised from another process: the exception that ends the inner traceback
            cause = _after(kept, i, 40 * WINDOW, lambda j: is_exc[j] and not REMOTE.search(kept[j].text))
            if cause is None:  # an exception class named neither Error nor Exception, read off its shape
                cause = _after(kept, i, 40 * WINDOW, lambda j: j in found and not REMOTE.search(kept[j].text))
            if cause is not None:
                for w in ([i] if i in found else []) + _before(kept, i, 3, lambda j: j in found):
                    if w != cause:
                        out.setdefault(w, cause)
    for w, cause in _handled(kept, is_exc).items():
        out.setdefault(w, cause)
    return out


def _message_below(kept: Sequence[Line], i: int) -> int | None:
    """The line that carries line i's message: the next line of its process, or the one after a blank line (Paddle
    prints `ResourceExhaustedError: `, a blank line, then the message) unless that one is a chain's marker (torch's
    `ProcessRaisedException: `, a blank line, then `-- Process N terminated with the following error:`)."""
    start = kept[i].line_no

    def carries(j: int) -> bool:
        text = kept[j].text
        return bool(text.strip()) and (kept[j].line_no == start + 1 or (
            kept[j - 1].line_no == start + 1 and not kept[j - 1].text.strip()
            and not (REMOTE.search(text) or _DIRECT.search(text) or _DURING.search(text))))
    return _after(kept, i, 2, carries)


def _same_class_below(kept: Sequence[Line], i: int, is_exc: list[bool]) -> int | None:
    """The next exception line of line i's class within HEADER_SPAN lines of its process."""
    cls = exception_class(kept[i].text)
    return _after(kept, i, HEADER_SPAN, lambda j: is_exc[j] and exception_class(kept[j].text) == cls)


def exception_class(text: str) -> str | None:
    """The exception class an exception line names (`tensorflow...ResourceExhaustedError` -> its last part)."""
    m = _CLASS.search(text)
    return m.group(1) if m else None


def _handled(kept: Sequence[Line], is_exc: list[bool]) -> dict[int, int]:
    """`During handling of the above exception` chains that end in the exception that started them: each other
    exception of the chain (a side error in the handler) -> the one that ends it."""
    step: dict[int, int] = {}
    for i, k in enumerate(kept):
        if _DURING.search(k.text):
            above = _before(kept, i, 4 * WINDOW, lambda j: is_exc[j])
            below = _after(kept, i, 40 * WINDOW, lambda j: is_exc[j])
            if above and below is not None:
                step[above[0]] = below
    out: dict[int, int] = {}
    for start in set(step) - set(step.values()):
        chain = [start]
        while chain[-1] in step and step[chain[-1]] not in chain:
            chain.append(step[chain[-1]])
        if len(chain) > 2 and exception_class(kept[start].text) == exception_class(kept[chain[-1]].text):
            out.update((j, chain[-1]) for j in chain[:-1])
    return out


def innermost(start: int, link: dict[int, int]) -> int:
    """Follow the links from `start` to the innermost cause (a cycle stops where it closes)."""
    seen = {start}
    while start in link and link[start] not in seen:
        start = link[start]
        seen.add(start)
    return start
