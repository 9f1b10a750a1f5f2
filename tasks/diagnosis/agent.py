"""The optional LLM agent: diagnoses a log no rule explains, and teaches the rule base what it found.

Off unless configured: `FRENZY_DIAGNOSIS_LLM_URL` (the base URL of any OpenAI-compatible API, e.g.
`http://localhost:8000/v1` for a local vLLM or llama.cpp server), `FRENZY_DIAGNOSIS_LLM_MODEL`, optionally
`FRENZY_DIAGNOSIS_LLM_KEY` and `FRENZY_DIAGNOSIS_LLM_SAMPLES` (default 3). It is asked only when no rule matches,
with the compressed log (the kept lines), for one JSON object naming the failure type (one of the rule base's),
the root-cause line (quoted from the log), whether a restart can help and what to do. Self-consistency: several
samples, and an answer is accepted only when a strict majority agree on the type and its line is really in the
log. An accepted diagnosis becomes a learned rule (the line with its numbers generalised) in
`$FRENZY_HOME/diagnosis-rules.jsonl`, which the rule base reads, so the same failure is matched without the agent
next time.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

from tasks.diagnosis.rules import RULES, Rule


class AgentConfig(BaseModel):
    url: str
    model: str
    api_key: str | None = None
    samples: int = 3
    timeout_s: float = 60.0
    total_timeout_s: float = 90.0
    """All samples together: an endpoint that never answers costs at most this, not samples x timeout_s."""


class AgentVerdict(BaseModel):
    type: str
    category: str
    line: str
    restartable: bool
    mitigation: str
    votes: int
    samples: int


def config_from_env() -> AgentConfig | None:
    url = os.environ.get("FRENZY_DIAGNOSIS_LLM_URL")
    if not url:
        return None
    return AgentConfig(url=url.rstrip("/"), model=os.environ.get("FRENZY_DIAGNOSIS_LLM_MODEL", "default"),
                       api_key=os.environ.get("FRENZY_DIAGNOSIS_LLM_KEY"),
                       samples=int(os.environ.get("FRENZY_DIAGNOSIS_LLM_SAMPLES", "3")))


def learned_path() -> Path:
    from tasks.pathvars import frenzy_home
    return frenzy_home() / "diagnosis-rules.jsonl"


_TYPES = {r.type: r for r in RULES}


def _prompt(lines: list[str]) -> list[dict]:
    types = ", ".join(f"{t} ({r.category})" for t, r in _TYPES.items())
    return [{"role": "system", "content":
             "You diagnose failed LLM training jobs from their logs. Reply with one JSON object and nothing else: "
             '{"type": ..., "line": ..., "restartable": true|false, "mitigation": ...}. "type" is one of: '
             f"{types}. \"line\" is the root-cause line copied exactly from the log (the first fault, not its "
             "symptoms on other ranks)."},
            {"role": "user", "content": "\n".join(lines[-300:])}]


_NOT_A_CAUSE = re.compile(r"^\s*(?:Traceback \(most recent call last\)|File \"|During handling|The above exception|"
                          r"raise\b|frame #|\^+$)")


def acceptable_line(line: str, lines: list[str]) -> bool:
    """The agent's quoted line is evidence only when it is a whole error line of the log: at least 20 characters,
    holding an error keyword, not a traceback's frame or header, and equal to (not a piece of) a kept line."""
    from tasks.diagnosis.rules import ERROR_KEYWORDS

    low = line.lower().encode()
    return (len(line) >= 20 and not _NOT_A_CAUSE.match(line) and any(k in low for k in ERROR_KEYWORDS)
            and any(line == ln.strip() or (len(line) >= 0.6 * len(ln.strip()) and line in ln) for ln in lines))


def _ask_once(cfg: AgentConfig, lines: list[str], timeout: float | None = None) -> dict | None:
    body = json.dumps({"model": cfg.model, "messages": _prompt(lines), "temperature": 0.7}).encode()
    req = urllib.request.Request(f"{cfg.url}/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout or cfg.timeout_s) as resp:
            content = json.loads(resp.read())["choices"][0]["message"]["content"]
        m = re.search(r"\{.*\}", content, re.S)
        return json.loads(m.group(0)) if m else None
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def ask(cfg: AgentConfig, lines: list[str]) -> AgentVerdict | None:
    """Ask `cfg.samples` times; the majority type wins if more than half agree and its line is in the log."""
    import time

    answers = []
    deadline = time.monotonic() + cfg.total_timeout_s
    for _ in range(max(1, cfg.samples)):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        a = _ask_once(cfg, lines, timeout=min(cfg.timeout_s, left))
        if not a or a.get("type") not in _TYPES:
            continue
        line = str(a.get("line", "")).strip()
        if not acceptable_line(line, lines):  # an invented line, a fragment or a context line is no evidence
            continue
        answers.append({**a, "line": line})
    if not answers:
        return None
    kind, votes = Counter(a["type"] for a in answers).most_common(1)[0]
    if votes * 2 <= max(1, cfg.samples):
        return None
    a = next(x for x in answers if x["type"] == kind)
    base = _TYPES[kind]
    return AgentVerdict(type=kind, category=base.category, line=a["line"],
                        restartable=base.restartable if base.category == "infrastructure"
                        else bool(a.get("restartable", base.restartable)),
                        mitigation=re.sub(r"[\x00-\x1f\x7f]", " ", str(a.get("mitigation") or base.mitigation))[:500],
                        votes=votes, samples=cfg.samples)


def _generalise(line: str) -> str:
    """A pattern for lines like this one: the rank prefix dropped, numbers and hex as wildcards."""
    text = re.sub(r"^\s*\[(?:rank|default)\d+\]:\s*", "", line.strip())
    out = re.escape(text)
    return re.sub(r"(?:0x[0-9a-fA-F]+|\d+)", lambda m: r"(?:0x[0-9a-fA-F]+|\d+)", out)


def matches_healthy_lines(pattern: str) -> bool:
    """Whether the pattern matches a line of a healthy run (start-up chatter, metrics, evals, benign warnings, as
    the generated corpus writes them): such a rule would fire on every log."""
    import random

    from tasks.diagnosis.corpus import _noise, _startup

    rng = random.Random(32)
    rx = re.compile(pattern)
    lines = _startup(rng, 8, ["node-a", "node-b"], 4) + _noise(rng, 8, 0, 400)
    return any(rx.search(ln) for ln in lines)


def contradicts_real_logs(pattern: str, category: str) -> str | None:
    """The id of a labelled real log (issue 29's benchmark, where present) whose root-cause line the pattern
    matches but whose category differs, else None."""
    from tasks.diagnosis.realbench import REAL, load

    if not (REAL / "manifest.jsonl").is_file():
        return None
    rx = re.compile(pattern)
    return next((lg.id for lg in load() if lg.category != category and rx.search(lg.root_line)), None)


def learn(v: AgentVerdict) -> Rule | None:
    """Save the accepted diagnosis as a rule and return it; None when the rule would be unsafe (see
    `rules.safe_pattern`) or contradicts a labelled real log. The rule ranks below every built-in one."""
    from tasks.diagnosis.rules import LEARNED_PRIORITY, safe_pattern

    base = _TYPES[v.type]
    pattern = _generalise(v.line)
    if not safe_pattern(pattern) or matches_healthy_lines(pattern) or contradicts_real_logs(pattern, base.category):
        return None
    restartable = base.restartable if base.category == "infrastructure" else v.restartable
    rule = Rule(v.type, base.category, pattern, LEARNED_PRIORITY, restartable, v.mitigation)
    path = learned_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"type": v.type, "category": base.category, "pattern": rule.pattern,
                            "priority": LEARNED_PRIORITY, "restartable": restartable, "mitigation": v.mitigation,
                            "votes": v.votes, "samples": v.samples}) + "\n")
    return rule
