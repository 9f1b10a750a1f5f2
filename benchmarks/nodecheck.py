"""The two-round node check on 16 nodes: one node whose collective fails, one that hangs, one that is slow.

Each scenario runs `check_nodes` with real gloo probes (one local process per node; on this 2-core machine 16
processes start per round, so most of the time is process start-up, not the collectives). Reports what was found
and the wall time of the two rounds.

    python benchmarks/nodecheck.py       # writes benchmarks/results/nodecheck.{json,md}
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cluster.nodecheck import check_nodes, local_probe  # noqa: E402

SCENARIOS = {"one node dies in its collective": {"FRENZY_NODECHECK_FAIL": "n5"},
             "one node hangs (costs the 20 s timeout)": {"FRENZY_NODECHECK_HANG": "n11"},
             "one node 1 s slower": {"FRENZY_NODECHECK_SLOW": "n9:1.0"},
             "healthy": {}}
TRUTH = {"one node dies in its collective": (["n5"], []), "one node hangs (costs the 20 s timeout)": (["n11"], []),
         "one node 1 s slower": ([], ["n9"]), "healthy": ([], [])}


def main() -> int:
    nodes = [f"n{i}" for i in range(16)]
    rows = []
    for name, env in SCENARIOS.items():
        for k in ("FRENZY_NODECHECK_FAIL", "FRENZY_NODECHECK_HANG", "FRENZY_NODECHECK_SLOW"):
            os.environ.pop(k, None)
        os.environ.update(env)
        r = check_nodes(nodes, probe=local_probe(timeout_s=20))
        rows.append({"scenario": name, "faulty": r.faulty, "slow": r.slow, "unverified": r.unverified,
                     "rounds": len(r.rounds), "seconds": r.seconds,
                     "right": (r.faulty, r.slow) == TRUTH[name]})
        print(rows[-1], file=sys.stderr, flush=True)
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "command": "python benchmarks/nodecheck.py", "rows": rows}
    out = REPO / "benchmarks" / "results"
    (out / "nodecheck.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Node check, 16 nodes ({doc['date']}, {doc['machine']})", "", f"`{doc['command']}`", "",
             "| scenario | faulty found | slow found | rounds | wall | right |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['scenario']} | {', '.join(r['faulty']) or '-'} | {', '.join(r['slow']) or '-'} | {r['rounds']} | "
              f"{r['seconds']:.1f} s | {'yes' if r['right'] else 'NO'} |" for r in rows]
    (out / "nodecheck.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
