"""Check the red-team set 9 before it is scored: the rules it was gathered under.

    python tests/data/diagnosis/redteam9/check_set.py

Refuses (exit 1, one line per problem): a project in `excluded_projects.txt`, in the corpus or in an earlier
red-team set (compared lower-cased); a second log from one project; a `root_line` that is not a substring of its
log; a missing log; a manifest line without one of the fields of set 8. Prints the count of logs and of long logs
(100 lines or more) when all is well.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIAG = HERE.parent
FIELDS = ("id", "project", "url", "type", "category", "restartable", "root_line", "label_source", "family")
CATEGORIES = ("script", "framework", "infrastructure")
LONG = 100


def _projects(manifest: Path) -> set[str]:
    rows = [json.loads(ln) for ln in manifest.read_text().splitlines() if ln.strip()]
    return {r["project"].lower() for r in rows}


def excluded() -> set[str]:
    """Every project the set must not draw from: the lists of earlier sets, their manifests and the corpus."""
    out = {ln.strip().lower() for ln in (HERE / "excluded_projects.txt").read_text().splitlines() if ln.strip()}
    for other in sorted(DIAG.glob("redteam*")):
        if other == HERE:
            continue
        if (other / "excluded_projects.txt").exists():
            out |= {ln.strip().lower() for ln in (other / "excluded_projects.txt").read_text().splitlines()
                    if ln.strip()}
        out |= _projects(other / "manifest.jsonl")
    return out | _projects(DIAG / "real" / "manifest.jsonl")


def problems(rows: list[dict], banned: set[str]) -> list[str]:
    """What breaks the rules, one line each."""
    out, seen = [], set()
    for r in rows:
        missing = [f for f in FIELDS if f not in r]
        if missing:
            out.append(f"{r.get('id')}: missing fields {missing}")
            continue
        project = r["project"].lower()
        if project in banned:
            out.append(f"{r['id']}: project {r['project']} is excluded")
        if project in seen:
            out.append(f"{r['id']}: a second log from {r['project']}")
        seen.add(project)
        if r["category"] not in CATEGORIES:
            out.append(f"{r['id']}: category {r['category']!r} is not one of {CATEGORIES}")
        log = HERE / "logs" / f"{r['id']}.log"
        if not log.exists():
            out.append(f"{r['id']}: no log at {log}")
        elif r["root_line"] not in log.read_text():
            out.append(f"{r['id']}: root_line is not a substring of the log")
    return out


def main() -> int:
    rows = [json.loads(ln) for ln in (HERE / "manifest.jsonl").read_text().splitlines() if ln.strip()]
    found = problems(rows, excluded())
    for p in found:
        print(p)
    if found:
        return 1
    long = sum(len((HERE / "logs" / f"{r['id']}.log").read_text().splitlines()) >= LONG for r in rows)
    print(f"ok: {len(rows)} logs from {len(rows)} projects, {long} of {LONG}+ lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
