"""Check the red-team set 10 (long logs) before it is scored: the rules it was gathered under.

    python tests/data/diagnosis/redteam10/check_set.py

Refuses (exit 1, one line per problem): a project in an earlier set's `excluded_projects.txt` or manifest, in
the corpus, or in this set's `excluded_projects.txt` beyond its own projects (compared lower-cased); a second log
from one project; a `root_line` that is not a substring of its log; a missing log; a manifest line without one of
the fields of set 8; a log of fewer than 100 lines. Lines are counted as the log's newline-terminated lines (a
carriage return inside a progress bar does not make a line), so a single tqdm line full of `\r` updates cannot
pass for a long log. Prints the count of logs and their line counts when all is well.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
DIAG = HERE.parent
LONG = 100


def _projects(manifest: Path) -> set[str]:
    if not manifest.exists():
        return set()
    rows = [json.loads(ln) for ln in manifest.read_text().splitlines() if ln.strip()]
    return {r["project"].lower() for r in rows}


def _names(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {ln.strip().lower() for ln in path.read_text().splitlines() if ln.strip()}


def _set_number(folder: Path) -> float:
    """The round of a red-team folder (redteam10 -> 10); a folder that is not a numbered set counts as the last."""
    digits = folder.name.removeprefix("redteam")
    return int(digits) if digits.isdigit() else float("inf")


def excluded() -> set[str]:
    """Every project the set must not draw from: the lists of earlier sets, their manifests and the corpus.

    This set's own list carries the earlier sets' projects plus its own (so that later sets exclude them); its
    own projects are taken out of its own list only, so a project that an earlier set's list or manifest names
    is still refused. Only sets numbered below this one count as earlier: a later set's list names this set's
    projects on purpose and must not refuse them here.
    """
    own = _projects(HERE / "manifest.jsonl")
    others = [d for d in sorted(DIAG.glob("redteam*")) if d != HERE and _set_number(d) < _set_number(HERE)]
    out = _names(HERE / "excluded_projects.txt") - own
    out |= set().union(*(_names(d / "excluded_projects.txt") | _projects(d / "manifest.jsonl") for d in others))
    return out | _projects(DIAG / "real" / "manifest.jsonl")


def line_count(text: str) -> int:
    """Newline-terminated lines, plus a last line without its newline."""
    return text.count("\n") + (0 if not text or text.endswith("\n") else 1)


def _set9_checks() -> ModuleType:
    """Set 9's checks (fields, exclusion, one log per project, category, log present, root_line), run on this set."""
    spec = importlib.util.spec_from_file_location("redteam9_check_set", DIAG / "redteam9" / "check_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.HERE = HERE
    return module


def problems(rows: list[dict], banned: set[str]) -> list[str]:
    """What breaks the rules, one line each: set 9's checks, then the length of each log."""
    out = _set9_checks().problems(rows, banned)
    for r in rows:
        log = HERE / "logs" / f"{r.get('id')}.log"
        if log.exists() and line_count(log.read_bytes().decode("utf-8")) < LONG:
            out.append(f"{r['id']}: {line_count(log.read_bytes().decode('utf-8'))} lines, under {LONG}: not a long log")
    return out


def _summary(rows: list[dict]) -> str:
    counts = sorted(line_count((HERE / "logs" / f"{r['id']}.log").read_bytes().decode("utf-8")) for r in rows)
    return (f"ok: {len(rows)} logs from {len(rows)} projects, all of {LONG}+ lines "
            f"(lines: min {counts[0]}, median {counts[len(counts) // 2]}, max {counts[-1]})")


def main() -> int:
    manifest = (HERE / "manifest.jsonl").read_text().splitlines()
    rows = [json.loads(ln) for ln in manifest if ln.strip()]
    found = problems(rows, excluded())
    print("\n".join(found) or _summary(rows))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
