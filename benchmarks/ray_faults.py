"""Hard faults under `frenzy submit --executor ray` (issue 31): the real CLI on a loopback Ray cluster (a head and two
workers, one fake A100 and one CPU each), a worker's raylet and every process under it SIGKILLed or SIGSTOPped once
step 20 of 60 has committed. Measured from the fault: detection (the launcher writes `frenzy: node X lost` and fails
the group) and training again (the first step record of the resumed run); and what the user gets: exit status, the
node's ledger state, the step resumed from against the last commit, evaluations present. SIGKILL and SIGSTOP
alternate, so both see the same machine load; a faulted worker is replaced by a fresh node of the same name.

    python benchmarks/ray_faults.py              # writes benchmarks/results/ray_faults.{json,md}; BENCH_REPS=2, BENCH_EVALUATION=off
"""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.ray_cluster import LOOPBACK_ENV, node_pids, replace_node, start_cluster  # noqa: E402

os.environ.update(LOOPBACK_ENV)  # before ray is imported

from tests.ray_faults_kit import FaultRun, submit_with_fault  # noqa: E402

COMMAND = "python benchmarks/ray_faults.py"


def _row(run: FaultRun) -> dict:
    doc = run.doc or {}
    train = doc.get("train", {})
    return {"signal": run.signal, "victim": run.victim, "rc": run.rc, "detect_s": run.detect_s,
            "resume_s": run.resume_s, "committed_at_fault": run.committed_at_fault,
            "resumed_from": train.get("resumed_from_step"), "final_step": train.get("final_step"),
            "placed_after": [n["node"] for n in doc.get("allocation", {}).get("nodes", [])],
            "evaluations": len(doc.get("evaluations", [])), "ledger_state": run.victim_state[0],
            "ledger_reason": run.victim_state[1], "recovery": [r["diagnosis"]["type"] + " -> " + r["action"]["kind"]
                                                              for r in doc.get("recoveries", [])],
            "stderr_tail": "" if run.rc == 0 else run.stderr[-1500:]}


def _s(x: float | None) -> str:
    return f"{x:.1f}" if isinstance(x, float) else "-"


def _markdown(rows: list[dict], meta: dict) -> str:
    out = ["# Hard faults under `frenzy submit --executor ray`\n", f"Command: `{COMMAND}` (BENCH_REPS="
           f"{meta['reps']}), {meta['date']}. Machine: {meta['machine']}, shared with other work while it ran, no "
           "GPU; Ray {ray}, default health check. Cluster: a head and two workers on loopback, one fake A100-40GB "
           "and one CPU each; job gpt-tiny, seq 256, global batch 16 (plan dp=2 on two nodes), 40 steps, a "
           "checkpoint every 20, fault once step 20 committed; evaluation {ev} (BENCH_EVALUATION).\n"
           .format(ray=meta["ray"], ev=meta["evaluation"]), "Detection: fault to the `frenzy: node X lost` line; training "
           "again: fault to the first step record of the resumed run (both polled every 0.2 s).\n",
           "| # | signal | exit | detected (s) | training again (s) | committed at fault | resumed from | final | "
           "resumed on | evals | victim in ledger |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        out.append(f"| {i} | {r['signal']} ({r['victim']}) | {r['rc']} | {_s(r['detect_s'])} | {_s(r['resume_s'])} | "
                   f"{r['committed_at_fault']} | {r['resumed_from']} | {r['final_step']} | "
                   f"{'+'.join(r['placed_after']) or '-'} | {r['evaluations']} | {r['ledger_state']} |")
    out.append("")
    for sig in ("SIGKILL", "SIGSTOP"):
        ok = [r for r in rows if r["signal"] == sig and r["rc"] == 0 and r["detect_s"] is not None]
        if ok:
            out.append(f"- {sig}: {len(ok)}/{sum(r['signal'] == sig for r in rows)} recovered; median detection "
                       f"{statistics.median(r['detect_s'] for r in ok):.1f} s, median training again "
                       f"{statistics.median(r['resume_s'] for r in ok if r['resume_s']):.1f} s after the fault; steps "
                       f"lost beyond the last commit: "
                       f"{max(r['committed_at_fault'] - (r['resumed_from'] or 0) for r in ok)}")
    reasons = {r["signal"]: r["ledger_reason"] for r in rows if r["ledger_reason"]}
    out += ["", "Ledger reasons: " + "; ".join(f"{k}: {v}" for k, v in reasons.items())]
    fails = [r for r in rows if r["rc"] != 0]
    for r in fails:
        out += ["", f"Failed run ({r['signal']}):", "```", r["stderr_tail"], "```"]
    return "\n".join(out) + "\n"


def main() -> int:
    import ray
    from prefect.testing.utilities import prefect_test_harness

    reps = int(os.environ.get("BENCH_REPS", "2"))
    c, nodes = start_cluster(["w1", "w2"], cpus=1, head_resources={"frenzy_node:head": 1,
                                                                  "frenzy_gpu:A100-40GB": 1}, head_gpus=1)
    rows: list[dict] = []
    try:
        with prefect_test_harness(server_startup_timeout=120), tempfile.TemporaryDirectory() as d:
            for i in range(reps):
                for sig in (signal.SIGKILL, signal.SIGSTOP):
                    tmp = Path(d) / f"{sig.name}-{i}"
                    tmp.mkdir()
                    run = submit_with_fault(tmp, nodes, sig, evaluation=os.environ.get("BENCH_EVALUATION", "off"))
                    rows.append(_row(run))
                    print(json.dumps({k: v for k, v in rows[-1].items() if k != "stderr_tail"}), flush=True)
                    if run.victim:
                        replace_node(c, nodes, run.victim, run.pids)
                        time.sleep(2)  # let the fresh node's workers settle before the next run's clock starts
    finally:
        ray.shutdown()
        for node in nodes.values():
            for pid in node_pids(node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        c.shutdown()
    meta = {"reps": reps, "evaluation": os.environ.get("BENCH_EVALUATION", "off"),
            "date": datetime.now(UTC).strftime("%Y-%m-%d"), "ray": ray.__version__,
            "machine": f"{os.cpu_count()}-core {platform.machine()}"}
    out = REPO / "benchmarks" / "results"
    (out / "ray_faults.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1))
    (out / "ray_faults.md").write_text(_markdown(rows, meta))
    print(_markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
