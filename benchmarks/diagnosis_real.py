"""Issue 29's real-log benchmark (issue 45's figures): `frenzy diagnose` (the rules, then the learned fallback) on
failure logs posted in public issue threads, labelled from their threads, split by project
(tasks/diagnosis/realbench.py).

Reports both halves, the test half (projects not in the tune half) first: category accuracy, root-cause line
accuracy, `unknown` rate, restart decision accuracy, per-category precision and recall, per-family precision and
recall (issue 45's four families: realbench.FAMILIES), the time per log, per project and per labelled cause.

    python benchmarks/diagnosis_real.py      # writes benchmarks/results/diagnosis_real.{json,md}
    python benchmarks/diagnosis_real.py --fresh-since REV   # writes benchmarks/results/diagnosis_real_fresh.{json,md}
    python benchmarks/diagnosis_real.py --half tune   # one half, printed only (the tune half while rules change)

`--fresh-since REV` scores only the fresh held-out logs: the test half's logs from projects that the corpus did not
hold at git revision REV (its `manifest.jsonl` there), i.e. logs no rule was ever tuned on and from projects no one
looked at while writing rules.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from functools import partial  # noqa: E402

from tasks.diagnosis.compress import compress  # noqa: E402
from tasks.diagnosis.diagnose import diagnose  # noqa: E402
from tasks.diagnosis.fallback import Fallback  # noqa: E402
from tasks.diagnosis.realbench import CATEGORIES, FAMILIES, RealLog, Score, load, run, score  # noqa: E402

TARGETS = {"category_accuracy": 0.90, "root_line_accuracy": 0.85, "unknown_rate": 0.03, "precision": 0.85}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _half(name: str, s: Score, n_projects: int) -> list[str]:
    ok = (s.category_accuracy >= TARGETS["category_accuracy"] and s.root_line_accuracy >= TARGETS["root_line_accuracy"]
          and s.unknown_rate <= TARGETS["unknown_rate"] and min(s.precision.values()) >= TARGETS["precision"])
    out = [f"## {name} half: {s.n} logs from {n_projects} projects{' (targets met)' if ok else ''}", "",
           "| metric | value | target |", "|---|---|---|",
           f"| category accuracy | {_pct(s.category_accuracy)} | >= 90% |",
           f"| root-cause line | {_pct(s.root_line_accuracy)} | >= 85% |",
           f"| `unknown` | {_pct(s.unknown_rate)} | <= 3% |",
           f"| restart decision right | {_pct(s.restart_accuracy)} | |",
           f"| time per log (mean / p95; compression included, imports not) | {1e3 * s.seconds_per_log:.1f} ms / "
           f"{1e3 * s.seconds_p95:.1f} ms | |"]
    out += [f"| precision / recall, {c} | {s.precision[c]:.2f} / {s.recall[c]:.2f} | precision >= 0.85 |"
            for c in CATEGORIES]
    out += ["", "| family (issue 45) | logs in it | answered as it | precision | recall |", "|---|---|---|---|---|"]
    out += [f"| {f} | {s.families[f].logs} | {s.families[f].said} | {s.families[f].precision:.2f} | "
            f"{s.families[f].recall:.2f} |" for f in FAMILIES]
    out += ["", "| labelled cause | logs | category right | root line right |", "|---|---|---|---|"]
    out += [f"| {t} | {n} | {c} | {r} |" for t, (n, c, r) in s.by_type.items()]
    out += ["", "<details><summary>per project (logs / category right)</summary>", "",
            "| project | logs | right |", "|---|---|---|"]
    out += [f"| {p} | {n} | {c} |" for p, (n, c) in s.by_project.items()]
    return out + ["", "</details>", ""]


def fallback_alone(half: str) -> dict:
    """The learned fallback asked about every log of a half, rules or not: how often it answers, how often right."""
    model = Fallback.load()
    answered = right = root = 0
    logs = load(half)
    for lg in logs:
        v = model.predict([(k.line_no, k.text) for k in compress(lg.path).kept if k.error])
        if v is not None:
            answered += 1
            right += v.category == lg.category
            root += bool(v.line) and lg.root_line.strip() in v.line
    return {"logs": len(logs), "answered": answered, "category_right": right, "root_line_right": root,
            "threshold": model.threshold}


def projects_at(rev: str) -> set[str]:
    """The projects (lower-case) the corpus held at git revision `rev`."""
    text = subprocess.run(["git", "show", f"{rev}:tests/data/diagnosis/real/manifest.jsonl"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout
    return {json.loads(ln)["project"].lower() for ln in text.splitlines() if ln.strip()}


def fresh(rev: str) -> int:
    """The fresh held-out figure: the test half's logs from projects new since `rev`."""
    before = projects_at(rev)
    logs: list[RealLog] = [lg for lg in load("test") if lg.project.lower() not in before]
    s = score(run(logs, diagnose))
    rules_only = score(run(logs, partial(diagnose, use_fallback=False)))
    whole = score(run(load("test"), diagnose))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    head = ["# Diagnosis on fresh held-out logs (issue 45)", "",
            f"`python benchmarks/diagnosis_real.py --fresh-since {rev}` at commit {commit}, "
            f"{datetime.now(UTC):%Y-%m-%d}, {platform.machine()}, Python {platform.python_version()}.", "",
            f"The logs: the test half (realbench.half_of, fixed by project) restricted to projects the corpus did not "
            f"hold at {rev}, so logs that no rule was tuned on, from projects no one read while writing rules. "
            "Their labels were written from the threads by collectors who never saw the rules "
            "(tests/data/diagnosis/real/PROVENANCE.md).", "",
            f"For context, the whole test half at this commit ({whole.n} logs): category "
            f"{_pct(whole.category_accuracy)}, root line {_pct(whole.root_line_accuracy)}, `unknown` "
            f"{_pct(whole.unknown_rate)}.", ""]
    body = _half("fresh held-out", s, len({lg.project for lg in logs}))
    body += [f"Rules alone (no learned fallback): category {_pct(rules_only.category_accuracy)}, root line "
             f"{_pct(rules_only.root_line_accuracy)}, `unknown` {_pct(rules_only.unknown_rate)}.", ""]
    out = REPO / "benchmarks" / "results"
    (out / "diagnosis_real_fresh.md").write_text("\n".join(head + body))
    (out / "diagnosis_real_fresh.json").write_text(json.dumps(
        {"since": rev, "commit": commit, "fresh": asdict(s), "fresh_rules_only": asdict(rules_only),
         "whole_test_half": {k: getattr(whole, k) for k in ("n", "category_accuracy", "root_line_accuracy",
                                                            "unknown_rate")}}, indent=1))
    print("\n".join(head + body))
    return 0


def one_half(half: str) -> int:
    """Score one half and print it, writing no result file: the tune half while rules change, so that the test
    half's figures and misses are not read."""
    logs = load(half)
    outcomes = run(logs, diagnose)
    print("\n".join(_half(half, score(outcomes), len({lg.project for lg in logs}))[:8]))
    if half == "tune":
        for o in outcomes:
            if not (o.category_ok and o.root_ok):
                print(f"miss {o.log.id}: label {o.log.type}/{o.log.category}, got {o.type}/{o.category}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fresh-since", metavar="REV", help="score only the test half's projects new since REV")
    ap.add_argument("--half", choices=("tune", "test"), help="score only this half; print it, write no file")
    args = ap.parse_args(argv)
    if args.fresh_since:
        return fresh(args.fresh_since)
    if args.half:
        return one_half(args.half)
    results, lines = {}, []
    for half in ("test", "tune"):
        logs = load(half)
        rules_only = score(run(logs, partial(diagnose, use_fallback=False)))
        outcomes = run(logs, diagnose)
        s = score(outcomes)
        alone = fallback_alone(half)
        results[f"{half}_rules_only"] = asdict(rules_only)
        results[f"{half}_fallback_alone"] = alone
        results[half] = {**asdict(s), "misses": [
            {"id": o.log.id, "label": [o.log.type, o.log.category], "got": [o.type, o.category], "source": o.source,
             "line": o.root_cause_line} for o in outcomes if not (o.category_ok and o.root_ok)]}
        lines += _half(half, s, len({lg.project for lg in logs}))[:-1]
        lines += [f"Rules alone (no learned fallback): category {_pct(rules_only.category_accuracy)}, root line "
                  f"{_pct(rules_only.root_line_accuracy)}, `unknown` {_pct(rules_only.unknown_rate)}. The learned "
                  f"fallback asked about every log of this half (threshold {alone['threshold']:.3f}): answers "
                  f"{alone['answered']}/{alone['logs']}, category right on {alone['category_right']}, root line on "
                  f"{alone['root_line_right']}.", ""]
    machine = f"{platform.machine()}, {platform.system()}, Python {platform.python_version()}"
    load1 = os.getloadavg()[0]
    head = ["# Diagnosis on real failure logs (issues 29 and 45)", "",
            f"`python benchmarks/diagnosis_real.py` on {machine}, {os.cpu_count()} cores, no GPU, "
            f"{datetime.now(UTC):%Y-%m-%d} (a shared machine, load average {load1:.1f} at the start: the accuracy "
            "figures do not depend on it, the time per log does).", "",
            "Logs posted in public issue threads, labelled from the threads (tests/data/diagnosis/real, "
            "PROVENANCE.md there). Split by project, fixed before any result was read; the rules and the learned "
            "fallback were tuned on the tune half only. The test half (projects not in the tune half) is the figure "
            "to quote.", "",
            "History, honestly: the first 87 logs (34 tune / 53 test) scored 52.8% category, 50.9% root line, "
            "39.6% unknown on their test half with main's rules. After rules were written against those 34 tune "
            "logs, the corpus grew to 150; on the grown test half (84 logs from 63 projects; 31 of the logs new) "
            "the rules scored 79.8% / 79.8% / 14.3% before the second round of tuning, which again looked only at "
            "the tune half's misses, and 96.4% / 91.7% / 2.4% after it. The third round (issue 45) rewrote the rules "
            "around four failure families (cause chains, divergence in progress lines, network faults behind "
            "framework errors, the user's environment and code), written from the families and the 66 tune logs "
            "without opening a test-half log. The corpus then grew to 316 logs (the test half to 169 from 134 projects; "
            "`--fresh-since f90e526` scores its 78 logs from projects new in that batch: 56.4% / 65.4% / 20.5% before "
            "any rule change). The final round of issue 45 changed the rules from the tune half's misses and from a "
            "red team's 70 logs of 67 other projects (not in this corpus), still without opening a test-half log; the "
            "figures below are after it.", ""]
    out = REPO / "benchmarks" / "results"
    (out / "diagnosis_real.md").write_text("\n".join(head + lines))
    (out / "diagnosis_real.json").write_text(json.dumps(results, indent=1))
    print("\n".join(head + lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
