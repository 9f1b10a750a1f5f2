"""Should `torch.distributed.checkpoint` (DCP) be the engine under Frenzy's checkpoints? Measured, not assumed.

For the same state as `benchmarks/trainer.py` (gpt-100m, fp32, model + AdamW state), `--reps` saves each of:
  * Frenzy's `AsyncCheckpointer` (preallocated snapshot buffers, sha256 manifest, create-only commit): the time the
    caller is blocked (`save(block=True)`, the unstaged worst case) and the time until the commit;
  * `dcp.async_save` (its default staging: a CPU copy of the state dict, then `dcp.save` in a thread): the time the
    call blocks and the time until its future resolves;
  * `dcp.save` (synchronous) and `torch.save` + fsync, for scale.
One process, a world of 1 over gloo (DCP's async path wants a process group). CPU only here: on a GPU the staging
copy is device-to-host, so rerun it where one is available.

    python benchmarks/dcp_engine.py            # writes benchmarks/results/dcp_engine.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.jobspec import parse_job  # noqa: E402
from tasks.training import checkpoint as ck  # noqa: E402
from tasks.training.model import GPT  # noqa: E402
from tasks.training.state import training_tensors  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402


def state(preset: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    spec = parse_job({"name": "dcp", "model": {"preset": preset}, "training": {"seq_len": 64, "global_batch": 2}}).model
    torch.manual_seed(0)
    model = GPT(spec, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, 256, (2, 64))
    model(x, x).backward()
    opt.step()
    return model, opt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt-100m")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    model, opt = state(a.preset)
    tmp = Path(tempfile.mkdtemp(prefix="frenzy-dcp-"))
    res: dict = {"frenzy": [], "dcp_async": [], "dcp_sync": [], "torch_save": []}
    tensors, meta = training_tensors(model, opt, with_model=True)
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    cp = ck.AsyncCheckpointer(Storage(f"file://{tmp}/frenzy"), 0, 1, run="dcp", keep=1, buffers=1)
    cp.prepare(tensors, meta)
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "fingerprint": {}, "trainer": {}}
    for i in range(a.reps):
        t0 = time.perf_counter()
        cp.save(i + 1, tensors, fields, shard_meta=meta, block=True)
        blocked = time.perf_counter() - t0
        cp.wait()
        res["frenzy"].append({"blocked_s": blocked, "done_s": time.perf_counter() - t0})
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        t0 = time.perf_counter()
        fut = dcp.async_save(sd, checkpoint_id=str(tmp / f"dcp-async-{i}"))
        blocked = time.perf_counter() - t0
        fut.result()
        res["dcp_async"].append({"blocked_s": blocked, "done_s": time.perf_counter() - t0})
        t0 = time.perf_counter()
        dcp.save(sd, checkpoint_id=str(tmp / f"dcp-sync-{i}"))
        res["dcp_sync"].append({"blocked_s": time.perf_counter() - t0})
        t0 = time.perf_counter()
        with open(tmp / "t.pt", "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        res["torch_save"].append({"blocked_s": time.perf_counter() - t0})
        print(f"rep {i + 1}: " + ", ".join(f"{k} {v[-1]['blocked_s']:.3f} s" for k, v in res.items()), file=sys.stderr)
    cp.close()
    dist.destroy_process_group()
    shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(r["blocked_s"] for r in v) for k, v in res.items()}
    done = {k: statistics.median(r["done_s"] for r in v) for k, v in res.items() if "done_s" in v[0]}
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
           "no GPU", "command": "python benchmarks/dcp_engine.py " + " ".join(sys.argv[1:]), "state_bytes": nbytes,
           "torch": torch.__version__, "runs": res, "blocked_median_s": med, "done_median_s": done}
    out = REPO / "benchmarks" / "results"
    (out / "dcp_engine.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# DCP as the checkpoint engine? ({doc['date']}, {doc['machine']}, torch {torch.__version__})", "",
             f"`{doc['command']}`; {a.preset} fp32 model + AdamW state, {nbytes / 1e9:.2f} GB, {a.reps} saves each, "
             "medians (the caller's blocked time is what training loses)", "",
             "| engine | blocked | until durable |", "|---|---|---|"]
    names = {"frenzy": "Frenzy AsyncCheckpointer, unstaged save (worst case)", "dcp_async": "dcp.async_save",
             "dcp_sync": "dcp.save", "torch_save": "torch.save + fsync"}
    for k, name in names.items():
        lines.append(f"| {name} | {med[k]:.3f} s | " + (f"{done[k]:.2f} s" if k in done else "(same)") + " |")
    lines += ["", f"dcp.async_save blocks {med['dcp_async'] / med['frenzy']:.1f}x as long as Frenzy's unstaged save "
              "(which the trainer hides further by staging the copy beside the next step: benchmarks/results/"
              "trainer.md)."]
    (out / "dcp_engine.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
