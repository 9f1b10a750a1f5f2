"""Root-cause diagnosis of a failed run's log: compress, match the rule base, rank, attribute.

`diagnose(log)` returns a `Diagnosis`: the failure `type` and `category` of the highest-priority matching line
(the earliest among equals), the line itself, the rank and node it came from when the log says (rank prefixes of
torch and torchrun, torchrun's failure summary, dmesg host prefixes), whether a restart can help, a mitigation,
and every other matching line as `evidence` (the symptoms). No rule matching gives type `Unknown`.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.diagnosis.chains import EXCEPTION, REMOTE, innermost, links, rank_of, segments
from tasks.diagnosis.compress import Compressed, Kept, compress
from tasks.diagnosis.named import FRAME as _FRAME
from tasks.diagnosis.named import NAMED_CONFIDENCE, named_failure, rejects_given, whose
from tasks.diagnosis.rules import CONTENT, DIVERGENCE, GENERIC, Rule, learned_rules
from tasks.diagnosis.rules import FETCH_FAILED as _FETCH_FAILED
from tasks.diagnosis.rules import NCCL_INIT_CUDA as _NCCL_INIT_CUDA
from tasks.userfiles import UserFileError, looks_binary, open_user_file, regular_file

if TYPE_CHECKING:  # the agent (urllib, http) is imported only when it is asked
    from tasks.diagnosis.agent import AgentConfig

_NODE = [re.compile(p) for p in (
    r"^\s*host\s*:\s*(\S+)",  # torchrun's failure summary
    r"^(\S+) kernel: ",  # dmesg lines collected with the log
    r"^([A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ",  # NCCL's host:pid:tid [device] prefix
    r"\bon (?:node|host) ([A-Za-z0-9_.-]+)", r"\bnode[= ]([A-Za-z0-9_.-]*\d[A-Za-z0-9_.-]*)")]  # a name, not a word
_SUMMARY_HOST = re.compile(r"^\s*host\s*:\s*(\S+)")
_STAMP = re.compile(r"\[[EWFI](\d{4}) (\d\d:\d\d:\d\d\.\d+)")  # glog/c10d: [E0626 05:06:30.929...
_SOURCE = re.compile(r"^\s*(?:\[rank\d+\]:\s*|\([^)]*pid=\d+[^)]*\)\s*|\d+:\s*)?"
                     r"(?:raise\b|File \"[^\"]*\", line \d+(?:, in \S+)?\s*$)")
"""A traceback's source and frame lines, after any launcher's prefix (`[rankN]:`, Ray's `(Actor pid=N)`, srun's
`N:`): the `raise` statement above an exception is not the exception. A frame line with more after it is a
traceback pasted as one line (its line ends lost): it holds the error."""
_BANNER = re.compile(r"^\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\s{2,}Traceback \(most recent")
"""IPython's (a notebook's) traceback banner names the exception's class; the line that ends the traceback states
it: the banner ranks a hair below the same rule's other lines, so it is the root cause only where nothing else is."""
_MARKUP = re.compile(r"^\s*(?:[`*_#>]+\s*)+(.*?)[`*_]*\s*$")
"""The markdown a line was pasted with (inline code, emphasis, a heading, a quote: at its start, closed at its end):
not part of the line. A line that starts plain keeps its end (Slurm's `CANCELLED AT ... ***`)."""
_BRACKETED = re.compile(r"^\s*[\[(]\s*((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\s*:\s*\S.*?)\s*[\])]\s*$")
"""An exception line pasted wrapped in brackets or parentheses (`[ValueError : message]`): the exception inside."""
_CXX_FRAME = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?frame #\d+: ")
"""A C++ backtrace's frame line (c10's `frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(...)`): where the
error was raised, not an error; the message above the backtrace states it."""
_NCCL_INFO = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?[\w.-]+:\d+:\d+ \[\d+\] NCCL INFO "
                        r"(?!Call to connect returned (?:Connection timed out|No route to host|Network is unreachable))")
"""NCCL's info lines (its plugin search, its `-> 6` call traces) state no error; its WARN line does, and so does its
socket connect to a peer that timed out or found no route (NCCL logs its retries of such a connect at INFO)."""
_GLUED = re.compile(r"(?:Error|Exception):?\s*[A-Z]\w*(?:Error|Exception)\b|[a-z](?:Error|Exception)[A-Z]|\^{2}")
"""Two exception lines written into each other by interleaved ranks (`RuntimeError: RuntimeErrorRuntimeError: ...`,
`RuntimeErrorNCCL error in: ...`), or a traceback's source line run into Python 3.11's location markers by another
rank's copy (`^^^^^^    ^raise ValueError(^`, `^^ValueError`): a garbled copy, which yields to a clean one of the
same failure."""
_WARNING = re.compile(r"(?<!NCCL )\bWARN(?:ING)?\b|\b[A-Z]\w*Warning\b|(?:^|[\s\[])W\d{4} \d\d:\d\d|"
                      r"(?:^|[\s\[]|: )W [\w/.-]+\.\w+:\d+\]")
"""A warning-level line (Python's logging `WARNING`, a `UserWarning`, glog's and TensorFlow's `W` lines; NCCL's WARN
states its errors and is not one)."""
_INFO = re.compile(r"^\s*(?:INFO|DEBUG):|\[(?:I|D|INFO|DEBUG)\]|\|\s*(?:INFO|DEBUG)\s*\||^\s*[ID]\d{4} \d\d:\d\d:\d\d|"
                   r"^\s*(?:\[[^\]]*\]|[\d/:,.T-]+(?: [\d:,.]+)?)\s*(?:-\s*)?(?:INFO|DEBUG)\b")
"""A line logged at info or debug level (Python logging's `INFO:name:` and `%(asctime)s INFO`, `[I]`, loguru's
`| INFO |`, glog's `I1101 01:06:35`): the program said it and went on."""
_CARRIED_ON = re.compile(r"(?i)\binstead\b|\bfall(?:ing)? ?back\b|\bretrying\b|\bwill retry\b|\bskipping\b|"
                         r"\bcontinuing\b")
"""A line that says the program carried on after it (`slurmstepd: error: couldn't chdir to ...: going to /tmp
instead`, `falling back to ...`, `retrying`)."""
_SHELL_WENT_ON = re.compile(r"Your shell has not been properly configured to use 'conda activate'|"
                            r"^\s*\S+: line \d+: (?:\S+: )*\S.*?: (?:No such file or directory|command not found|"
                            r"Permission denied|Not a directory)\s*$")
"""A batch script's own command failing and the shell running its next line: conda's shell function failing to
activate an environment (`CommandNotFoundError: Your shell has not been properly configured to use 'conda
activate'`), and bash's report of a command it could not run or a file it could not source or enter
(`/var/spool/slurmd/job1/slurm_script: line 16: ../secrets.sh: No such file or directory`, `...: line 9: cd: ...: No
such file or directory`, `...: command not found`). Where a failure follows, the job went on to it. bash's report of
a child it saw killed (`line 34: 1657575 Killed  python ...`) is no such line: that child's death ended the work."""
SYMPTOM = 20
"""Rules below this priority name a launcher's symptoms (exit codes, ChildFailedError, signals sent to workers): a
line the run survived does not yield to them, only to a failure."""
MAX_EVIDENCE = 100
"""Evidence entries kept in a diagnosis: a million identical error lines are one cause, not a million."""
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_DEVICE_ASSERT = re.compile(r"device-side assert triggered|Assertion `[^`]*` failed")
"""A device-side assert leaves the CUDA context unusable: every CUDA error the process reports after it (an invalid
device pointer as its tensors are freed, a launch failure) is its consequence, not a fault of the GPU."""


_PHASE_END = re.compile(r"(?i)\bfit\W* stopped\b|\bmax_epochs=\S+ reached|^\W*(?:running )?(?:evaluating|validating|"
                        r"evaluation|validation)\b|\btraining (?:is )?(?:finished|complete[d]?|done|ended)\b")
"""A line that says the run left its training loop: training ended, or an evaluation or validation pass began."""
_DESYNC = ("the ranks fell out of step where the run left its training loop (training ended, or an evaluation began): "
           "one rank ran code the others did not reach (evaluation or saving on rank 0 only, a collective in a branch "
           "only some ranks take, a last batch some ranks lack), and they waited in a collective until its timeout. "
           "Fix the script: every rank calls the same collectives (where one rank's evaluation outlasts the "
           "collective timeout, raise it with init_process_group(timeout=...)); a restart hangs at the same point")


@dataclass
class Finding:
    type: str
    category: str
    line_no: int
    line: str
    rank: int | None
    node: str | None


@dataclass
class Diagnosis:
    """What `frenzy diagnose LOG --json` prints (`dataclasses.asdict`). A dataclass, not a pydantic model: the
    command answers a short log in well under a second, and pydantic alone costs a tenth of that to import."""

    log: str
    category: str
    """infrastructure | framework | script; `unknown` when no rule matched."""
    type: str
    root_cause_line: str | None
    line_no: int | None
    rank: int | None
    node: str | None
    restartable: bool
    mitigation: str
    evidence: list[Finding]
    lines: int
    kept_lines: int
    compression_ratio: float
    templates: list[tuple[str, int]]
    source: str = "rules"
    """rules; learned (no rule matched: the nearest labelled log, above the calibrated similarity); or agent (the
    LLM agent diagnosed it; its rule is learned)."""
    via: str = "line"
    """How the rules found the root cause: `line` (a rule names the line), `chain` (the cause inside a wrapper:
    NCCL's `Last error:`, a re-raised worker error, `raise ... from`), `progress` (the loss turned non-finite in the
    progress lines, with no error line), `truncated` (a traceback cut before its exception line: its last frame),
    `named` (no rule knows the line: a failure read off its shape, tasks/diagnosis/named.py)."""
    confidence: float | None = None
    """For a learned answer: the cosine similarity to the nearest labelled log (the threshold is calibrated on
    held-out projects); for a truncated traceback, TRUNCATED_CONFIDENCE; for a failure read off its shape,
    NAMED_CONFIDENCE. None: a rule named the line."""


@dataclass
class _Cand:
    """A line a rule names, with the standing it competes with (a cause inherits its wrapper's)."""

    rule: Rule
    finding: Finding
    priority: float
    via: str = "line"


_OVERDRAWN = re.compile(r"^((?:Killed|[Ss]egmentation fault|Bus error|Illegal instruction|"
                        r"Floating point exception|Aborted|Terminated)(?: \(core dumped\))?)[^\s:;,.!?'\")\]}]")
"""The shell's report of a signal written at the start of a line that still holds the tail of a progress bar's last
draw (`Killedg in train batch: 12 / 263`): read as the report alone. Only glued to the leftover (no space, no
sentence punctuation), so a program's prose (`Killed 3 workers`, `Killed: ...`) is not taken for it; the report's
word is then read by the rules as on a line of its own (a bare `Aborted` or `Terminated` names no cause there)."""


def _first(patterns: list[re.Pattern], text: str) -> str | None:
    for p in patterns:
        m = p.search(text)
        if m:
            return m.group(1)
    return None


def match_line(text: str, learned: list[Rule] | None = None) -> Rule | None:
    """The rule that names a line: the innermost part of an in-line chain first, a rule that reads the message
    before a generic exception class, built-in rules before learned ones."""
    m = _MARKUP.match(text)
    text = m.group(1) if m else text
    m = _BRACKETED.match(text)
    text = m.group(1) if m else text
    m = _OVERDRAWN.match(text)
    text = m.group(1) if m else text
    for seg in segments(text):
        for r in CONTENT:
            if r.regex.search(seg):
                return r
    for r in GENERIC + (learned or []):
        if r.regex.search(text):
            return r
    return None


def _blame(kept: list, i: int, category: str) -> str:
    """A generic framework exception (RuntimeError, AssertionError) raised from the script's own file is the
    script's: read off the nearest traceback frame above it (a library under site-packages keeps the framework's).
    One whose message rejects what the caller gave the library (`named.rejects_given`: `AssertionError: Unsupported
    structured space ...`) is the script's, from a library's frame or with no frame shown."""
    if category != "framework":
        return category
    found = _MESSAGE.search(kept[i].text)
    if found and rejects_given(found.group(1)):
        return "script"
    for k in reversed(kept[max(0, i - 3):i]):
        m = _FRAME.search(k.text)
        if m:
            return whose(m.group(1))
    return category


_MESSAGE = re.compile(r"(?:Error|Exception)\s*:\s*(.*)")
"""An exception line's message: what follows its class."""


def _order(cand: _Cand) -> tuple:
    """Highest priority first; among equals a line the runtime stamped when it wrote it (glog's, c10d's) before
    one with no stamp, the earliest stamp first (ranks interleave out of order in merged logs), then by position.
    An unstamped line of the same standing is written later about the same failure (the C++ terminate handler's
    `what():` copy of the watchdog's exception, printed as the process dies) or its time is unknown."""
    f = cand.finding
    m = _STAMP.search(f.line)
    return (cand.priority, bool(m), tuple(-ord(ch) for ch in "".join(m.groups())) if m else (), -f.line_no)


def _finding(rule: Rule, category: str, k: Kept, rank: int | None = None, node: str | None = None) -> Finding:
    r = rank_of(k.text)
    return Finding(type=rule.type, category=category, line_no=k.line_no, line=k.text.strip(),
                   rank=r if r is not None else rank, node=_first(_NODE, k.text) or node)


def _candidates(c: Compressed, learned: list[Rule]) -> dict[int, _Cand]:
    """Every kept error line a rule names (by its index in the kept lines), with the rank and host of torchrun's
    failure summary for its exitcode lines."""
    rank_host: dict[int, str] = {}
    host = None
    for k in c.kept:  # torchrun's failure summary: "host : X" then "rank : N" in each block
        h = _SUMMARY_HOST.search(k.text)
        if h:
            host = h.group(1)
        r = _SUMMARY_RANK.search(k.text)
        if r and host:
            rank_host.setdefault(int(r.group(1)), host)
    out: dict[int, _Cand] = {}
    block_rank: int | None = None
    block_host: str | None = None
    for i, k in enumerate(c.kept):
        h, sr = _SUMMARY_HOST.search(k.text), _SUMMARY_RANK.search(k.text)
        block_host = h.group(1) if h else block_host
        block_rank = int(sr.group(1)) if sr else block_rank
        if not k.error or _SOURCE.match(k.text) or _NCCL_INFO.match(k.text) or _CXX_FRAME.match(k.text):
            continue
        rule = match_line(k.text, learned)
        if rule is None:
            continue
        rule = _init_cuda_failed(c, k, _fetch_failed(c.kept, i, rule))
        f = _finding(rule, _blame(c.kept, i, rule.category) if rule.blame else rule.category, k)
        if rule.type == "ChildFailed" and f.rank is None:  # an exitcode line of the summary: its block's rank, host
            f.rank, f.node = block_rank, f.node or block_host
        if f.node is None and f.rank is not None:
            f.node = rank_host.get(f.rank)
        priority = min(rule.priority, _LOCAL_PEER) if _local_peer(c.kept, i, rule) else rule.priority
        out[i] = _Cand(rule, f, priority - 0.5 * bool(_BANNER.match(k.text)))
    _after_device_assert(out)
    return out


_CONNECT_FAILED = re.compile(r"Network is unreachable|No route to host|Connection refused|Connection timed out|"
                             r"\[(?:Errno|WinError) (?:101|110|111|113|1006[015])\]")
"""A connect that failed (the errno's words, or its number on Linux and Windows): no connection was opened."""
_CLIENT_FRAME = re.compile(r"[/\\](?:urllib3|requests|httpx|httpcore|aiohttp|huggingface_hub|gdown)[/\\]|"
                           r"[/\\](?:urllib[/\\]request|http[/\\]client|torch[/\\]hub)\.py\"|"
                           r", in (?:create_connection|_new_conn|urlopen|urlretrieve|\w*download\w*|from_pretrained|"
                           r"load_state_dict_from_url)\s*$")
"""A traceback frame of an HTTP client or a download (its file: urllib3, requests, urllib.request, torch.hub, the
hub client; or its function: a socket connect's `create_connection`, `urlopen`, a `download`, `from_pretrained`)."""


def _fetch_failed(kept: list[Kept], i: int, rule: Rule) -> Rule:
    """A connect failure that a network rule reads (the infrastructure's: a peer or the fabric) raised in an HTTP
    client's or a download's frame is the run's download never reaching its server: the machine's network access,
    the script's (FETCH_FAILED), as the client's own summary (`Max retries exceeded ... NewConnectionError`) is.
    Read off the nearest frame above the exception; a collective's or the store's connect keeps its rule."""
    if rule.category != "infrastructure" or not EXCEPTION.match(kept[i].text) or not _CONNECT_FAILED.search(kept[i].text):
        return rule
    for k in reversed(kept[max(0, i - 3):i]):
        if _FRAME.search(k.text):
            return _FETCH_FAILED if _CLIENT_FRAME.search(k.text) else rule
    return rule


_UNHANDLED_CUDA = re.compile(r"(?i)unhandled cuda error")
_INIT_FRAME = re.compile(r"\b(?:init_process_group|init_parallel_env|_init_parallel_ctx|ncclCommInit\w*|"
                         r"distributedInit|initDistributed|init_distributed\w*)\b")
"""A frame (Python's or a native stack trace's) of a process group's set-up: torch's, Paddle's, flashlight's
(`fl::distributedInit()`), NCCL's communicator creation."""
_INIT_SPAN = 12


def _init_cuda_failed(c: Compressed, k: Kept, rule: Rule) -> Rule:
    """NCCL's `unhandled cuda error` (a CUDA call NCCL made failed) where the frames within _INIT_SPAN lines of it
    (the traceback above, a native stack trace below; kept lines and the log's end) are the process group's
    set-up: no collective has run, so the machine's CUDA set-up, not a GPU that faulted (NCCL_INIT_CUDA). Without
    such a frame it keeps the GPU-fault rule."""
    if rule.type != "CUDAError" or rule.category != "infrastructure" or not _UNHANDLED_CUDA.search(k.text):
        return rule
    near = [x.text for x in (*c.kept, *c.tail) if abs(x.line_no - k.line_no) <= _INIT_SPAN]
    return _NCCL_INIT_CUDA if any(_INIT_FRAME.search(t) for t in near) else rule


_LOCAL_PEER = 11
"""Where a connection to a process of the same job on this host ranks: below a report that a process was killed
(the shell's `Killed`, 12), above a launcher's exit code (10)."""
_MP_FRAME = re.compile(r"[/\\]multiprocessing[/\\](?:connection|resource_sharer|queues|reduction)\.py\"")
_PEER_GONE = re.compile(r"ConnectionResetError|BrokenPipeError|Connection reset by peer|Broken pipe")


def _local_peer(kept: list[Kept], i: int, rule: Rule) -> bool:
    """A connection reset or a broken pipe raised in the standard library's multiprocessing (a Connection's recv, the
    resource sharer a DataLoader passes tensors through): the peer is a process of the same job on this host (a
    data-loader worker, the main process), and the reset is what its death looks like from here. The kill, where the
    log holds it (the shell's `Killed`), is the cause; read off the nearest frame above the exception."""
    if rule.category != "infrastructure" or not EXCEPTION.match(kept[i].text) or not _PEER_GONE.search(kept[i].text):
        return False
    for k in reversed(kept[max(0, i - 3):i]):
        if _FRAME.search(k.text):
            return bool(_MP_FRAME.search(k.text))
    return False


_LEVELLED = re.compile(r"\[([WEF])(?:\d{4} [\d:.]+(?: +\d+)?)?\s+(?:[^\]\s]*/)?([\w.-]+\.(?:cpp|cc|c|h|hpp|py)):\d+\]")
"""A glog-style line of a native component (c10d's `[W socket.cpp:601]`, `[E1120 12:00:00.1 42 .../socket.cpp:860]`):
its level and the source file that wrote it."""


def _error_after_warning(cands: dict[int, _Cand], best: _Cand) -> _Cand:
    """Where the root cause is a native component's warning-level line and the same source file later wrote an
    error-level line that a rule reads as another failure (c10d warns that a host name does not resolve, then fails
    the connect to it), the error is where the run failed and names the root line; the warning says why, and its
    diagnosis (type, category, restart, mitigation) stays. An error line of the warning's own type (c10d's `failed to
    listen on any local network address` after `failed to bind ... Address already in use`) says the same failure
    less exactly: the warning stays the root line."""
    w = _LEVELLED.search(best.finding.line)
    if w is None or w.group(1) != "W":
        return best
    for x in sorted(cands.values(), key=lambda x: x.finding.line_no):
        e = _LEVELLED.search(x.finding.line)
        if (x.finding.line_no > best.finding.line_no and e and e.group(1) in "EF" and e.group(2) == w.group(2)
                and x.rule.type != best.rule.type and x.priority <= best.priority):
            x.rule, x.priority, x.via = best.rule, best.priority, best.via
            x.finding.type, x.finding.category = best.finding.type, best.finding.category
            return x
    return best


def _backtrace_only(c: Compressed) -> dict[int, _Cand]:
    """Where no other line names the failure, the C++ frames a rule names: a log (or the excerpt of it that was
    posted) that holds only a backtrace, without the message above it, still says where it was raised, and the
    raising function can name the failure (the NCCL watchdog's `WorkNCCL::checkTimeout` frame: a collective timed
    out). Frames stay out wherever any other line is a candidate (the message states the error; the frames are
    where it was raised). Only rules that read a message: a generic exception class in a C++ name is no error."""
    out: dict[int, _Cand] = {}
    for i, k in enumerate(c.kept):
        if k.error and _CXX_FRAME.match(k.text):
            rule = match_line(k.text)
            if rule is not None and not rule.blame:
                out[i] = _Cand(rule, _finding(rule, rule.category, k), rule.priority)
    return out


def _after_device_assert(cands: dict[int, _Cand]) -> None:
    """The CUDA errors after the first device-side assert rank just below it: its consequences (`_DEVICE_ASSERT`)."""
    at = min((i for i, x in cands.items() if _DEVICE_ASSERT.search(x.finding.line)), default=None)
    if at is None:
        return
    for i, x in cands.items():
        if i > at and x.rule.type == "CUDAError":
            x.priority = min(x.priority, cands[at].priority - 1)


_TB_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:)?((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s+\S.*)?\s*$")
"""An exception line by its shape alone (`data.ShardCorrupt: shard 17 has a bad header`, `tok.VocabMissing`): a
class name, optionally module-qualified, then its message."""
_NOT_RAISED = frozenset(("Traceback", "KeyboardInterrupt", "GeneratorExit", "SystemExit"))
_UNCAUGHT = next(r for r in GENERIC if r.type == "UncaughtException")
_TRACEBACK_SPAN = 300
"""Log lines after a `Traceback (most recent call last):` line within which its exception line is looked for."""


def _ended_tracebacks(c: Compressed, cands: dict[int, _Cand]) -> None:
    """The exception line that ends a traceback, where no rule names it (its class ends in neither Error nor
    Exception: `data.ShardCorrupt: ...`): a candidate as an uncaught exception is (39), its category the nearest
    frame's above it (a library's: the framework's; else the script's). A worker's own exception then outranks the
    launcher's symptom of it (ChildFailed, 10) instead of leaving the wrapper as the answer. The shape: the line
    right under a traceback's code line (indented, not a frame), within _TRACEBACK_SPAN lines of `Traceback`."""
    start = None
    for i, k in enumerate(c.kept):
        if "Traceback (most recent call last)" in k.text:
            start = k.line_no
            continue
        if start is None or k.line_no - start > _TRACEBACK_SPAN or i in cands or i == 0:
            continue
        prev, m = c.kept[i - 1], _TB_EXCEPTION.match(k.text)
        code = prev.line_no == k.line_no - 1 and prev.text[:1].isspace() and not _FRAME.search(prev.text)
        if m is None or not code or m.group(1).split(".")[-1] in _NOT_RAISED:
            continue
        frame = next((f for x in reversed(c.kept[:i]) if (f := _FRAME.search(x.text))), None)
        category = whose(frame.group(1), k.text.partition(":")[2].strip()) if frame else "script"
        cands[i] = _Cand(_UNCAUGHT, _finding(_UNCAUGHT, category, k), _UNCAUGHT.priority)
        start = None


def _follow_chains(kept: list[Kept], cands: dict[int, _Cand]) -> set[int]:
    """Each wrapper yields to the innermost cause of its chain (tasks/diagnosis/chains.py): the cause competes
    with the wrapper's standing when that is higher, and a cause line no rule names takes the wrapper's rule.
    Returns the wrappers, which stay evidence but are not the root cause."""
    link = links(kept, set(cands))
    wrappers: set[int] = set()
    for w in sorted(link):
        cause = innermost(w, link)
        if w not in cands or cause == w:
            continue
        wc = cands[w]
        if cause not in cands:
            f = _finding(wc.rule, wc.finding.category, kept[cause], wc.finding.rank, wc.finding.node)
            cands[cause] = _Cand(wc.rule, f, wc.priority, "chain")
        cc = cands[cause]
        cc.priority, cc.via = max(cc.priority, wc.priority), "chain"
        wrappers.add(w)
    return wrappers


def _divergence(c: Compressed, cands: dict[int, _Cand]) -> None:
    """The line where the loss turned non-finite for good, as a candidate (tasks/diagnosis/progress.py)."""
    if c.divergence is None:
        return
    i = next((i for i, k in enumerate(c.kept) if k.line_no == c.divergence), None)
    if i is not None and (i not in cands or cands[i].priority < DIVERGENCE.priority):
        cands[i] = _Cand(DIVERGENCE, _finding(DIVERGENCE, DIVERGENCE.category, c.kept[i]), DIVERGENCE.priority,
                         "progress")


def _garbled_copies(cands: dict[int, _Cand], wrappers: set[int]) -> set[int]:
    """The lines that yield to the clean exception line of a failure whose copies interleaved ranks garbled: where a
    failure type's candidates of one standing include a glued copy (`_GLUED`) and a clean exception line (as the
    interpreter printed it while ending the run), the others of that standing (the glued copies and the fragments
    written among them) are evidence. Where nothing is garbled the earliest copy stands, as before. A clean cause
    found through a chain keeps its place."""
    def raised(i: int, x: _Cand) -> bool:
        return i not in wrappers and bool(EXCEPTION.match(x.finding.line)) and not _GLUED.search(x.finding.line)

    glued = {(x.rule.type, x.priority) for x in cands.values() if _GLUED.search(x.finding.line)}
    kinds = {(x.rule.type, x.priority) for i, x in cands.items() if raised(i, x)} & glued
    return {i for i, x in cands.items()
            if (x.rule.type, x.priority) in kinds and not raised(i, x) and (x.via == "line" or _GLUED.search(x.finding.line))}


def _survived(c: Compressed, cands: dict[int, _Cand], out: set[int]) -> set[int]:
    """The lines the run survived, when a failure (not a launcher's symptom; the scheduler's time limit counts)
    follows them: a line that says the program carried on (`_CARRIED_ON`, `_SHELL_WENT_ON`), and a warning
    (`_WARNING`) after which the run printed a finite loss. A raised exception ended its process, whatever its message
    says. A line logged at info or debug level (`_INFO`) yields to a raised exception after it (jax's "Unable to
    initialize backend 'tpu': ... cannot open shared object file" at INFO, before the XlaRuntimeError that ended the
    run)."""
    def carried_on(line: str) -> bool:
        return bool(_CARRIED_ON.search(line)) and not EXCEPTION.match(line) or bool(_SHELL_WENT_ON.search(line))

    fatal = [x.finding.line_no for i, x in cands.items() if i not in out and (
        x.priority >= SYMPTOM or x.rule.type == "TimeLimit") and not carried_on(x.finding.line)]
    last = max(fatal, default=0)
    raised = max((x.finding.line_no for i, x in cands.items() if i not in out and EXCEPTION.match(x.finding.line)
                  and not _INFO.search(x.finding.line)), default=0)
    return {i for i, x in cands.items() if x.via == "line" and (
        (x.finding.line_no < raised and _INFO.search(x.finding.line)) or x.finding.line_no < last and (
            carried_on(x.finding.line) or (_WARNING.search(x.finding.line) and not EXCEPTION.match(x.finding.line)
                                           and (c.last_trained or 0) > x.finding.line_no)))}


def _earlier_runs(c: Compressed, cands: dict[int, _Cand], out: set[int]) -> set[int]:
    """The lines of earlier runs, where several runs were appended to one log: the log's first line printed again
    (`Compressed.restarts`) right after a run that ended in an uncaught exception (its last failure line is the
    interpreter's exception line). The last run's failure ended the log; the earlier runs' are history. A first
    line printed again after other lines (a second node's copy of a launcher's banner) is no restart."""
    at = sorted((x.finding.line_no, x.finding.line) for i, x in cands.items() if i not in out)
    nos = [n for n, _ in at]
    for b in sorted(c.restarts, reverse=True):
        k = bisect_left(nos, b)  # at[k - 1]: the last failure line before the restart
        if 0 < k and bisect_right(nos, b) < len(nos) and EXCEPTION.match(at[k - 1][1]):
            return {i for i, x in cands.items() if x.finding.line_no < b}
    return set()


def _pick(c: Compressed, cands: dict[int, _Cand], wrappers: set[int]) -> _Cand:
    """The root cause: the strongest candidate that is not a wrapper of another, not a garbled copy of a clean
    exception line, not one the run survived and not an earlier run's."""
    out = wrappers | _garbled_copies(cands, wrappers)
    out |= _survived(c, cands, out)
    out |= _earlier_runs(c, cands, out)
    live = {i: x for i, x in cands.items() if i not in out} or {i: x for i, x in cands.items() if i not in wrappers}
    if c.trained_until is not None:  # what the run went on training after did not end it (progress.SURVIVED)
        live = {i: x for i, x in live.items() if x.finding.line_no > c.trained_until} or live
    best = max(live.values(), key=_order)
    root_block_at = max((k.line_no for k in c.kept if "Root Cause" in k.text), default=None)
    if best.rule.type == "ChildFailed" and root_block_at is not None:  # torchrun names the first failure after it
        best = next((x for x in cands.values() if x.rule.type == "ChildFailed" and x.finding.line_no > root_block_at),
                    best)
    f = best.finding
    if f.node is None and f.rank is not None:  # the node of the root rank, from any other line that names both
        f.node = next((x.finding.node for x in cands.values() if x.finding.rank == f.rank and x.finding.node), None)
    return best


def _learned(c: Compressed, base: dict) -> Diagnosis | None:
    """The learned fallback's answer for a log no rule explains, or None (below its threshold, or no model)."""
    from tasks.diagnosis.fallback import Fallback

    model = Fallback.load()
    lines = [(k.line_no, k.text) for k in c.kept if k.error]
    v = model.predict(lines) if model is not None and lines else None
    if v is None:
        return None
    return Diagnosis(category=v.category, type=v.type, root_cause_line=v.line, line_no=v.line_no,
                     rank=rank_of(v.line) if v.line else None,
                     node=_first(_NODE, v.line) if v.line else None, restartable=v.restartable,
                     mitigation=f"no rule matched; this log is most like the labelled {v.neighbour} "
                                f"(similarity {v.confidence:.2f}): check the line, and add a rule if it holds",
                     evidence=[], source="learned", confidence=v.confidence, **base)


def _agent(c: Compressed, agent: AgentConfig, base: dict) -> Diagnosis | None:
    """The LLM agent's answer (and its rule learned), or None when it gives no accepted verdict."""
    from tasks.diagnosis.agent import ask, learn

    verdict = ask(agent, [k.text for k in c.kept])
    if verdict is None:
        return None
    learn(verdict)
    k = next(k for k in c.kept if verdict.line in k.text)
    return Diagnosis(category=verdict.category, type=verdict.type, root_cause_line=k.text.strip(), line_no=k.line_no,
                     rank=rank_of(k.text), node=_first(_NODE, k.text), restartable=verdict.restartable,
                     mitigation=verdict.mitigation, evidence=[], source="agent", **base)


_RAISED = re.compile(r"^\s*raise\s+((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*))\b")
TRUNCATED_CONFIDENCE = 0.5
"""The confidence of an answer read off a traceback cut before its exception line: the frames say where it failed,
not what failed."""


def _truncated_traceback(c: Compressed, base: dict) -> Diagnosis | None:
    """Where no line names a failure and the log ends inside a traceback (a thread's excerpt, or a log a crash cut
    before the exception line): its last frame's code line, with the category its frame gives (a file under
    site-packages: the framework's; any other: the script's) and the type of the exception a `raise` there names
    where the rules know it. None where the log goes on after the frame (at most two lines, a quote's closing
    marks, may follow it) or holds no traceback."""
    kept = c.kept
    if len(kept) < 2 or c.lines - kept[-1].line_no > 2 or not any("Traceback (most recent" in k.text for k in kept):
        return None
    code, frame = kept[-1], kept[-2]
    where = _FRAME.search(frame.text)
    if where is None or frame.line_no != code.line_no - 1 or _FRAME.search(code.text) or not code.text.strip():
        return None
    category = whose(where.group(1))
    m = _RAISED.match(code.text)
    rule = match_line(f"{m.group(2)}: ") if m else None
    return Diagnosis(
        category=category, type=rule.type if rule else "TruncatedTraceback", root_cause_line=code.text.rstrip(),
        line_no=code.line_no, rank=rank_of(code.text), node=None, restartable=bool(rule and rule.restartable),
        mitigation="the log ends inside a traceback, before its exception line (an excerpt, or a log cut by a "
                   f"crash): it failed at this line of {where.group(1)}; rerun it (or find the full log) to read "
                   "the exception" + (f"; for a {rule.type}: {rule.mitigation}" if rule else ""),
        evidence=[], via="truncated", confidence=TRUNCATED_CONFIDENCE, **base)


def _last_error(c: Compressed) -> Kept | None:
    """The log's last error line (of its kept lines and its end) that states something: not a traceback's header,
    frame or code line, a C++ backtrace frame, an info or warning line; where an unknown answer starts reading."""
    lines = {k.line_no: k for k in c.kept if k.error}
    lines.update({k.line_no: k for k in c.tail if k.error and k.line_no not in lines})
    for n in sorted(lines, reverse=True):
        t = lines[n].text
        if t.strip() and "Traceback (most recent" not in t and not (
                _SOURCE.match(t) or _FRAME.search(t) or _CXX_FRAME.match(t) or _NCCL_INFO.match(t) or _INFO.search(t)
                or _WARNING.search(t)):
            return lines[n]
    return None


def _numbered(c: Compressed) -> dict[int, str]:
    """The kept lines and the log's end, by line number."""
    lines = {k.line_no: k.text for k in c.kept}
    for k in c.tail:
        lines.setdefault(k.line_no, k.text)
    return lines


def _named(c: Compressed, base: dict) -> Diagnosis | None:
    """The failure the log names by its shape (tasks/diagnosis/named.py: an exception no rule knows, a native fatal
    check, a signal or exit status a launcher reports, an ERROR log line), read off the kept lines and the log's
    end, at NAMED_CONFIDENCE; None where no line has one of those shapes."""
    lines = _numbered(c)
    x = named_failure(sorted(lines.items()))
    if x is None:
        return None
    return Diagnosis(category=x.category, type=x.type, root_cause_line=x.line, line_no=x.line_no,
                     rank=rank_of(x.line), node=_first(_NODE, x.line), restartable=x.restartable,
                     mitigation=x.mitigation, evidence=[], via="named", confidence=NAMED_CONFIDENCE, **base)


def diagnose_compressed(c: Compressed, log: str = "", agent: AgentConfig | None = None,
                        use_fallback: bool = True) -> Diagnosis:
    """The diagnosis of a compressed log: the rules (with cause chains and the progress lines); for a log no rule
    explains, the learned fallback (when it is confident enough), then the LLM agent when `agent` is given; else
    `unknown`."""
    cands = _candidates(c, learned_rules())
    if cands:
        _ended_tracebacks(c, cands)
    wrappers = _follow_chains(c.kept, cands)
    _divergence(c, cands)
    cands = cands or _backtrace_only(c)
    base = {"log": log, "lines": c.lines, "kept_lines": len(c.kept), "compression_ratio": c.ratio,
            "templates": c.templates}
    if not cands:
        d = _truncated_traceback(c, base)
        d = d or (_learned(c, base) if use_fallback else None)
        d = d or (_agent(c, agent, base) if agent is not None else None)
        d = d or _named(c, base)
        last = _last_error(c)
        return d or Diagnosis(
            category="unknown", type="Unknown", root_cause_line=last.text.rstrip() if last else None,
            line_no=last.line_no if last else None, rank=None, node=None, restartable=False, evidence=[], **base,
            mitigation="no rule matched: read the kept lines (`frenzy diagnose --show`; the line given is the log's "
                       "last error line, where to start); a person decides, and a rule for it can be added to "
                       "tasks/diagnosis/rules.py")
    best = _error_after_warning(cands, _pick(c, cands, wrappers))
    _cut_remote(c, best, base)
    _reported_before_bare_raise(c, best)
    evidence = [x.finding for _, x in sorted(cands.items()) if x is not best][:MAX_EVIDENCE]
    f = best.finding
    restartable, mitigation = best.rule.restartable, best.rule.mitigation
    if _desynced_at_phase_end(c, cands, best):
        f.category, restartable, mitigation = "script", False, _DESYNC
    return Diagnosis(category=f.category, type=best.rule.type, root_cause_line=_as_written(c, f), line_no=f.line_no,
                     rank=f.rank,
                     node=f.node, restartable=restartable, mitigation=mitigation, evidence=evidence, via=best.via,
                     **base)


def _cut_remote(c: Compressed, best: _Cand, base: dict) -> None:
    """A wrapper of an exception re-raised from another process (`Caught ValueError in DataLoader worker process 0`
    above the worker's `Original Traceback`) whose inner traceback the log cuts before its exception line: the
    inner traceback's last code line, where it is a `raise` statement (`raise ValueError('fail to read ...')` in
    the dataset's code), states the exception the worker raised, as in any traceback a log cuts
    (`_truncated_traceback`), and takes the root line; the wrapper's diagnosis stays (it says what kind of failure
    it re-raised). A traceback cut at a frame that raises nothing (torch's own `fetcher.fetch(index)`) says less
    than the wrapper, which keeps the line."""
    f = best.finding
    if not any(REMOTE.search(k.text) and k.line_no > f.line_no for k in c.kept):
        return
    cut = _truncated_traceback(c, base)
    if cut and cut.line_no and cut.line_no > f.line_no and _RAISED.match(cut.root_cause_line or ""):
        f.line, f.line_no = (cut.root_cause_line or "").strip(), cut.line_no


_LEVELLED_ERROR = re.compile(r"(?:^|[\s\[|:])(?:ERROR|CRITICAL|FATAL)(?=[\s\]|:]|$)")
"""A line logged at ERROR level or above, wherever the format puts the level (`2019-06-12 16:42:49,964 CRITICAL
name: ...`, `[ERROR] ...`, `| ERROR |`)."""
_REPORTED_SPAN = 5
"""Log lines above a traceback's header within which the error its bare `raise` stands for is looked for."""


def _reported_before_bare_raise(c: Compressed, best: _Cand) -> None:
    """A bare `raise` with no exception being handled (`RuntimeError: No active exception to reraise`) says only
    that the program's error path re-raised nothing; the failure is what that path reported just before: the
    nearest line logged at ERROR level or above within _REPORTED_SPAN lines above the traceback's header takes the
    root line (`CRITICAL wav_generation: The vocoder world is not supported yet!`); the diagnosis stays (the
    script's, not restartable). Where no such line precedes the traceback, the bare raise keeps the line."""
    f = best.finding
    if best.rule.type != "BareReraise":
        return
    lines = _numbered(c)
    header = max((n for n, t in lines.items() if n < f.line_no and "Traceback (most recent call last)" in t),
                 default=None)
    if header is None:
        return
    reported = [n for n, t in lines.items() if header - _REPORTED_SPAN <= n < header and _LEVELLED_ERROR.search(t)]
    if reported:
        f.line_no = max(reported)
        f.line = lines[f.line_no].strip()


def _as_written(c: Compressed, f: Finding) -> str:
    """The root-cause line as the log wrote it: its indentation kept (TensorFlow's `  (0) Resource exhausted: ...`
    under its summary, a traceback's `    raise KeyError(...)`, a continuation line's leading space), only its end
    trimmed. The finding's own copy is stripped for matching; the answer quotes the log."""
    k = next((k for k in c.kept if k.line_no == f.line_no), None)
    return k.text.rstrip() if k is not None and k.text.strip() == f.line else f.line


def _desynced_at_phase_end(c: Compressed, cands: dict[int, _Cand], best: _Cand) -> bool:
    """Whether a collective timeout (the root cause, no failure above it) came right where the run left its
    training loop: the line just before the first timeout says training ended or an evaluation began
    (`_PHASE_END`). A network or node fault strikes whenever it strikes; ranks that time out exactly at the phase
    change are ranks that ran different code there (one evaluates or saves while the others wait in a collective,
    a post-training barrier some ranks never reach). That is the script's, and a restart hangs at the same point.
    Only the lines just above the timeout count (the compressor's context): a phase change long before it says
    nothing about it."""
    if best.rule.type != "NCCLTimeoutError":
        return False
    first = min(x.finding.line_no for x in cands.values() if x.rule.type == "NCCLTimeoutError")
    return any(first - 2 <= k.line_no < first and _PHASE_END.search(k.text) for k in c.kept)


def check_log(path: Path | str) -> Path:
    """The log file at `path`, or an error that says what to give instead: a directory, a FIFO or device (reading
    one could block forever) and a binary file (a library, an executable: any rule would be a guess) are refused.
    Text in any encoding is read (bytes that are not UTF-8 are replaced)."""
    p = regular_file(path, "log")
    with open_user_file(p, "log", limit=1 << 62) as f:  # any length: compress() streams it
        head = f.read(1 << 16)
    if looks_binary(head):
        raise UserFileError(f"{p} looks binary (NUL or control bytes), not a training log; give the text log the run "
                            "wrote (e.g. RUN_DIR/train.log)")
    return p


def diagnose(source: Path | str | bytes, context: int = 2, agent: AgentConfig | None = None,
             use_fallback: bool = True) -> Diagnosis:
    """Diagnose a log file (or its bytes); `agent` (see tasks/diagnosis/agent.py) for logs no rule explains."""
    c = compress(source if isinstance(source, bytes) else check_log(source), context=context)
    return diagnose_compressed(c, log="<bytes>" if isinstance(source, bytes) else str(source), agent=agent,
                               use_fallback=use_fallback)
