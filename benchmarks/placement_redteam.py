"""Red team 43's 14 rows (benchmarks/results/placement_redteam.md), rerun: has against fcfs on the red team's own
windows and clusters (not shipped: `--dir` is where its `traces/` and `clusters/` are). Read while fixing: not held
out. Each row is what `frenzy simulate --trace T --cluster C --load L --format F [--max-jobs 400] --policy has
--policy fcfs` runs.

    python benchmarks/placement_redteam.py --dir /work/redteam43 [--only 1,2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from cluster.compare import compare_policies  # noqa: E402
from cluster.simulator import SimConfig  # noqa: E402

ROWS: tuple[tuple[str, str, str, float], ...] = (
    ("philly-1020.csv", "philly", "phoebe-x4", 0.9), ("philly-1016.csv", "philly", "phoebe-x4", 0.9),
    ("philly-1020.csv", "philly", "phoebe-x4", 1.1), ("philly-1020.csv", "philly", "phoebe-x4", 1.3),
    ("philly-1020.csv", "philly", "phoebe-x4", 0.5), ("philly-1108.csv", "philly", "phoebe-x4", 0.9),
    ("phillyg-1003.csv", "generic", "phoebe-x4", 1.1), ("philly-1128.csv", "philly", "phoebe-x4", 0.7),
    ("openb-d70.csv", "openb", "phoebe-x4", 0.9), ("helios-a120.csv", "helios", "phoebe-x4", 0.9),
    ("philly-1020.csv", "philly", "oldmix", 0.9), ("philly-1020.csv", "philly", "phoebe", 0.9),
    ("sia-philly-123.csv", "sia", "phoebe", 0.9), ("sia-philly-123.csv", "sia", "phoebe-x4", 0.7),
)
"""(trace file, --format, cluster, load), in the order of placement_redteam.md's table."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/work/redteam43")
    ap.add_argument("--only", help="comma-separated row numbers, 1-based")
    ap.add_argument("--out", help="write the rows here as JSON")
    a = ap.parse_args()
    d = Path(a.dir)
    pick = {int(x) for x in a.only.split(",")} if a.only else None
    out = []
    for k, (tr, fmt, cl, load) in enumerate(ROWS, start=1):
        if pick and k not in pick:
            continue
        cluster = str(d / "clusters" / f"{cl}.yaml") if (d / "clusters" / f"{cl}.yaml").exists() else cl
        t0 = time.time()
        cmp = compare_policies(cluster, str(d / "traces" / tr), ["has", "fcfs"], SimConfig(), fmt=fmt,
                                  max_jobs=400, load=load)
        doc = cmp.to_json()
        h, f = doc["policies"]["has"], doc["policies"]["fcfs"]
        r = {k2: round(h[v] / f[v], 3) for k2, v in (("avg", "avg_jct_s"), ("p50", "p50_jct_s"), ("p99", "p99_jct_s"),
                                                     ("makespan", "makespan_s"))}
        row = {"row": k, "trace": tr, "cluster": cl, "load": load, **r, "unfinished": [h["unfinished"], f["unfinished"]],
               "wall_s": round(time.time() - t0, 1)}
        out.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
