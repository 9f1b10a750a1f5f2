"""Resume across layouts, as a user does it: `frenzy train job.yaml --nproc N --tp T`, SIGKILL, then
`frenzy train job.yaml --nproc N' --tp T' --resume` on another layout.

For each case a gpt-tiny (llama-style, fp32) job trains on one data x tensor parallel layout (gloo, CPU ranks) and is
killed with SIGKILL (the CLI and every process under it: a lost node, no chance to commit) right after the
commit of step 10; then `frenzy train --resume` on another layout trains it to step 30. Measured: steps lost (the
newest commit before the kill against the step the resume starts from), the final loss against an uninterrupted
one-process run and against a resume on the same layout (relative differences), whether every step's global batch
has the uninterrupted run's sample ids in the same order (`FRENZY_SAMPLE_LOG=1`), and the seconds from the kill to
the resumed run's first step record (CLI and rank start, rendezvous, reading and resharding the checkpoint, one
step). A same-layout row (DP2 -> DP2) is the control for the time.

    python benchmarks/elastic_resume.py      # writes benchmarks/results/elastic_resume.{json,md}
"""

from __future__ import annotations

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

from benchmarks.checkpoint_interval import kill_job  # noqa: E402
from tasks.training import checkpoint as ck  # noqa: E402
from tasks.training.data import sample_order  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402

STEPS, KILL_AFTER = 30, 10
MODEL = {"preset": "gpt-tiny", "mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False, "kv_heads": 2}
CASES = {"DP2 -> DP2 (same layout)": ((2, 1), (2, 1)), "DP2 -> DP1": ((2, 1), (1, 1)),
         "DP1 -> DP2": ((1, 1), (2, 1)), "TP2 -> TP1": ((2, 2), (1, 1)), "DP2 -> DP2 x TP2": ((2, 1), (4, 2)),
         "DP1 x TP2 -> DP2": ((2, 2), (2, 1))}
ENV = {**os.environ, "FRENZY_SAMPLE_LOG": "1", "OMP_NUM_THREADS": "1"}


def _job(tmp: Path, name: str) -> Path:  # the same steps everywhere: the LR schedule depends on them
    doc = {"name": "elastic", "model": MODEL, "training": {
        "seq_len": 64, "global_batch": 8, "micro_batch": 4, "precision": "fp32", "steps": STEPS, "lr": 3e-3,
        "warmup_steps": 5, "log_every_steps": 1, "trace_every_steps": 0,
        "checkpoint": {"every_steps": 5, "uri": f"file://{tmp}/{name}/ck", "keep": 5}}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _train(job: Path, run: Path, layout: tuple[int, int], *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "cli", "train", str(job), "--nproc", str(layout[0]), "--tp", str(layout[1]),
           "--device", "cpu", "--threads", "1", "--run-dir", str(run), *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=open(f"{run}.log", "wb"),
                            start_new_session=True)


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "progress.jsonl").read_text().splitlines() if x.strip()]


def _kill_after_commit(tmp: Path, slug: str, layout: tuple[int, int]) -> tuple[float, int]:
    """Start the first layout, SIGKILL the job once step KILL_AFTER is committed: (wall time of the kill, the
    newest committed step then)."""
    p = _train(_job(tmp, slug), tmp / slug / "a", layout)
    st = Storage(f"file://{tmp}/{slug}/ck")
    while not any(m.step >= KILL_AFTER for m in ck.committed(st)):
        if p.poll() is not None:
            raise RuntimeError(Path(f"{tmp / slug / 'a'}.log").read_text()[-2000:])
        time.sleep(0.02)
    kill_job(p)
    return time.time(), max(m.step for m in ck.committed(st))


def one(tmp: Path, name: str, before: tuple[int, int], after: tuple[int, int], ref: dict) -> dict:
    slug = "".join(c for c in name if c.isalnum())
    (tmp / slug).mkdir()
    t_kill, newest = _kill_after_commit(tmp, slug, before)
    p = _train(tmp / f"{slug}.yaml", tmp / slug / "b", after, "--resume")
    if p.wait() != 0:
        raise RuntimeError(Path(f"{tmp / slug / 'b'}.log").read_text()[-2000:])
    res = json.loads((tmp / slug / "b" / "result.json").read_text())
    first = next(r["time"] for r in _records(tmp / slug / "b") if r["event"] == "step")
    order = {**sample_order(tmp / slug / "a", before[1]), **sample_order(tmp / slug / "b", after[1])}  # b's steps override a's
    seen = [i for s in sorted(order) for i in order[s]]
    return {"case": name, "before": before, "after": after, "resumed_from": res["resumed_from_step"],
            "newest_commit_at_kill": newest, "steps_lost": newest - res["resumed_from_step"],
            "final_step": res["final_step"], "loss": res["last_loss"],
            "loss_rel_diff": abs(res["last_loss"] - ref["loss"]) / abs(ref["loss"]),
            "same_samples_in_order": order == ref["order"], "samples_repeated": len(seen) - len(set(seen)),
            "kill_to_first_step_s": first - t_kill}


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="frenzy-elastic-"))
    (tmp / "ref").mkdir()
    if _train(_job(tmp, "ref"), tmp / "ref" / "run", (1, 1)).wait() != 0:
        raise RuntimeError((tmp / "ref" / "run.log").read_text()[-2000:])
    ref_res = json.loads((tmp / "ref" / "run" / "result.json").read_text())
    ref = {"loss": ref_res["last_loss"], "order": sample_order(tmp / "ref" / "run", 1)}
    rows = []
    for n, (b, a) in CASES.items():
        rows.append(one(tmp, n, b, a, ref))
        print(json.dumps(rows[-1]), flush=True)
    same = rows[0]["loss"]
    for r in rows:
        r["loss_rel_diff_vs_same_layout"] = abs(r["loss"] - same) / abs(same)
    doc = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "reference_loss": ref["loss"],
           "machine": f"{os.cpu_count()}-core {platform.machine()}, shared with other sessions, no GPU", "rows": rows}
    out = REPO / "benchmarks" / "results" / "elastic_resume"
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Resume across layouts ({doc['date']})", "", f"Machine: {doc['machine']}. gpt-tiny (llama-style: "
             "swiglu, rmsnorm, rope, 2 kv heads), seq 64, global batch 8, micro-batch 4, fp32, gloo CPU ranks, "
             "checkpoint every 5 steps. `frenzy train --nproc N --tp T` SIGKILLed (the CLI and every process under it, "
             f"frozen first) once step {KILL_AFTER} is committed, then `frenzy train --resume` on the new layout to step {STEPS}. "
             f"Reference: one uninterrupted `frenzy train` process (final loss {ref['loss']:.6f}). "
             "Command: `python benchmarks/elastic_resume.py`.", "",
             "| case | newest commit at kill | resumed from | steps lost | final loss | rel. diff vs uninterrupted | "
             "rel. diff vs same-layout resume | same samples, same order | samples repeated | kill -> first step (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['newest_commit_at_kill']} | {r['resumed_from']} | {r['steps_lost']} | "
                     f"{r['loss']:.6f} | {r['loss_rel_diff']:.1e} | {r['loss_rel_diff_vs_same_layout']:.1e} | "
                     f"{'yes' if r['same_samples_in_order'] else 'NO'} | {r['samples_repeated']} | "
                     f"{r['kill_to_first_step_s']:.1f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
