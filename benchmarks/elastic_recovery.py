"""Recovery onto a smaller allocation: from a lost node to training again on the GPUs that are left, through
`frenzy submit --executor ray` with the default plan ranking.

A loopback Ray cluster (tests/ray_cluster.py: a head and two named raylets with one fake A100-40GB each) runs a
gpt-tiny job (seq 64, global batch 64: MARP's balanced ranking puts it data parallel on both GPUs). Once step 10 is
committed one of its nodes is removed (its raylet and the rank on it die). The flow notices, diagnoses, cordons the
node, re-plans onto what is left (HAS through the ledger) and the trainer resumes from the newest commit, resharded
onto one rank. Measured per run: the seconds from the node loss to the resumed run's `resume` record and to its
first step, steps lost (newest commit at the loss against the step resumed from), the relayout the flow recorded,
the final loss against an uninterrupted one-process `frenzy train` of the same job, and whether every step's global
batch is the next run of sample ids (none repeated or skipped across the layout change).

    python benchmarks/elastic_recovery.py [--runs 2]     # writes benchmarks/results/elastic_recovery.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ray_cluster import LOOPBACK_ENV, start_cluster  # noqa: E402

os.environ.update(LOOPBACK_ENV)  # before ray is imported (start_cluster imports it)
os.environ["FRENZY_SAMPLE_LOG"] = "1"  # the raylets (and the rank actors they start) inherit this process's env

from cluster.ledger import Ledger  # noqa: E402
from tasks.training import checkpoint as ck  # noqa: E402
from tasks.training.data import sample_order  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402

STEPS, LOSE_AFTER, GLOBAL_BATCH = 30, 10, 64


def _job(tmp: Path) -> Path:
    doc = {"name": "shrink", "model": {"preset": "gpt-tiny"}, "training": {
        "seq_len": 64, "global_batch": GLOBAL_BATCH, "precision": "fp32", "steps": STEPS, "lr": 3e-3,
        "warmup_steps": 5, "log_every_steps": 1, "trace_every_steps": 0,
        "checkpoint": {"every_steps": 5, "uri": f"file://{tmp}/ckpt", "keep": 3}}}
    (tmp / "job.yaml").write_text(yaml.safe_dump(doc))
    return tmp / "job.yaml"


def _records(progress: Path) -> list[dict]:
    return [json.loads(x) for x in progress.read_text().splitlines() if x.endswith("}")] if progress.exists() else []


def reference(tmp: Path) -> float:
    """The final loss of an uninterrupted one-process `frenzy train` of the same job."""
    ref = tmp / "ref"
    ref.mkdir()
    job = _job(ref)
    subprocess.run([sys.executable, "-m", "cli", "train", str(job), "--device", "cpu", "--threads", "1", "--run-dir",
                    str(ref / "run")], cwd=REPO, check=True, capture_output=True)
    return json.loads((ref / "run" / "result.json").read_text())["last_loss"]


def one(tmp: Path, ref_loss: float) -> dict:
    c, nodes = start_cluster(["n1", "n2"], head_resources={"frenzy_node:head": 1})
    try:
        env = {**os.environ, "FRENZY_HOME": str(tmp / "home"), "FRENZY_SAMPLE_LOG": "1", "RAY_ADDRESS": c.address,
               "PYTHONPATH": str(REPO), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "240"}  # a loaded host
        env.pop("PREFECT_API_URL", None)  # an ephemeral Prefect server, as a user without one gets
        p = subprocess.Popen([sys.executable, "-m", "cli", "submit", str(_job(tmp)), "--executor", "ray",
                              "--ledger", str(tmp / "l.db"), "--evaluation", "off", "--device", "cpu", "--run-dir",
                              str(tmp / "run"), "--json"], cwd=tmp, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        storage = Storage(f"file://{tmp}/ckpt")
        while not any(m.step >= LOSE_AFTER for m in ck.committed(storage)):
            if p.poll() is not None:
                raise RuntimeError(p.stderr.read()[-3000:])
            time.sleep(0.1)
        [alloc] = Ledger(str(tmp / "l.db")).allocations()
        placed = sorted(n.node for n in alloc.nodes)
        lost = placed[-1]
        t_loss = time.time()
        c.remove_node(nodes.pop(lost))
        committed = max(m.step for m in ck.committed(storage))
        out, err = p.communicate(timeout=900)
        if p.returncode:
            raise RuntimeError(err[-3000:])
    finally:
        c.shutdown()
    res = json.loads(out)
    after = [r for r in _records(tmp / "run" / "progress.jsonl") if r["time"] > t_loss]
    t_resume = next(r["time"] for r in after if r["event"] == "resume")
    t_step = next(r["time"] for r in after if r["event"] == "step" and r["time"] > t_resume)
    resumed = res["train"]["resumed_from_step"]
    order = sample_order(tmp / "run")
    # up to the resume both ranks' ids make the batch; after it rank 0 alone trains the whole batch (a stale record of
    # the lost rank, for a step the first attempt ran past its commit, follows rank 0's ids and is not counted)
    ok = sorted(order) == list(range(1, STEPS + 1)) and all(
        (order[s] if s <= resumed else order[s][:GLOBAL_BATCH]) == list(range((s - 1) * GLOBAL_BATCH, s * GLOBAL_BATCH))
        for s in order)
    rl = res["recoveries"][0].get("relayout") or {}
    return {"placed_on": placed, "lost": lost, "resumed_on": sorted(n["node"] for n in res["allocation"]["nodes"]),
            "relayout": rl.get("why"), "old_gpus": rl.get("old", {}).get("gpus"),
            "new_gpus": rl.get("new", {}).get("gpus"), "committed_at_loss": committed, "resumed_from": resumed,
            "steps_lost": committed - resumed, "loss_to_resume_record_s": t_resume - t_loss,
            "loss_to_first_step_s": t_step - t_loss, "final_step": res["train"]["final_step"],
            "loss": res["train"]["last_loss"], "loss_rel_diff": abs(res["train"]["last_loss"] - ref_loss) / ref_loss,
            "samples_continue_exactly": ok, "diagnosis": res["recoveries"][0]["diagnosis"]["type"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    ref_loss = reference(Path(tempfile.mkdtemp(prefix="frenzy-shrink-ref-")))
    rows = []
    for i in range(a.runs):
        rows.append(one(Path(tempfile.mkdtemp(prefix="frenzy-shrink-")), ref_loss))
        print(f"run {i + 1}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{os.cpu_count()}-core {platform.machine()}, "
           "shared with other sessions, no GPU", "command": "python benchmarks/elastic_recovery.py "
           + " ".join(sys.argv[1:]), "reference_loss": ref_loss, "runs": rows}
    out = REPO / "benchmarks" / "results" / "elastic_recovery"
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Recovery onto a smaller allocation ({doc['date']})", "",
             f"Machine: {doc['machine']}. Command: `{doc['command']}`. `frenzy submit --executor ray` (default "
             "ranking, ephemeral Prefect, SQLite ledger) of gpt-tiny (seq 64, global batch 64, fp32, checkpoint every "
             f"5 steps, {STEPS} steps) on a loopback Ray cluster of two one-GPU nodes; one of the job's nodes removed "
             f"once step {LOSE_AFTER} is committed. Reference loss: an uninterrupted one-process `frenzy train` "
             f"({ref_loss:.6f}).", "",
             "| run | placed on | lost | resumed on | GPUs | committed at loss | resumed from | steps lost | loss -> "
             "resume (s) | loss -> first step (s) | final loss rel. diff | samples continue exactly |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {i + 1} | {', '.join(r['placed_on'])} | {r['lost']} | {', '.join(r['resumed_on'])} | "
              f"{r['old_gpus']} -> {r['new_gpus']} | {r['committed_at_loss']} | {r['resumed_from']} | "
              f"{r['steps_lost']} | {r['loss_to_resume_record_s']:.1f} | {r['loss_to_first_step_s']:.1f} | "
              f"{r['loss_rel_diff']:.1e} | {'yes' if r['samples_continue_exactly'] else 'NO'} |"
              for i, r in enumerate(rows)]
    lines += ["", f"The flow's relayout record (run 1): {rows[0]['relayout']}"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
