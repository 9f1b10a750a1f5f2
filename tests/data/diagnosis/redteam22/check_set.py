"""Check red-team set 22 (issue 45, round 22: fresh held-out logs from issue threads) before it is scored.

    python tests/data/diagnosis/redteam22/check_set.py

Refuses (exit 1, one line per problem): a project named in an earlier set's `excluded_projects.txt` or manifest, in
the corpus, or in this set's `excluded_projects.txt` beyond this set's own projects (compared lower-cased); a second
log from one project; a `root_line` that is not a substring of its log; a missing log; a manifest line without one of
the fields of set 8 or with an unknown category; more than a third of the logs being one quoted line. Prints the
counts by family and category and the number of long logs (100 lines or more) when all is well.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIELDS = ("id", "project", "url", "type", "category", "restartable", "root_line", "label_source", "family")
CATEGORIES = ("script", "framework", "infrastructure")
LONG = 100


def _rows(manifest: Path) -> list[dict]:
    return [json.loads(ln) for ln in manifest.read_text().splitlines() if ln.strip()]


def _names(listing: Path) -> set[str]:
    return {ln.strip().lower() for ln in listing.read_text().splitlines() if ln.strip()}


def excluded(here: Path = HERE) -> set[str]:
    """Every project the set must not draw from: earlier sets' lists and manifests, the corpus, and this set's list
    less this set's own projects (the list holds them so that a later set excludes them)."""
    diag = here.parent
    own = {r["project"].lower() for r in _rows(here / "manifest.jsonl")}
    out = _names(here / "excluded_projects.txt") - own
    for other in sorted(diag.glob("redteam*")):
        if other.resolve() == here.resolve():
            continue
        if (other / "excluded_projects.txt").exists():
            out |= _names(other / "excluded_projects.txt")
        if (other / "manifest.jsonl").exists():
            out |= {r["project"].lower() for r in _rows(other / "manifest.jsonl")}
    return out | {r["project"].lower() for r in _rows(diag / "real" / "manifest.jsonl")}


def _log(row: dict, here: Path) -> Path:
    return here / "logs" / f"{row['id']}.log"


def one_line_logs(rows: list[dict], here: Path = HERE) -> list[str]:
    """The ids whose log is one line (a reporter's quoted error line)."""
    return [r["id"] for r in rows if _log(r, here).exists() and len(_log(r, here).read_text().splitlines()) == 1]


def _row_problems(r: dict, banned: set[str], seen: set[str], here: Path) -> list[str]:
    missing = [f for f in FIELDS if f not in r]
    if missing:
        return [f"{r.get('id')}: missing fields {missing}"]
    out, project = [], r["project"].lower()
    if project in banned:
        out.append(f"{r['id']}: project {r['project']} is excluded")
    if project in seen:
        out.append(f"{r['id']}: a second log from {r['project']}")
    seen.add(project)
    if r["category"] not in CATEGORIES:
        out.append(f"{r['id']}: category {r['category']!r} is not one of {CATEGORIES}")
    if not _log(r, here).exists():
        out.append(f"{r['id']}: no log at {_log(r, here)}")
    elif r["root_line"] not in _log(r, here).read_text():
        out.append(f"{r['id']}: root_line is not a substring of the log")
    return out


def problems(rows: list[dict], banned: set[str], here: Path = HERE) -> list[str]:
    """What breaks the rules, one line each."""
    out: list[str] = []
    seen: set[str] = set()
    for r in rows:
        out += _row_problems(r, banned, seen, here)
    single = len(one_line_logs(rows, here))
    if 3 * single > len(rows):
        out.append(f"{single} of {len(rows)} logs are one line: more than a third")
    return out


def main() -> int:
    rows = _rows(HERE / "manifest.jsonl")
    found = problems(rows, excluded())
    if found:
        print(*found, sep="\n")
        return 1
    long = sum(len(_log(r, HERE).read_text().splitlines()) >= LONG for r in rows)
    tallies = "; ".join(
        f"by {key} {dict(sorted(collections.Counter(r[key] for r in rows).items()))}" for key in ("family", "category")
    )
    print(f"ok: {len(rows)} logs, {len(one_line_logs(rows))} of one line, {long} of {LONG}+ lines; {tallies}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
