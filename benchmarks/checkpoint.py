"""Checkpoint blocking time and step-time interference: Frenzy's async checkpointer vs synchronous torch.save.

For each model (gpt-100m and gpt-1b, byte vocabulary) it builds the model and AdamW, takes one real training
step (so the optimizer state exists), then measures on the same storage directory:
  * sync:  `torch.save({model, optimizer})` + flush + fsync, the time the loop would block;
  * async: `AsyncCheckpointer.save()` (copy into the preallocated buffer), the time the loop blocks; the
           persist (hash + write + fsync + manifest) runs in the background and is waited for outside the timer.
Then, for the first model, step time while a persist is in flight against step time without one.

    python benchmarks/checkpoint.py                       # both models, writes benchmarks/results/checkpoint.*
    python benchmarks/checkpoint.py --models gpt-100m --reps 3 --dir /tmp/ckbench

Ratios are of medians measured in the same run on the same disk (absolute times belong to one machine and disk;
the ratios are what carries over).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.jobspec import parse_job  # noqa: E402
from tasks.training.checkpoint import AsyncCheckpointer  # noqa: E402
from tasks.training.model import GPT  # noqa: E402
from tasks.training.state import training_tensors  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402

MODELS = {
    # 1B in bf16 (params and Adam moments) so model + optimizer + snapshot fit in 24 GiB; its optimizer state is
    # made by one AdamW step on zero gradients, since a bf16 forward/backward of 1.2B takes over 10 min on 2 cores
    "gpt-100m": {"precision": "fp32", "seq_len": 128, "batch": 2, "real_step": True},
    "gpt-1b": {"precision": "bf16", "seq_len": 32, "batch": 1, "real_step": False},
}


def build(name: str) -> tuple[GPT, torch.optim.Optimizer, dict]:
    cfg = MODELS[name]
    job = parse_job({"model": {"preset": name}, "training": {"seq_len": cfg["seq_len"], "precision": cfg["precision"]}})
    torch.manual_seed(0)
    model = GPT(job.model, cfg["seq_len"])
    if cfg["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt, cfg


def train_step(model: GPT, opt: torch.optim.Optimizer, cfg: dict) -> float:
    t0 = time.perf_counter()
    x = torch.randint(0, 256, (cfg["batch"], cfg["seq_len"]))
    model(x, x).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def sync_save(model: GPT, opt: torch.optim.Optimizer, path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    path.unlink()
    return dt


def measure(name: str, root: Path, reps: int, overlap_steps: int) -> dict:
    print(f"[{name}] building model and taking one step ...", file=sys.stderr, flush=True)
    model, opt, cfg = build(name)
    if cfg["real_step"]:
        step_s = train_step(model, opt, cfg)
    else:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_s = None
    tensors, _ = training_tensors(model, opt, with_model=True)
    state_bytes = sum(t.numel() * t.element_size() for _, t in tensors)
    d = root / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    sync = []
    for i in range(reps):
        sync.append(sync_save(model, opt, d / "sync.pt"))
        print(f"[{name}] sync torch.save+fsync {i + 1}/{reps}: {sync[-1]:.3f}s", file=sys.stderr, flush=True)
    ck = AsyncCheckpointer(Storage(f"file://{d}/async"), 0, 1, run=name, keep=1)
    fields = {"layout": {}, "cursor": {}, "loss": {}, "healthy": True, "trainer": {}, "fingerprint": {}}
    blocked, persist = [], []
    for i in range(reps + 1):  # the first save allocates the buffer: reported apart
        blocked.append(ck.save(i + 1, tensors, fields))
        ck.wait()
        persist.append(ck.records[-1].persist_s)
        print(f"[{name}] async save {i}: blocked {blocked[-1]:.4f}s, persist {persist[-1]:.2f}s", file=sys.stderr,
              flush=True)
    out = {"model": name, "params": sum(p.numel() for p in model.parameters()), "precision": cfg["precision"],
           "state_bytes": state_bytes, "train_step_s": step_s,
           "sync_save_fsync_s": sync, "async_first_blocked_s": blocked[0], "async_blocked_s": blocked[1:],
           "async_persist_s": persist[1:],
           "sync_median_s": statistics.median(sync), "async_blocked_median_s": statistics.median(blocked[1:]),
           "async_persist_median_s": statistics.median(persist[1:])}
    out["blocked_ratio"] = out["sync_median_s"] / out["async_blocked_median_s"]
    if overlap_steps:
        out["overlap"] = overlap(model, opt, cfg, ck, tensors, fields, overlap_steps)
    ck.close()
    shutil.rmtree(d, ignore_errors=True)
    return out


def overlap(model: GPT, opt: torch.optim.Optimizer, cfg: dict, ck: AsyncCheckpointer, tensors: list,
            fields: dict, rounds: int) -> dict:
    """Step time while a persist is in flight vs without: `rounds` x (save, steps until the persist is done,
    as many clean steps)."""
    clean, during = [], []
    for r in range(rounds):
        ck.save(1000 + r, tensors, fields)
        n = 0
        while ck.persisting.is_set():
            dt = train_step(model, opt, cfg)
            if ck.persisting.is_set():  # the persist outlasted the whole step
                during.append(dt)
                n += 1
        ck.wait()
        # as many clean steps right after, so both samples see the same machine state
        clean += [train_step(model, opt, cfg) for _ in range(max(n, 1))]
        print(f"[overlap] round {r + 1}/{rounds}: clean {clean[-1]:.3f}s, during {during[-3:]}", file=sys.stderr,
              flush=True)
    res = {"clean_step_s": clean, "during_persist_step_s": during,
           "clean_median_s": statistics.median(clean),
           "during_median_s": statistics.median(during) if during else None}
    if during:
        res["slowdown"] = res["during_median_s"] / res["clean_median_s"] - 1
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--overlap-rounds", type=int, default=8, help="rounds of the step-time experiment (first model)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--dir", default="benchmarks/.ckbench", help="storage directory (local disk)")
    ap.add_argument("--out", default="benchmarks/results/checkpoint")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    rows = [measure(m, Path(a.dir), a.reps, a.overlap_rounds if i == 0 else 0) for i, m in enumerate(a.models)]
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
           f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, no GPU"
           if not torch.cuda.is_available() else torch.cuda.get_device_name(),
           "torch_threads": torch.get_num_threads(), "persist_nice": int(os.environ.get("FRENZY_PERSIST_NICE", "19")),
           "command": " ".join(["python", *sys.argv]), "wall_s": time.time() - t0, "results": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out + ".json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Checkpoint blocking time ({doc['date']}, {doc['machine']}, torch threads {doc['torch_threads']})",
             "", f"Command: `{doc['command']}`", "",
             "| model | params | state | sync torch.save+fsync | async blocked | ratio | async persist (background) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} ({r['precision']}) | {r['params'] / 1e6:.0f}M | {r['state_bytes'] / 1e9:.2f} GB | "
                     f"{r['sync_median_s']:.2f} s | {r['async_blocked_median_s'] * 1e3:.0f} ms | "
                     f"**{r['blocked_ratio']:.1f}x** | {r['async_persist_median_s']:.2f} s |")
    for r in rows:
        if "overlap" in r and r["overlap"].get("during_median_s"):
            o = r["overlap"]
            lines += ["", f"Step time of {r['model']}: {o['clean_median_s']:.3f} s without a persist, "
                      f"{o['during_median_s']:.3f} s while one runs ({o['slowdown'] * 100:+.1f}%; "
                      f"{len(o['during_persist_step_s'])} steps fully inside a persist)."]
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
