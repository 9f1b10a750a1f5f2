"""Evaluation makespan on 2 and 4 Ray nodes against the plan's prediction (and the local executor on the same
plan): a three-to-five-raylet Ray cluster on this machine (every address on loopback), one GPU slot per node, the
`quick` suite on a gpt-tiny checkpoint, elastic schedule, suite priors (no learned ones, so every run plans alike).

    python benchmarks/ray_evaluation.py          # writes benchmarks/results/ray_evaluation.{json,md}
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.ray_cluster import LOOPBACK_ENV, start_cluster  # noqa: E402

os.environ.update(LOOPBACK_ENV)  # before ray is imported


def main() -> int:
    import ray

    from tasks.evaluation.runner import EvalOptions, evaluate
    from tasks.evaluation.suite import load_suite
    from tasks.training.launch import launch
    from tests.trainer_util import tiny_job

    names = [f"e{i}" for i in range(4)]
    c, _ = start_cluster(names)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as d:
            uri = f"file://{d}/ckpt"
            launch(tiny_job(uri, steps=10, every=10), Path(d) / "train", device="cpu", threads=1)
            suite = load_suite("quick")
            for nodes in (2, 4):
                for executor in ("ray", "local"):
                    opts = EvalOptions(executor=executor, nodes=nodes, gpus_per_node=1, use_priors=False,
                                       learn_priors=False, out_dir=f"{d}/{executor}{nodes}",
                                       ray_nodes=names[:nodes] if executor == "ray" else None)
                    res = evaluate(uri, suite, opts)
                    rows.append({"executor": executor, "nodes": nodes, "trials": len(res.trials),
                                 "makespan_s": res.makespan_s, "predicted_s": res.predicted_makespan_s,
                                 "precursor_s": res.precursor_s, "hosts": sorted({t.host for t in res.trials}),
                                 "scores": res.scores})
                    print({k: v for k, v in rows[-1].items() if k != "scores"}, file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
        c.shutdown()
    same = all(r["scores"] == rows[0]["scores"] for r in rows)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, no GPU"
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": machine, "rows": rows, "same_scores": same}
    out = REPO / "benchmarks" / "results"
    (out / "ray_evaluation.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Evaluation on Ray nodes ({doc['date']}, {machine})", "",
             "`python benchmarks/ray_evaluation.py`: suite `quick` on a gpt-tiny checkpoint, elastic schedule, one "
             "slot per node, suite priors; ray = each node a Ray node of a loopback cluster, local = the same plan "
             "with nodes simulated by processes here. Every node shares this machine's 2 cores.", "",
             "| executor | nodes | trials | measured makespan s | predicted s | measured / predicted | trials on |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['executor']} | {r['nodes']} | {r['trials']} | {r['makespan_s']:.1f} | {r['predicted_s']:.1f} | "
              f"{r['makespan_s'] / r['predicted_s']:.2f} | {', '.join(r['hosts'])} |" for r in rows]
    lines += ["", f"Scores identical across every run: {same}."]
    (out / "ray_evaluation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
