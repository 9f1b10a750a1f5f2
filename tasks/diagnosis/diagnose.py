"""Root-cause diagnosis of a failed run's log: compress, match the rule base, rank, attribute.

`diagnose(log)` returns a `Diagnosis`: the failure `type` and `category` of the highest-priority matching line
(the earliest among equals), the line itself, the rank and node it came from when the log says (rank prefixes of
torch and torchrun, torchrun's failure summary, dmesg host prefixes), whether a restart can help, a mitigation,
and every other matching line as `evidence` (the symptoms). No rule matching gives type `Unknown`.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from tasks.diagnosis.agent import AgentConfig, ask, learn
from tasks.diagnosis.compress import Compressed, compress
from tasks.diagnosis.rules import RULES, Rule, learned_rules
from tasks.userfiles import UserFileError, looks_binary, open_user_file, regular_file

_RANK = [re.compile(p) for p in (
    r"\[(?:rank|Rank)\s*(\d+)\]", r"\[default(\d+)\]", r"\[(?:PG [^\]]*?)?Rank (\d+)\]", r"\brank\s*[:=]?\s*(\d+)\b",
    r"\(local_rank: (\d+)\)")]
_NODE = [re.compile(p) for p in (
    r"^\s*host\s*:\s*(\S+)",  # torchrun's failure summary
    r"^(\S+) kernel: ",  # dmesg lines collected with the log
    r"^([A-Za-z][\w.-]*):\d+:\d+ \[\d+\] ",  # NCCL's host:pid:tid [device] prefix
    r"\bon (?:node|host) ([A-Za-z0-9_.-]+)", r"\bnode[= ]([A-Za-z0-9_.-]+)")]
_SUMMARY_HOST = re.compile(r"^\s*host\s*:\s*(\S+)")
_STAMP = re.compile(r"\[[EWFI](\d{4}) (\d\d:\d\d:\d\d\.\d+)")  # glog/c10d: [E0626 05:06:30.929...
_FRAME = re.compile(r'File "([^"]+)", line \d+')
_GENERIC = {"KeyError", "TypeError", "ValueError", "AttributeError", "IndexError", "NameError", "AssertionError"}
_LIBRARY = re.compile(r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python\d")
_SOURCE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:raise\b|File \")")
"""A traceback's source and frame lines: the `raise` statement above an exception is not the exception."""
MAX_EVIDENCE = 100
"""Evidence entries kept in a diagnosis: a million identical error lines are one cause, not a million."""
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")


class Finding(BaseModel):
    type: str
    category: str
    line_no: int
    line: str
    rank: int | None
    node: str | None


class Diagnosis(BaseModel):
    """What `frenzy diagnose LOG --json` prints."""

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
    confidence: float | None = None
    """For a learned answer: the cosine similarity to the nearest labelled log (the threshold is calibrated on
    held-out projects)."""


def _first(patterns: list[re.Pattern], text: str) -> str | None:
    for p in patterns:
        m = p.search(text)
        if m:
            return m.group(1)
    return None


def _match(text: str, rules: list[Rule]) -> Rule | None:
    for r in rules:
        if r.regex.search(text):
            return r
    return None


def _blame(kept: list, i: int, category: str) -> str:
    """A generic Python exception (KeyError, ValueError, ...) belongs to the code that raised it: the script's own
    file (script) or a library under site-packages (framework), read off the nearest traceback frame above it."""
    for k in reversed(kept[max(0, i - 3):i]):
        m = _FRAME.search(k.text)
        if m:
            return "framework" if _LIBRARY.search(m.group(1)) else "script"
    return category


def _order(rule: Rule, f: Finding) -> tuple:
    """Highest priority first; among equals the earliest by the log's own timestamps (ranks interleave out of
    order in merged logs), then by position."""
    m = _STAMP.search(f.line)
    return (rule.priority, -int(bool(m)), tuple(-ord(ch) for ch in "".join(m.groups())) if m else (), -f.line_no)


def _learned(c: Compressed, base: dict) -> Diagnosis | None:
    """The learned fallback's answer for a log no rule explains, or None (below its threshold, or no model)."""
    from tasks.diagnosis.fallback import Fallback

    model = Fallback.load()
    lines = [(k.line_no, k.text) for k in c.kept if k.error]
    v = model.predict(lines) if model is not None and lines else None
    if v is None:
        return None
    return Diagnosis(category=v.category, type=v.type, root_cause_line=v.line, line_no=v.line_no,
                     rank=int(r) if v.line and (r := _first(_RANK, v.line)) else None,
                     node=_first(_NODE, v.line) if v.line else None, restartable=v.restartable,
                     mitigation=f"no rule matched; this log is most like the labelled {v.neighbour} "
                                f"(similarity {v.confidence:.2f}): check the line, and add a rule if it holds",
                     evidence=[], source="learned", confidence=v.confidence, **base)


def diagnose_compressed(c: Compressed, log: str = "", agent: AgentConfig | None = None,
                        use_fallback: bool = True) -> Diagnosis:
    """The diagnosis of a compressed log: the rules; for a log no rule explains, the learned fallback (when it is
    confident enough), then the LLM agent when `agent` is given; else `unknown`."""
    rules = RULES + learned_rules()
    findings: list[tuple[Rule, Finding]] = []
    rank_host: dict[int, str] = {}
    host = None
    for k in c.kept:  # torchrun's failure summary: "host : X" then "rank : N" in each block
        h = _SUMMARY_HOST.search(k.text)
        if h:
            host = h.group(1)
        r = _SUMMARY_RANK.search(k.text)
        if r and host:
            rank_host.setdefault(int(r.group(1)), host)
    block_rank: int | None = None
    block_host: str | None = None
    root_block_at: int | None = None  # torchrun names the first observed failure after "Root Cause"
    for i, k in enumerate(c.kept):
        if "Root Cause" in k.text:
            root_block_at = k.line_no
        h = _SUMMARY_HOST.search(k.text)
        if h:
            block_host = h.group(1)
        sr = _SUMMARY_RANK.search(k.text)
        if sr:
            block_rank = int(sr.group(1))
        if not k.error or _SOURCE.match(k.text):
            continue
        rule = _match(k.text, rules)
        if rule is None:
            continue
        rank = _first(_RANK, k.text)
        node = _first(_NODE, k.text)
        rk = int(rank) if rank is not None else None
        if rule.type == "ChildFailed" and rk is None:  # an exitcode line of the summary: its block's rank and host
            rk, node = block_rank, node or block_host
        category = _blame(c.kept, i, rule.category) if rule.type in _GENERIC else rule.category
        findings.append((rule, Finding(type=rule.type, category=category, line_no=k.line_no, line=k.text.strip(),
                                       rank=rk, node=node or (rank_host.get(rk) if rk is not None else None))))
    base = {"log": log, "lines": c.lines, "kept_lines": len(c.kept), "compression_ratio": c.ratio,
            "templates": c.templates}
    if not findings and use_fallback:
        d = _learned(c, base)
        if d is not None:
            return d
    if not findings and agent is not None:
        verdict = ask(agent, [k.text for k in c.kept])
        if verdict is not None:
            learn(verdict)
            k = next(k for k in c.kept if verdict.line in k.text)
            return Diagnosis(category=verdict.category, type=verdict.type, root_cause_line=k.text.strip(),
                             line_no=k.line_no, rank=int(r) if (r := _first(_RANK, k.text)) else None,
                             node=_first(_NODE, k.text), restartable=verdict.restartable,
                             mitigation=verdict.mitigation, evidence=[], source="agent", **base)
    if not findings:
        return Diagnosis(category="unknown", type="Unknown", root_cause_line=None, line_no=None, rank=None, node=None,
                         restartable=False, evidence=[], **base,
                         mitigation="no rule matched: read the kept lines (`frenzy diagnose --show`); a person "
                                    "decides, and a rule for it can be added to tasks/diagnosis/rules.py")
    best_rule, best = max(findings, key=lambda rf: _order(*rf))
    if best_rule.type == "ChildFailed" and root_block_at is not None:
        best_rule, best = next(((r, f) for r, f in findings if r.type == "ChildFailed" and f.line_no > root_block_at),
                               (best_rule, best))
    if best.node is None:  # the node of the root rank, from any other line that names both
        best.node = next((f.node for _, f in findings if f.rank == best.rank and f.node), None) \
            if best.rank is not None else None
    evidence = [f for _, f in findings if f is not best][:MAX_EVIDENCE]
    return Diagnosis(category=best.category, type=best_rule.type, root_cause_line=best.line,
                     line_no=best.line_no, rank=best.rank, node=best.node, restartable=best_rule.restartable,
                     mitigation=best_rule.mitigation, evidence=evidence, **base)


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
