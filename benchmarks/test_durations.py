"""Wall time of chosen tests, each as pytest reports it (`--durations=0`: setup and call), for a before/after table of
the default suite's slowest tests. `--busy N` runs N busy-loop processes beside pytest for the whole run (a machine
loaded as CI's is, reproducibly); `--repo` times another checkout (an older commit) with this interpreter; `--env`
sets variables for pytest and every process it starts.

    python benchmarks/test_durations.py tests/test_decode.py --label after
    python benchmarks/test_durations.py tests/test_decode.py --busy 2 --repo /tmp/before --label before-loaded
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)")
SPIN = "while True: pass"


def run_pytest(targets: list[str], repo: Path, env: dict[str, str], busy: int) -> tuple[dict[str, float], float, str]:
    """Seconds per test (setup + call + teardown), the whole run's wall time and pytest's summary line."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
                            "--durations-min=0", *targets], cwd=repo, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(repo), **env})
        wall = time.perf_counter() - t0
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    per: dict[str, float] = {}
    for ln in r.stdout.splitlines():
        m = LINE.match(ln)
        if m:
            per[m.group(3)] = per.get(m.group(3), 0.0) + float(m.group(1))
    summary = next((ln for ln in reversed(r.stdout.splitlines()) if " in " in ln and ("passed" in ln or "failed" in ln)),
                   r.stdout[-300:])
    if r.returncode not in (0, 5):
        sys.exit(f"pytest failed ({r.returncode}): {summary}\n{r.stdout[-3000:]}")
    return per, wall, summary


def markdown(doc: dict) -> str:
    lines = [f"# Test durations: {doc['label']} ({doc['date']}, {doc['machine']})", "",
             f"`{doc['command']}`", "", f"{doc['summary']}; wall {doc['wall_s']:.1f} s", "",
             "| test | s |", "|---|---|"]
    lines += [f"| `{k}` | {v:.2f} |" for k, v in sorted(doc["tests"].items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="+", help="test files or node ids")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose tests run (default: this one)")
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes beside pytest (default 0)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--label", default="now")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md (default: print the table)")
    a = ap.parse_args()
    env = dict(kv.split("=", 1) for kv in a.env)
    per, wall, summary = run_pytest(a.targets, a.repo.resolve(), env, a.busy)
    doc = {"label": a.label, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU", "busy": a.busy, "env": env,
           "command": " ".join(["python benchmarks/test_durations.py", *sys.argv[1:]]), "summary": summary,
           "wall_s": wall, "tests": per}
    if a.out:
        a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
