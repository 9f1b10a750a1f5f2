"""How fast `frenzy diagnose` answers, and in how much memory (issue 45).

Short logs (12 and 100 lines; a generated multi-rank failure log): the wall time of a fresh process, median of
`--runs`, three ways: the whole `frenzy diagnose` command as this checkout dispatches it (`python -m cli.main`), the
diagnose command group alone (its parser and `cli.output.run`: what a lazy dispatcher runs), and the library call
(`tasks.diagnosis.diagnose.diagnose`); plus `python -X importtime` of the command group, the modules that cost most.
A large log (`--gb`, generated: a million-line-per-100-MB training log of 8 ranks, then an ECC failure): the command
group's wall time, MB/s and the peak resident memory of its whole process tree (the command and its compression
workers, polled every 20 ms), and whether the diagnosis is right.

    python benchmarks/diagnosis_speed.py [--gb 1] [--runs 5]   # writes benchmarks/results/diagnosis_speed.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.diagnosis import big_log  # noqa: E402
from tasks.diagnosis.corpus import make_log  # noqa: E402

GROUP = ("import sys\nfrom cli import diagnose\nfrom cli.output import run\nimport argparse\n"
         "p = argparse.ArgumentParser(prog='frenzy')\nsub = p.add_subparsers(dest='command', required=True)\n"
         "def add(name, fn, help_=None):\n    sp = sub.add_parser(name, help=help_)\n"
         "    sp.add_argument('--json', action='store_true')\n    sp.set_defaults(fn=fn)\n    return sp\n"
         "diagnose.add_commands(add)\nsys.exit(run(p.parse_args(sys.argv[1:])))\n")
"""The diagnose command group alone, dispatched as `frenzy` does: what the CLI costs once its dispatch is lazy."""
LIBRARY = "import sys\nfrom tasks.diagnosis.diagnose import diagnose\nprint(diagnose(sys.argv[1]).type)\n"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _wall(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env=_env(), check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _importtime(log: Path, top: int = 8) -> list[tuple[str, float]]:
    """The modules with the largest cumulative import time in the command group (seconds)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", GROUP, "diagnose", str(log)], cwd=REPO,
                         env=_env(), capture_output=True, text=True, check=True).stderr
    rows = []
    for ln in out.splitlines():
        parts = ln.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((parts[2].rstrip(), int(parts[1]) / 1e6))
    top_level = [(m.strip(), s) for m, s in rows if (len(m) - len(m.lstrip()) - 1) // 2 <= 1]  # depth 0 and 1
    return sorted(top_level, key=lambda r: -r[1])[:top]


def _peak(cmd: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak resident bytes of the process tree, and stdout of a command."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc, peak = psutil.Process(p.pid), 0
    while p.poll() is None:
        try:
            peak = max(peak, sum(x.memory_info().rss for x in [proc, *proc.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.02)
    out = p.stdout.read().decode()
    if p.wait() != 0:
        raise RuntimeError(f"{cmd} failed")
    return time.perf_counter() - t0, peak, out


def short_logs(tmp: Path, runs: int) -> dict:
    out = {}
    for lines in (12, 100):
        log = tmp / f"train-{lines}.log"
        text = make_log("CUDAError", random.Random(lines), noise_lines=lines).text.splitlines()
        log.write_text("\n".join(text[-lines:]) + "\n")  # the last `lines` lines: the failure and its symptoms
        out[f"{lines}_lines"] = {
            "command": _wall([sys.executable, "-m", "cli.main", "diagnose", str(log)], runs),
            "command_group": _wall([sys.executable, "-c", GROUP, "diagnose", str(log)], runs),
            "command_group_json": _wall([sys.executable, "-c", GROUP, "diagnose", str(log), "--json"], runs),
            "library": _wall([sys.executable, "-c", LIBRARY, str(log)], runs),
            "python_alone": _wall([sys.executable, "-c", "pass"], runs)}
    out["importtime_top"] = _importtime(tmp / "train-100.log")
    return out


def large_log(tmp: Path, gb: float) -> dict:
    log = tmp / "big.log"
    big_log(log, int(gb * 1000))
    size = log.stat().st_size
    wall, peak, out = _peak([sys.executable, "-c", GROUP, "diagnose", str(log), "--json"])
    d = json.loads(out)
    return {"bytes": size, "lines": d["lines"], "kept_lines": d["kept_lines"], "seconds": wall,
            "mb_per_s": size / 1e6 / wall, "peak_rss_mib": peak / 2**20, "type": d["type"],
            "right": d["type"] == "ECCError"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    load1 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        short = short_logs(Path(d), a.runs)
        large = large_log(Path(d), a.gb)
    doc = {"date": datetime.now(UTC).date().isoformat(),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU, load average {load1:.1f} at the start",
           "command": "python benchmarks/diagnosis_speed.py " + " ".join(sys.argv[1:]), "short": short,
           "large": large}
    out = REPO / "benchmarks" / "results"
    (out / "diagnosis_speed.json").write_text(json.dumps(doc, indent=1))
    s12, s100, big = short["12_lines"], short["100_lines"], large
    lines = [f"# `frenzy diagnose`: time and memory ({doc['date']}, {doc['machine']})", "", f"`{doc['command']}`", "",
             "Wall time of a fresh process (median of the runs; python itself starts in "
             f"{1e3 * s100['python_alone']:.0f} ms here):", "",
             "| log | whole CLI as dispatched on this branch | the diagnose command group | its `--json` | library "
             "call | target |", "|---|---|---|---|---|---|"]
    for name, r in (("12 lines", s12), ("100 lines", s100)):
        lines.append(f"| {name} | {r['command']:.2f} s | **{r['command_group']:.2f} s** | "
                     f"{r['command_group_json']:.2f} s | {r['library']:.2f} s | < 1 s |")
    lines += ["", "Largest cumulative imports of the command group (`python -X importtime`): "
              + ", ".join(f"`{m}` {1e3 * s:.0f} ms" for m, s in short["importtime_top"]) + ".", "",
              f"A {big['bytes'] / 1e9:.2f} GB log ({big['lines']:,} lines): **{big['seconds']:.1f} s** "
              f"({big['mb_per_s']:.0f} MB/s), peak resident memory of the command and its workers "
              f"**{big['peak_rss_mib']:.0f} MiB**, {big['kept_lines']:,} lines kept, diagnosed {big['type']} "
              f"({'right' if big['right'] else 'WRONG'})."]
    (out / "diagnosis_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
