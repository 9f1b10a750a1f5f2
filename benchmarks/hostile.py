"""Issue 32's hostile-input sweep, counted: every case of tests/hostile_*.py run as a user meets it and classified
(clear / unclear / traceback / hang / silent wrong / data lost). Writes benchmarks/results/hostile.md and the
Guarantees table (docs/guarantees.md) between its markers, so the figures there are measured, never typed.

    .venv/bin/python -m benchmarks.hostile
"""

from __future__ import annotations

import collections
import platform
import re
import sys
import time
from pathlib import Path

from tests.hostile_kit import OUTCOMES, all_cases, run_case

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- hostile:begin (benchmarks/hostile.py writes this table) -->", "<!-- hostile:end -->"


def sweep() -> tuple[dict[str, collections.Counter], list[str], float]:
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    notes = []
    t0 = time.monotonic()
    for case in all_cases():
        outcome, detail = run_case(case)
        rows[case.surface][outcome] += 1
        if outcome != "clear":
            notes.append(f"- `{case.id}`: {outcome}: {detail.splitlines()[-1] if detail else ''}")
        print(f"{outcome:12} {case.id}", file=sys.stderr)
    return rows, notes, time.monotonic() - t0


def table(rows: dict[str, collections.Counter]) -> str:
    head = "| surface | cases | " + " | ".join(OUTCOMES) + " |\n|---|" + "---|" * (len(OUTCOMES) + 1) + "\n"
    total: collections.Counter = collections.Counter()
    lines = []
    for surface, c in rows.items():
        total.update(c)
        lines.append(f"| {surface} | {sum(c.values())} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
    lines.append(f"| **all** | **{sum(total.values())}** | " + " | ".join(f"**{total[o]}**" for o in OUTCOMES) + " |")
    return head + "\n".join(lines) + "\n"


def main() -> int:
    rows, notes, seconds = sweep()
    tab = table(rows)
    machine = f"{platform.machine()}, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    (ROOT / "benchmarks" / "results" / "hostile.md").write_text(
        "# Hostile and broken inputs (issue 32)\n\n`.venv/bin/python -m benchmarks.hostile`: every case of "
        "`tests/hostile_*.py`, run in a fresh directory as a user or an attacker would, classified by what they "
        f"see.\nRan {time.strftime('%Y-%m-%d')} in {seconds:.0f} s on {machine} (shared 2-core machine, no GPU).\n\n{tab}\n"
        + ("Cases not clear:\n" + "\n".join(notes) + "\n" if notes else "Every case ends clear.\n"))
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:  # the Guarantees page holds the markers
        text = page.read_text()
        if BEGIN in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{tab}{END}", text, flags=re.S)
            page.write_text(text)
    print(tab)
    return 0 if not notes else 1


if __name__ == "__main__":
    sys.exit(main())
