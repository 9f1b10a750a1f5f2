"""Failure diagnosis: accuracy on a labelled corpus and on real logs, and log compression at 100 MB.

Accuracy: `tasks/diagnosis/corpus.py` logs (`--per-class` of each of the 26 failure types; 4-32 ranks
interleaved, 400 lines of metric noise and start-up chatter, the symptoms each failure causes on the other
ranks, every third log with an unrelated earlier error line): per-class precision and recall of the failure type,
the root-cause line found, rank and node right. Plus the real logs in tests/data/diagnosis (public issues).
Compression: one 100 MB training log (a million metric/eval/checkpoint lines of 8 ranks, then a failure):
compression ratio and MB/s of `compress`, and the diagnosis of the whole file.

    python benchmarks/diagnosis.py           # writes benchmarks/results/diagnosis.{json,md}
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.diagnosis.compress import compress  # noqa: E402
from tasks.diagnosis.corpus import ROOTS, corpus, make_log  # noqa: E402
from tasks.diagnosis.diagnose import diagnose, diagnose_compressed  # noqa: E402

REAL = {"llamafactory-7396-nccl-timeout.log": "NCCLTimeoutError", "minigpt4-237-childfailed.log": "ChildFailed",
        "sglang-1693-watchdog.log": "NCCLTimeoutError", "pytorch-16417-oom.log": "OutOfMemoryError",
        "maddog-11-oom-old-format.log": "OutOfMemoryError",
        "pytorch-118369-watchdog-after-progress.log": "NCCLTimeoutError"}


def big_log(path: Path, mb: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    lab = make_log("ECCError", rng, noise_lines=2000)
    head, tail = lab.text.split("\n", 40)[:40], lab.text.split("\n")[40:]
    noise_line = make_log("KeyError", random.Random(seed + 1), noise_lines=20000).text.split("\n")[40:20000]
    with open(path, "w") as f:
        f.write("\n".join(head) + "\n")
        block = "\n".join(noise_line) + "\n"
        while f.tell() < mb * 1_000_000:
            f.write(block)
        f.write("\n".join(tail))


def accuracy(logs: list) -> dict:
    """Per-class precision/recall of the failure type, root line, rank and node right over the labelled corpus."""
    tp, fp, fn = collections.Counter(), collections.Counter(), collections.Counter()
    line_ok = rank_ok = rank_n = node_ok = multi = multi_ok = 0
    t0 = time.perf_counter()
    for lab in logs:
        d = diagnose(lab.text.encode())
        if d.type == lab.type:
            tp[lab.type] += 1
        else:
            fp[d.type] += 1
            fn[lab.type] += 1
        line_ok += d.root_cause_line == lab.root_line
        node_ok += d.node == lab.node
        if lab.root_line.startswith("[rank"):
            rank_n += 1
            rank_ok += d.rank == lab.rank
        if len(d.evidence) >= 2:
            multi += 1
            multi_ok += d.root_cause_line == lab.root_line
    acc_s = time.perf_counter() - t0
    per_class = {k: {"precision": tp[k] / max(1, tp[k] + fp[k]), "recall": tp[k] / max(1, tp[k] + fn[k]),
                     "n": tp[k] + fn[k]} for k in ROOTS}
    return {"logs": len(logs), "per_class": per_class, "root_line_found": line_ok / len(logs),
            "node_right": node_ok / len(logs), "rank_right": rank_ok / max(1, rank_n), "multi_error_logs": multi,
            "multi_error_root_line_found": multi_ok / max(1, multi), "seconds_per_log": acc_s / len(logs)}


def compression(mb: int) -> dict:
    """Compress and diagnose one generated `mb` MB training log."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "train.log"
        big_log(p, mb)
        size = p.stat().st_size
        c = compress(p)
        diag = diagnose_compressed(c, str(p))
    return {"bytes": size, "lines": c.lines, "kept_lines": len(c.kept), "ratio": c.ratio, "seconds": c.seconds,
            "mb_per_s": c.mb_per_s, "diagnosis": diag.type, "templates": c.templates[:5]}


def markdown(doc: dict) -> list[str]:
    per_class, cc = doc["per_class"], doc["compression"]
    worst_p = min(v["precision"] for v in per_class.values())
    worst_r = min(v["recall"] for v in per_class.values())
    lines = [f"# Failure diagnosis ({doc['date']}, {doc['machine']})", "", f"`{doc['command']}`", "",
             "| figure | target | measured |", "|---|---|---|",
             f"| per-class precision / recall, worst class ({doc['logs']} logs, {len(ROOTS)} types) | >= 0.9 | "
             f"{worst_p:.2f} / {worst_r:.2f} |",
             f"| root-cause line found, logs with several error lines ({doc['multi_error_logs']}) | >= 90% | "
             f"{100 * doc['multi_error_root_line_found']:.1f}% |",
             f"| root-cause line found, all logs | | {100 * doc['root_line_found']:.1f}% |",
             f"| rank right (root line names one) / node right | | {100 * doc['rank_right']:.1f}% / "
             f"{100 * doc['node_right']:.1f}% |",
             f"| real logs from public issues diagnosed as expected | all | "
             f"{sum(v['expected'] == v['got'] for v in doc['real'].values())} / {len(REAL)} |",
             f"| compression of a {cc['bytes'] / 1e6:.0f} MB log ({cc['lines']:,} lines) | >= 20x at >= 50 MB/s | "
             f"**{cc['ratio']:,.0f}x** at **{cc['mb_per_s']:.0f} MB/s** ({cc['kept_lines']} lines kept, "
             f"{cc['seconds']:.1f} s); diagnosed {cc['diagnosis']} |", "",
             "| type | precision | recall | n |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['precision']:.2f} | {v['recall']:.2f} | {v['n']} |" for k, v in per_class.items()]
    return lines + ["", "Most frequent dropped templates (Drain3) in the 100 MB log: "
                    + "; ".join(f"`{t}` x{n:,}" for t, n in cc["templates"][:3]) + "."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=30)
    ap.add_argument("--mb", type=int, default=100)
    a = ap.parse_args()
    acc = accuracy(corpus(per_class=a.per_class, seed=2026))
    real = {name: diagnose(REPO / "tests" / "data" / "diagnosis" / name).type for name in REAL}
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "command": "python benchmarks/diagnosis.py " + " ".join(sys.argv[1:]), **acc,
           "real": {k: {"expected": REAL[k], "got": v} for k, v in real.items()}, "compression": compression(a.mb)}
    out = REPO / "benchmarks" / "results"
    (out / "diagnosis.json").write_text(json.dumps(doc, indent=1))
    lines = markdown(doc)
    (out / "diagnosis.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
