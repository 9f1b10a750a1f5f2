"""The last reading before `unknown`: a failure the log names in a shape a person recognises, where no rule, no
truncated traceback and no learned neighbour explains the log.

Four shapes, each answered with the category its source gives and a lower confidence (`NAMED_CONFIDENCE`):

- an exception line that ends a traceback (right under its last frame's code line, or under Python 3.11's `^^^^`
  marks) whose class the rules do not know, whatever its name ends in (`torch._dynamo.exc.Unsupported: ...`,
  `StopIteration`, `SystemExit: 2`), and a C++ exception that ended the process (`terminate called after
  throwing an instance of 'X'` and its `what():` line): the frame's file says whose (a library under
  site-packages: the framework's, unless its message checks what the caller gave or returned, `Expected X to
  return ...`: the script's; any other file: the script's; a C++ exception: the framework's native code);
- a native library's fatal check: glog's `F` lines (`F1127 10:01:02.1 123 file.cc:88] Check failed: ...`, c10's
  bracketed `[F1127 ...]`), the C library's `Assertion ... failed.` and a Rust library's `thread 'main' panicked
  at ...` (tokenizers): the framework's;
- a process ended by a signal, as a launcher or an IDE reports it (`exit code 134 (interrupted by signal 6:
  SIGABRT)`, mpirun's `exited on signal 9 (Killed)`, `died with <Signals.SIGTERM: 15>`, `terminated by signal 7`):
  SIGKILL the framework's (the host OOM killer or a lost node, as the `Killed` rule), a native crash (SIGSEGV,
  SIGBUS, SIGABRT, SIGFPE, SIGILL) the framework's, SIGTERM the infrastructure's (something outside the process
  ended it: the scheduler, a drain); then a launcher's non-zero exit status (`srun: error: n1: task 0: Exited with
  exit code 1`, mpirun's `returned a non-zero exit code`, make's `*** [Makefile:3: train] Error 1`): the
  framework's launcher symptom (ChildFailed);
- a line logged at ERROR, CRITICAL or FATAL level (Python logging's `ERROR:name:` and `- name - ERROR -`, `[ERROR]`,
  `FATAL:`, `Error: ...` at a line's start, loguru's `| ERROR |`, glog's `E` lines): the logger's name says whose
  (a library's logger: the framework's; `__main__`, `root`, the project's own or none: the script's).

The strongest shape wins (an exception or fatal check, then a signal, then an exit status, then a logged error),
the earliest among equals. Not read: a person's interrupt (`KeyboardInterrupt`, SIGINT), `SystemExit: 0`, a
hang-up (the Hangup rule reads it). Pure logic: no I/O, no Prefect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAMED_CONFIDENCE = 0.4
"""The confidence of an answer read off a failure's shape, not a rule: below a truncated traceback's (0.5)."""


@dataclass(frozen=True)
class Named:
    """The failure a log's line names by its shape."""

    type: str
    category: str
    line_no: int
    line: str
    restartable: bool
    mitigation: str
    strength: int


FRAME = re.compile(r'File "([^"]+)", line \d+')
"""A traceback's frame line (searched; matched after the line's indentation, it is one)."""
LIBRARY = re.compile(r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python\d")
"""A file of an installed library or of Python's own: the framework's, not the script's."""
_MARKS = re.compile(r"^\s*[\^~]+\s*$")
_EXC = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?((?:[A-Za-z_]\w*\.)*([A-Z]\w*))(?::\s*(.*?))?\s*$")
_NOT_A_FAILURE = re.compile(r"^(?:KeyboardInterrupt|GeneratorExit|Traceback)$")
_THROWN = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s+\S")
_FATAL = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?\[?F\d{4} \d\d:\d\d:\d\d(?:\.\d+)?(?:\s+\d+)? [\w./-]+:\d+\]\s*\S|"
                    r": Assertion [`'].*[`'] failed\.?\s*$|\bthread '[^']*' panicked at\b")
_SIGNAL = re.compile(r"(?i)(?:interrupted by |exited on |terminated by |killed by |received |with )signal:? "
                     r"(\d+)\b|<Signals\.SIG([A-Z]+): \d+>|\b(?:terminated|killed|died) (?:with|by) (?:signal )?"
                     r"SIG([A-Z]+)\b")
_EXIT = re.compile(r"^make(?:\[\d+\])?: \*\*\* .*\bError [1-9]\d*\s*$|"
                   r"(?i:\bexit(?:ed)? (?:with )?(?:code|status)[:= ]*[1-9]\d*\b|returned (?:a )?non-zero exit "
                   r"(?:code|status)|\ba non-zero exit (?:code|status)\b)")
_LOGGED = re.compile(r"^\s*(?:(?:ERROR|CRITICAL|FATAL):([\w.]*):|\[?(?:ERROR|CRITICAL|FATAL)\]?:?\s|"
                     r"(?:Error|Fatal error|FATAL ERROR):\s+\S|"
                     r"[\d/:,.T -]+\s*-\s*([\w.]+)\s*-\s*(?:ERROR|CRITICAL|FATAL)\s*-|"
                     r"[\d/:,.T -]+\s*\|\s*(?:ERROR|CRITICAL)\s*\||(?:\[rank\d+\]:\s*)?\[?E\d{4} \d\d:\d\d:\d\d)")
_LIBRARIES = frozenset((
    "torch", "tensorflow", "tf", "keras", "jax", "deepspeed", "transformers", "accelerate", "lightning",
    "pytorch_lightning", "ray", "vllm", "megatron", "horovod", "apex", "datasets", "hydra", "mmcv", "mmengine",
    "mmdet", "detectron2", "fairseq", "peft", "trl", "absl", "numba", "xla", "nccl", "urllib3", "requests"))
_SIGNALS: dict[str, tuple[str, str, bool, str]] = {
    "KILL": ("Killed", "framework", True,
             "the process was SIGKILLed with no error of its own: the host OOM killer or a lost node; resume once, and "
             "if it recurs check dmesg for the OOM killer"),
    "SEGV": ("SegFault", "framework", True,
             "the process crashed in native code: one restart; if it recurs, a library or driver mismatch"),
    "TERM": ("Terminated", "infrastructure", True,
             "something outside the process ended it (the scheduler's time limit or a preemption, a node drain, a "
             "person): check the scheduler's record for the job, then resume from the newest checkpoint"),
}
_NUMBERS = {"9": "KILL", "11": "SEGV", "7": "SEGV", "6": "SEGV", "8": "SEGV", "4": "SEGV", "15": "TERM",
            "KILL": "KILL", "SEGV": "SEGV", "BUS": "SEGV", "ABRT": "SEGV", "FPE": "SEGV", "ILL": "SEGV", "TERM": "TERM"}


_CALLER_CHECK = re.compile(r"(?i)^expected\b|\bexpected\b.*\b(?:got|returned|received|actual|instead|but)\b|"
                           r"\b(?:must|should) (?:be|have|return)\b")
"""A library's check of what its caller gave it or returned to it (gym's `Expected `Env.step` to return a four or
five element tuple, actual number of elements returned: 3.`): the caller's code against the library's API."""


_REJECTS_GIVEN = re.compile(r"(?i)^unsupported\b|\bonly supports?\b.*\bbut\b|\b(?:was|were) (?:provided|given|passed)\b")
"""An assert's message that names what the library supports and rejects what it was given (`Unsupported structured
space ...`, `The algorithm only supports (Box, Discrete) as action spaces but Dict(...) was provided`): the caller's
code or configuration against the library's API."""


def rejects_given(message: str) -> bool:
    """Whether a generic exception's message rejects what the caller gave the library (`_REJECTS_GIVEN`)."""
    return bool(_REJECTS_GIVEN.search(message))


def whose(path: str, message: str = "") -> str:
    """The category of a traceback frame's file: an installed library's or Python's own is the framework's, except
    where the exception's message is the library's check of what the caller gave or returned (`_CALLER_CHECK`):
    code written for another version of the API is the script's, as the corpus labels an API the code calls with
    arguments it no longer takes."""
    return "framework" if LIBRARY.search(path) and not _CALLER_CHECK.search(message) else "script"


def _raised(lines: list[tuple[int, str]], i: int) -> Named | None:
    """The exception line at `i` when it ends a traceback: the line under its last frame's code line (or the
    `^^^^` marks under that)."""
    n, text = lines[i]
    m = _EXC.match(text)
    if m is None or _NOT_A_FAILURE.match(m.group(2)) or (m.group(2) == "SystemExit" and m.group(3) in ("", "0", None)):
        return None
    j = i - 1
    if j >= 0 and lines[j][0] == n - 1 and _MARKS.match(lines[j][1]):
        j -= 1
    if j < 1 or lines[j][0] != lines[i][0] - (i - j) or lines[j - 1][0] != lines[j][0] - 1:
        return None
    frame = FRAME.match(lines[j - 1][1].lstrip())
    if frame is None or FRAME.search(lines[j][1]):
        return None
    return Named("UncaughtException", whose(frame.group(1), m.group(3) or ""), n, text.rstrip(), False,
                 f"{m.group(1)} ended the run (a class no rule knows), raised at {frame.group(1)}: read its message "
                 "and the frames above it (the script's own file: fix the code; a library: check its version and "
                 "what the code gave it)", 3)


def _native(lines: list[tuple[int, str]], i: int) -> Named | None:
    """A C++ exception's `what():` line under `terminate called after throwing`, or a native fatal check."""
    n, text = lines[i]
    if _WHAT.match(text) and i > 0 and _THROWN.search(lines[i - 1][1]):
        return Named("UncaughtException", "framework", n, text.rstrip(), False,
                     f"native code threw {_THROWN.search(lines[i - 1][1]).group(1)} and nothing caught it: read the "
                     "message; a library or its build (CUDA, an extension) against the installed versions", 3)
    if _FATAL.search(text):
        return Named("FatalError", "framework", n, text.rstrip(), False,
                     "a native library's own check failed and aborted the process: read the check; usually the "
                     "installed versions (the framework, its CUDA build, an extension) or the input it was given", 3)
    return None


def _ended(n: int, text: str) -> Named | None:
    """A launcher's or an IDE's report that the process ended by a signal, or with a non-zero exit status."""
    m = _SIGNAL.search(text)
    kind = _NUMBERS.get(next((g for g in m.groups() if g), "")) if m else None
    if kind is not None:
        type_, category, restartable, mitigation = _SIGNALS[kind]
        return Named(type_, category, n, text.rstrip(), restartable, mitigation, 2)
    if m is None and _EXIT.search(text):
        return Named("ChildFailed", "framework", n, text.rstrip(), True,
                     "a process exited with an error status and the log keeps no error of its own: find the process's "
                     "own output (its rank's log, the job's stderr); one restart", 1)
    return None


def _logged(n: int, text: str) -> Named | None:
    """A line logged at ERROR level or above: whose, by the logger's name."""
    m = _LOGGED.match(text)
    if m is None:
        return None
    name = (m.group(1) or m.group(2) or "").split(".")[0]
    return Named("LoggedError", "framework" if name in _LIBRARIES else "script", n, text.rstrip(), False,
                 "the program logged this error and stopped, and no rule knows its words: read it and the lines above "
                 "it (a library's logger: its version and the settings given to it; the project's own: its code or "
                 "config)", 0)


def named_failure(lines: list[tuple[int, str]]) -> Named | None:
    """The failure the numbered lines (the log's kept lines and its end, in order) name by shape, or None."""
    found = [x for i, (n, text) in enumerate(lines)
             if (x := _raised(lines, i) or _native(lines, i) or _ended(n, text) or _logged(n, text)) is not None]
    return max(found, key=lambda x: (x.strength, -x.line_no), default=None)
