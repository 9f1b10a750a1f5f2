"""GPU check: MARP's predicted peak memory against real training steps, the trainer's checkpoint stall and speed.

Runs Frenzy's own code on one GPU (nothing re-implemented):
  A. memory + speed: for each configuration, the trainer's parts as `Trainer._train_step` drives them
     (`setup.load_data`, `setup.build_model`, `step.StepRunner.compute/apply`) for a few steps, then
     torch.cuda.max_memory_allocated / max_memory_reserved of the steady-state steps against
     `tasks.planning.memory.predict_peak_memory` (allocated and reserved), tokens/s and MFU;
  B. checkpoint stall: `tasks.training.loop.train` (what `frenzy train --device cuda` runs in its rank process) on
     a ~1B model with `checkpoint.every_steps` N and with no checkpoint before the last step: each save's blocked
     time and the step time around it, tokens/s of both, against a synchronous `torch.save` + fsync of the same
     model and optimizer state.

Results go to `--out` as gpu_check.json and gpu_check.md, rewritten after every row (a timeout keeps what ran).

    PYTHONUNBUFFERED=1 python benchmarks/gpu_check.py --out /tmp/gpucheck            # on a GPU, ~5 min on an H100
    python benchmarks/gpu_check.py --out /tmp/gpucheck --smoke                      # tiny sizes, CPU is enough
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cluster.catalog import GPUType, default_catalog  # noqa: E402
from tasks.jobspec import JobSpec, parse_job  # noqa: E402
from tasks.planning.layout import Layout, count_params  # noqa: E402
from tasks.planning.memory import predict_peak_memory  # noqa: E402
from tasks.planning.plans import estimate_step_time  # noqa: E402
from tasks.training import data as D  # noqa: E402
from tasks.training.launch import default_threads  # noqa: E402
from tasks.training.loop import TrainOptions, train  # noqa: E402
from tasks.training.optrace import OpTracer  # noqa: E402
from tasks.training.setup import Dist, build_model, load_data  # noqa: E402
from tasks.training.step import StepRunner  # noqa: E402
from tasks.training.storage import Storage  # noqa: E402

GiB = 2**30
LLAMA_09B = {"preset": "llama2-7b", "layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn_hidden": 5632}

# (name, model, micro batch = global batch, training overrides); the trainer's default precision (bf16-mixed),
# flash attention and fused AdamW unless the row says otherwise
CONFIGS: list[tuple[str, dict, int, dict]] = [
    ("gpt-100m b8 s1024", {"preset": "gpt-100m"}, 8, {"seq_len": 1024}),
    ("gpt2-124m b8 s1024", {"preset": "gpt2-124m"}, 8, {"seq_len": 1024}),
    ("gpt2-124m b4 s1024 math", {"preset": "gpt2-124m"}, 4, {"seq_len": 1024, "attention": "math"}),
    ("gpt2-350m b8 s2048", {"preset": "gpt2-350m"}, 8, {"seq_len": 2048}),
    ("gpt2-350m b8 s2048 full-rc", {"preset": "gpt2-350m"}, 8, {"seq_len": 2048, "recompute": "full"}),
    ("gpt2-774m b8 s1024", {"preset": "gpt2-774m"}, 8, {"seq_len": 1024}),
    ("gpt2-774m b8 s1024 op-rc", {"preset": "gpt2-774m"}, 8, {"seq_len": 1024, "recompute": "op"}),
    ("llama-0.85b GQA4 b8 s2048", LLAMA_09B, 8, {"seq_len": 2048}),
    ("llama-0.85b GQA4 b8 s2048 op-rc", LLAMA_09B, 8, {"seq_len": 2048, "recompute": "op"}),
    ("gpt-1b b8 s1024", {"preset": "gpt-1b"}, 8, {"seq_len": 1024}),
    ("gpt-1b b16 s2048 full-rc", {"preset": "gpt-1b"}, 16, {"seq_len": 2048, "recompute": "full"}),
    ("gpt2-1.5b b4 s1024", {"preset": "gpt2-1.5b"}, 4, {"seq_len": 1024}),
    ("gpt2-1.5b b8 s1024 full-rc", {"preset": "gpt2-1.5b"}, 8, {"seq_len": 1024, "recompute": "full"}),
    ("gpt2-1.5b b4 s1024 bf16", {"preset": "gpt2-1.5b"}, 4, {"seq_len": 1024, "precision": "bf16"}),
]
# Held out (chosen 2026-11-27 before any of them ran, after the correction fitted on CONFIGS above): shapes,
# precisions and recompute modes the fit never saw (large vocabularies, MQA, selective recompute, fp16-mixed,
# fp32, micro-batch 1 and 32, seq 512 and 4096, a 7B model), for `--set heldout` on an H200.
QWEN_1B = {"preset": "qwen2-7b", "layers": 12, "hidden": 2048, "heads": 16, "kv_heads": 2, "ffn_hidden": 11008}
LLAMA3_MQA = {"preset": "llama3-8b", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 1, "ffn_hidden": 8192}
MISTRAL_2B = {"preset": "mistral-7b", "layers": 12, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn_hidden": 8192}
LLAMA3_3B = {"preset": "llama3-8b", "layers": 16, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn_hidden": 8192}
HELDOUT_CONFIGS: list[tuple[str, dict, int, dict]] = [
    ("gpt2-124m b1 s4096", {"preset": "gpt2-124m"}, 1, {"seq_len": 4096}),
    ("gpt2-350m b32 s512", {"preset": "gpt2-350m"}, 32, {"seq_len": 512}),
    ("gpt2-350m b8 s1024 fp32", {"preset": "gpt2-350m"}, 8, {"seq_len": 1024, "precision": "fp32"}),
    ("gpt2-774m b8 s1024 fp16-mixed", {"preset": "gpt2-774m"}, 8, {"seq_len": 1024, "precision": "fp16-mixed"}),
    ("bert-large b16 s512", {"preset": "bert-large"}, 16, {"seq_len": 512}),
    ("qwen2-shape 1.1b vocab152k b4 s4096", QWEN_1B, 4, {"seq_len": 4096}),
    ("llama3-shape MQA vocab128k b16 s1024", LLAMA3_MQA, 16, {"seq_len": 1024}),
    ("gpt-1b b4 s4096 selective-rc", {"preset": "gpt-1b"}, 4, {"seq_len": 4096, "recompute": "selective"}),
    ("mistral-shape 1.6b b8 s2048 op-rc", MISTRAL_2B, 8, {"seq_len": 2048, "recompute": "op"}),
    ("gpt2-1.5b b2 s2048 bf16 selective-rc", {"preset": "gpt2-1.5b"}, 2,
     {"seq_len": 2048, "precision": "bf16", "recompute": "selective"}),
    ("llama3-shape 2.7b b4 s2048 full-rc", LLAMA3_3B, 4, {"seq_len": 2048, "recompute": "full"}),
    ("llama2-7b b1 s2048 full-rc", {"preset": "llama2-7b"}, 1, {"seq_len": 2048, "recompute": "full"}),
]
# Held out again (chosen 2026-11-27 before any of them ran, after the full/op recompute term was fitted on the H100
# rows of CONFIGS, so its first unseen test), for `--set heldout2` on one H100 80GB: GQA ratios 2, 5, 6, 7 and 12,
# head_dim 64 at 32 heads, tied large vocabularies (152k, 256k), vocab 32k-256k, seq 256 and 8192, micro-batch 1-64,
# fp16-mixed with recompute, fp32 with Adam, SGD (bf16-mixed and pure bf16), math attention at seq 2048, 0.11B-7.2B;
# eight rows recompute (four full, two op, two selective).
QWEN2_05B = {"preset": "qwen2-7b", "layers": 24, "hidden": 896, "heads": 14, "kv_heads": 2, "ffn_hidden": 4864,
             "tied_embeddings": True}
LLAMA_03B = {"preset": "llama2-7b", "layers": 16, "hidden": 1024, "heads": 16, "kv_heads": 8, "ffn_hidden": 2816}
LLAMA_GQA12 = {"preset": "llama3-8b", "layers": 16, "hidden": 1536, "heads": 24, "kv_heads": 2, "ffn_hidden": 4096,
               "vocab": 100352}
GEMMA_1B = {"preset": "llama2-7b", "layers": 18, "hidden": 1536, "heads": 12, "kv_heads": 2, "ffn_hidden": 6144,
            "vocab": 256000, "tied_embeddings": True}
LLAMA32_1B = {"preset": "llama3-8b", "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn_hidden": 8192,
              "tied_embeddings": True}
LLAMA_GQA5 = {"preset": "llama2-7b", "layers": 20, "hidden": 2560, "heads": 20, "kv_heads": 4, "ffn_hidden": 6912}
GPT_27B = {"preset": "gpt2-1.5b", "layers": 32, "hidden": 2560, "heads": 32, "vocab": 51200}
HELDOUT2_CONFIGS: list[tuple[str, dict, int, dict]] = [
    ("gpt2-124m b64 s256", {"preset": "gpt2-124m"}, 64, {"seq_len": 256}),
    ("bert-base b16 s512 fp32 adam", {"preset": "bert-base"}, 16,
     {"seq_len": 512, "precision": "fp32", "optimizer": "adam"}),
    ("qwen2-shape 0.5b GQA7 tied vocab152k b8 s2048 op-rc", QWEN2_05B, 8, {"seq_len": 2048, "recompute": "op"}),
    ("llama-shape 0.3b GQA2 vocab32k b1 s8192 full-rc", LLAMA_03B, 1, {"seq_len": 8192, "recompute": "full"}),
    ("gpt2-350m b4 s2048 math", {"preset": "gpt2-350m"}, 4, {"seq_len": 2048, "attention": "math"}),
    ("gpt2-350m b64 s1024 full-rc", {"preset": "gpt2-350m"}, 64, {"seq_len": 1024, "recompute": "full"}),
    ("llama-shape 0.7b GQA12 vocab100k b16 s1024 sgd", LLAMA_GQA12, 16, {"seq_len": 1024, "optimizer": "sgd"}),
    ("gemma-shape 1.0b GQA6 tied vocab256k b4 s2048 fp16-mixed selective-rc", GEMMA_1B, 4,
     {"seq_len": 2048, "precision": "fp16-mixed", "recompute": "selective"}),
    ("llama3.2-shape 1.2b tied vocab128k b2 s8192 op-rc", LLAMA32_1B, 2, {"seq_len": 8192, "recompute": "op"}),
    ("llama-shape 1.5b GQA5 vocab32k b4 s4096 fp16-mixed full-rc", LLAMA_GQA5, 4,
     {"seq_len": 4096, "precision": "fp16-mixed", "recompute": "full"}),
    ("gpt2-shape 2.7b vocab51k b2 s2048 selective-rc", GPT_27B, 2, {"seq_len": 2048, "recompute": "selective"}),
    ("mistral-7b b1 s4096 bf16 sgd full-rc", {"preset": "mistral-7b"}, 1,
     {"seq_len": 4096, "precision": "bf16", "optimizer": "sgd", "recompute": "full"}),
]
SMOKE_CONFIGS: list[tuple[str, dict, int, dict]] = [
    ("gpt-tiny b2 s64", {"preset": "gpt-tiny"}, 2, {"seq_len": 64}),
    ("gpt-tiny b2 s64 full-rc", {"preset": "gpt-tiny"}, 2, {"seq_len": 64, "recompute": "full"}),
    ("llama-tiny b2 s64 op-rc", {"preset": "llama2-7b", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
                                 "ffn_hidden": 128, "vocab": 512}, 2, {"seq_len": 64, "recompute": "op"}),
]

CONFIG_SETS = {"fit": CONFIGS, "heldout": HELDOUT_CONFIGS, "heldout2": HELDOUT2_CONFIGS}  # `--set`

@dataclass
class CkptSetup:
    """Part B's job: the model, batch and steps, the interval of the checkpointed run."""

    model: dict
    micro_batch: int
    seq_len: int
    steps: int
    every: int


CKPT = CkptSetup({"preset": "gpt-1b"}, 8, 1024, 150, 50)
CKPT_SMOKE = CkptSetup({"preset": "gpt-tiny"}, 2, 64, 30, 10)


@dataclass
class Report:
    """Everything measured so far; `write()` rewrites the JSON and markdown under `out`."""

    out: Path
    env: dict
    marp: list[dict] = field(default_factory=list)
    checkpoint: dict = field(default_factory=dict)

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        body = {"env": self.env, "marp": self.marp, "marp_summary": marp_summary(self.marp),
                "checkpoint": self.checkpoint}
        (self.out / "gpu_check.json").write_text(json.dumps(body, indent=1))
        (self.out / "gpu_check.md").write_text(markdown(self))


T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def environment(dev: torch.device, cmd: str) -> dict:
    env = {"date": str(date.today()), "command": cmd, "torch": torch.__version__, "python": platform.python_version(),
           "machine": platform.machine(), "cpus": os.cpu_count(), "device": str(dev)}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / GiB, 2), sms=p.multi_processor_count,
                   cuda=torch.version.cuda)
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            env["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError) as err:
            env["nvidia_smi"] = f"unavailable: {err}"
    return env


def make_job(model: dict, mb: int, train_over: dict, steps: int, uri: str, every: int = 10**6) -> JobSpec:
    training = {"global_batch": mb, "micro_batch": mb, "steps": steps, "log_every_steps": 1, "trace_every_steps": 0,
                "warmup_steps": 2, "data": {"tokenizer": "byte"}, "checkpoint": {"uri": uri, "every_steps": every,
                                                                                  "keep": 1}, **train_over}
    return parse_job({"name": "gpucheck", "model": model, "training": training})


def flops_per_token(job: JobSpec) -> float:
    """Model FLOPs per trained token (forward + backward, no recompute counted): 6 x matmul parameters (every block's
    linears and the output head) + 12 x layers x hidden x seq for attention scores (PaLM's convention, no causal
    halving)."""
    m, s = job.model, job.training.seq_len
    pc = count_params(m, s)
    return 6.0 * (m.layers * pc.per_layer_linear + m.vocab * m.hidden) + 12.0 * m.layers * m.hidden * s


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free_memory(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):  # pinned snapshot buffers go back to the OS too
            torch._C._host_emptyCache()


def run_steps(job: JobSpec, dev: torch.device, warm: int, timed: int) -> dict:
    """The trainer's parts for `warm + timed` steps: peak memory of the first `warm` steps and of the steady-state
    ones after them, their step times, and the CUDA context (device memory in use beyond what torch reserved)."""
    d = Dist()
    data = load_data(job, d, Storage(job.training.checkpoint.uri))
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    m = build_model(job, d, dev)
    runner = StepRunner(m, data, job, d, dev, OpTracer(0, 0, 0))
    m.model.train()
    cursor, marks, out = D.Cursor(), [], {}
    for step in range(1, warm + timed + 1):
        loss, _ = runner.compute(step, data.loader.next_indices(cursor), False)
        runner.apply(False)
        if step == warm:
            sync(dev)
            if cuda:
                out["first_steps_alloc"] = torch.cuda.max_memory_allocated(dev)
                out["first_steps_reserved"] = torch.cuda.max_memory_reserved(dev)
                torch.cuda.reset_peak_memory_stats(dev)
        marks.append(time.perf_counter())
    sync(dev)
    marks[-1] = time.perf_counter()  # the last update included
    out["step_s"] = [b - a for a, b in zip(marks[warm - 1:], marks[warm:], strict=False)]
    out["loss"] = loss
    if cuda:
        out["alloc"] = torch.cuda.max_memory_allocated(dev)
        out["reserved"] = torch.cuda.max_memory_reserved(dev)
        free, total = torch.cuda.mem_get_info(dev)
        out["outside_torch"] = total - free - torch.cuda.memory_reserved(dev)
    return out


def marp_row(name: str, model: dict, mb: int, over: dict, dev: torch.device, gpu: GPUType, tmp: Path,
             steps: tuple[int, int]) -> dict:
    job = make_job(model, mb, over, sum(steps), f"file://{tmp}/a-ckpt")
    est = predict_peak_memory(job, Layout(micro_batch=mb), gpu)
    # the planner's step time for this one GPU (no communication term applies)
    pred_step = estimate_step_time(job, Layout(micro_batch=mb), gpu, gpu.link_gbs, gpu.link_gbs, 1)
    row: dict[str, Any] = {"config": name, "params": count_params(job.model, job.training.seq_len).total,
                           "precision": job.training.precision, "recompute": job.training.recompute,
                           "attention": job.training.attention, "micro_batch": mb, "seq_len": job.training.seq_len,
                           "pred_alloc": est.allocated_bytes, "pred_reserved": est.reserved_bytes,
                           "pred_device": est.device_bytes, "pred_phase": est.peak_phase, "pred_step_s": pred_step}
    try:
        got = run_steps(job, dev, *steps)
    except torch.OutOfMemoryError as err:
        row["error"] = f"out of memory: {str(err).splitlines()[0]}"
        return row
    tokens = mb * job.training.seq_len
    step_s = statistics.median(got.pop("step_s"))
    row.update(got, step_s=step_s, tokens_per_s=tokens / step_s, err_step=pred_step / step_s - 1)
    if "alloc" in got:
        row["err_alloc"] = (est.allocated_bytes - got["alloc"]) / got["alloc"]
        row["err_reserved"] = (est.reserved_bytes - got["reserved"]) / got["reserved"]
    if dev.type == "cuda":
        peak = gpu.tflops(job.training.precision) * 1e12
        row["mfu"] = tokens * flops_per_token(job) / step_s / peak
    return row


def part_a(rep: Report, configs: list, dev: torch.device, gpu: GPUType, tmp: Path, steps: tuple[int, int],
           deadline: float) -> None:
    for i, (name, model, mb, over) in enumerate(configs, 1):
        if time.perf_counter() > deadline:
            log(f"A: time budget for part A spent; {len(configs) - i + 1} configurations not run")
            rep.env["a_skipped"] = [c[0] for c in configs[i - 1:]]
            break
        try:
            row = marp_row(name, model, mb, over, dev, gpu, tmp, steps)
        except Exception as err:  # noqa: BLE001 - one broken row must not lose the others
            traceback.print_exc()
            row = {"config": name, "error": f"{type(err).__name__}: {err}"[:300]}
        free_memory(dev)
        rep.marp.append(row)
        rep.write()
        if "err_alloc" in row:
            log(f"A [{i}/{len(configs)}] {name}: alloc {row['alloc'] / GiB:.2f} GiB pred {row['pred_alloc'] / GiB:.2f} "
                f"({row['err_alloc']:+.1%}), reserved {row['reserved'] / GiB:.2f} pred {row['pred_reserved'] / GiB:.2f} "
                f"({row['err_reserved']:+.1%}), {row['tokens_per_s']:,.0f} tok/s, MFU {row['mfu']:.1%}")
        else:
            log(f"A [{i}/{len(configs)}] {name}: {row.get('error') or 'ran (no CUDA: no memory figures)'}")


def marp_summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if "err_alloc" in r]
    if not ok:
        return {"n": 0}
    out: dict[str, Any] = {"n": len(ok)}
    for k in ("err_alloc", "err_reserved", "err_step"):
        errs = [r[k] for r in ok if k in r]
        if not errs:
            continue
        out[k] = {"mean_abs": statistics.mean(abs(e) for e in errs), "max_abs": max(abs(e) for e in errs),
                  "mean_signed": statistics.mean(errs), "worst_under": min(errs), "worst_over": max(errs)}
    return out


def step_times(recs: list[dict]) -> dict[int, float]:
    """Seconds of each step from the `step` records (each written after its update; the step's host sync precedes
    it, so the differences are the GPU's step times, a save's launch and staged-copy wait included)."""
    steps = [r for r in recs if r["event"] == "step"]
    return {b["step"]: b["time"] - a["time"] for a, b in zip(steps, steps[1:], strict=False)
            if b["step"] == a["step"] + 1}


def stall_figures(recs: list[dict], final: int, tokens_per_step: int) -> dict:
    """Per intermediate checkpoint: its blocked time and the excess of the step after it over the clean median;
    the median step inside and outside persist windows; steady tokens/s (steps 6 to the last)."""
    dur = step_times(recs)
    commits = [r for r in recs if r["event"] == "checkpoint"]
    saved = {c["step"] for c in commits}
    windows = [(c["time"] - c["persist_s"], c["time"]) for c in commits]
    steps = {r["step"]: r["time"] for r in recs if r["event"] == "step"}
    clean, during = [], []
    for s, dt in dur.items():
        if s <= 5 or s - 1 in saved or s in saved:
            continue
        busy = any(steps[s] - dt < e and steps[s] > b for b, e in windows)
        (during if busy else clean).append(dt)
    base = statistics.median(clean or during or [0.0])
    inter = [c for c in commits if c["step"] != final]
    first, last = min(steps), max(steps)
    steady = (tokens_per_step * (last - max(first, 5)) / (steps[last] - steps[max(first, 5)])
              if last > max(first, 5) else None)
    return {"saves": [{"step": c["step"], "blocked_s": c["blocked_s"], "wait_s": c.get("wait_s"),
                       "drag_s": c.get("drag_s"), "persist_s": c["persist_s"],
                       "deferred_steps": c.get("deferred_steps", 0),
                       "next_step_excess_s": dur.get(c["step"] + 1, base) - base} for c in inter],
            "final_save": next(({"blocked_s": c["blocked_s"], "persist_s": c["persist_s"]} for c in commits
                                if c["step"] == final), None),
            "deferrals": sum(1 for r in recs if r["event"] == "checkpoint_deferred"),
            "clean_step_s": base, "step_s_during_persist": statistics.median(during) if during else None,
            "steady_tokens_per_s": steady}


def trainer_run(cs: CkptSetup, every: int, dev: torch.device, base: Path, tag: str, buffers: str | None = None) -> dict:
    """`tasks.training.loop.train` (the rank process of `frenzy train`), checkpoints under `base/tag`; `buffers`
    forces the snapshot buffer count (`FRENZY_SNAPSHOT_BUFFERS`), None leaves the trainer's choice."""
    root = base / tag
    shutil.rmtree(root, ignore_errors=True)
    job = make_job(cs.model, cs.micro_batch, {"seq_len": cs.seq_len}, cs.steps, f"file://{root}/ckpt", every)
    opts = TrainOptions(job=job, run_dir=root / "run", device=dev.type, threads=default_threads(1))
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    before = os.environ.pop("FRENZY_SNAPSHOT_BUFFERS", None)
    if buffers:
        os.environ["FRENZY_SNAPSHOT_BUFFERS"] = buffers
    t0 = time.perf_counter()
    try:
        res = train(opts)
    finally:
        os.environ.pop("FRENZY_SNAPSHOT_BUFFERS", None)
        if before is not None:
            os.environ["FRENZY_SNAPSHOT_BUFFERS"] = before
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in (root / "run" / "progress.jsonl").read_text().splitlines()]
    tokens = cs.micro_batch * cs.seq_len
    out = {"every_steps": every, "snapshot_buffers": buffers or "trainer's choice", "steps": cs.steps, "wall_s": wall,
           "tokens_per_s": res.tokens_per_s, "loop_s": cs.steps * tokens / res.tokens_per_s,
           "blocked_s_total": res.blocked_s_total, "checkpoint_bytes": res.checkpoints[-1].bytes,
           "snapshot_pin_s": res.snapshot_pin_s,
           **stall_figures(recs, cs.steps, tokens),
           "step_s": {s: round(v, 4) for s, v in sorted(step_times(recs).items())}}
    if dev.type == "cuda":
        out["peak_alloc"] = torch.cuda.max_memory_allocated(dev)
        out["peak_reserved"] = torch.cuda.max_memory_reserved(dev)
    shutil.rmtree(root, ignore_errors=True)
    return out


def pinned_alloc_s(nbytes: int, dev: torch.device) -> float | None:
    """Seconds to allocate one pinned host buffer of `nbytes` (what a snapshot buffer costs), alone."""
    if dev.type != "cuda":
        return None
    t0 = time.perf_counter()
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    secs = time.perf_counter() - t0
    del buf
    free_memory(dev)
    return secs


def sync_save(cs: CkptSetup, dev: torch.device, base: Path) -> dict:
    """The baseline: the same model and optimizer state (after one step) saved with `torch.save` + fsync."""
    job = make_job(cs.model, cs.micro_batch, {"seq_len": cs.seq_len}, 1, f"file://{base}/sync-ckpt")
    d = Dist()
    data = load_data(job, d, Storage(job.training.checkpoint.uri))
    m = build_model(job, d, dev)
    runner = StepRunner(m, data, job, d, dev, OpTracer(0, 0, 0))
    runner.compute(1, data.loader.next_indices(D.Cursor()), False)
    runner.apply(False)
    sync(dev)
    path = base / "sync.pt"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save({"model": m.core.state_dict(), "optimizer": m.optimizer.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    secs = time.perf_counter() - t0
    size = path.stat().st_size
    path.unlink()
    return {"blocked_s": secs, "bytes": size}


def ckpt_dir(requested: str | None, need: int) -> Path:
    """Where part B writes: the requested directory, else the first of /dev/shm and /tmp with room for three
    checkpoints (two in flight and the one kept). tmpfs first: the async save's stall does not depend on the
    storage's speed, the synchronous baseline's does, and tmpfs is the fastest it can get (a conservative ratio);
    a slow disk would only lengthen the persists and the run."""
    cands = [Path(requested)] if requested else [Path("/dev/shm/frenzy-gpucheck"), Path("/tmp/frenzy-gpucheck")]
    for c in cands:
        c.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(c).free > 3 * need or requested:
            return c
    return cands[-1]


def parse_run(tag: str) -> tuple[int, str | None]:
    """`none`, `every50`, `none-buf1`, `every50-buf2`: (checkpoint interval, forced snapshot buffers)."""
    name, _, buf = tag.partition("-buf")
    return (int(name[5:]) if name.startswith("every") else 10**6), (buf or None)


def part_b(rep: Report, cs: CkptSetup, dev: torch.device, requested_dir: str | None, runs: list[str],
           with_sync: bool = True, probe: bool = True) -> None:
    job = make_job(cs.model, cs.micro_batch, {"seq_len": cs.seq_len}, cs.steps, "file:///x")
    state = count_params(job.model, cs.seq_len).total * 12  # fp32 weights + two fp32 moments
    base = ckpt_dir(requested_dir, state)
    ck = rep.checkpoint
    ck.update(model=cs.model, micro_batch=cs.micro_batch, seq_len=cs.seq_len, steps=cs.steps, dir=str(base),
              dir_free_gib=round(shutil.disk_usage(base).free / GiB, 1),
              pinned_alloc_s=pinned_alloc_s(state, dev) if probe else None)
    log(f"B: {cs.model} b{cs.micro_batch} s{cs.seq_len}, {cs.steps} steps, checkpoints under {base}; one pinned "
        f"buffer of {state / 1e9:.1f} GB alone: {ck['pinned_alloc_s']} s")
    for tag in runs:
        every, buffers = parse_run(tag)
        try:
            ck[tag] = trainer_run(cs, every, dev, base, tag, buffers)
        except Exception as err:  # noqa: BLE001 - keep what the other runs measured
            traceback.print_exc()
            ck[tag] = {"error": f"{type(err).__name__}: {err}"[:300]}
        free_memory(dev)
        rep.write()
        r = ck[tag]
        slow = {k: v for k, v in r.get("step_s", {}).items() if v > 3 * r.get("clean_step_s", 1e9)}
        log(f"B {tag}: " + (r["error"] if "error" in r else
                            f"{r['tokens_per_s']:,.0f} tok/s (steady {r['steady_tokens_per_s'] or 0:,.0f}), "
                            f"blocked {[round(s['blocked_s'], 4) for s in r['saves']]} s (wait "
                            f"{[round(s['wait_s'] or 0, 4) for s in r['saves']]}), slow steps {slow}, "
                            f"pinned after {r.get('snapshot_pin_s')} s, first steps "
                            f"{[r['step_s'].get(k) for k in range(2, 6)]}, "
                            f"final {r['final_save']}, wall {r['wall_s']:.0f} s"))
    if not with_sync:
        return
    try:
        ck["sync"] = sync_save(cs, dev, base)
        log(f"B sync torch.save + fsync: {ck['sync']['blocked_s']:.2f} s for {ck['sync']['bytes'] / 1e9:.2f} GB")
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        ck["sync"] = {"error": f"{type(err).__name__}: {err}"[:300]}
    free_memory(dev)
    rep.write()


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v / GiB:.2f}"


def _step_cells(r: dict) -> str:
    """The predicted step and its error; '- | -' for a row recorded before the prediction was (gpu_h100/h200.json)."""
    if "pred_step_s" not in r:
        return "- | -"
    return f"{r['pred_step_s']:.4f} | {r['err_step']:+.1%}"


def _marp_md(rows: list[dict]) -> list[str]:
    s = marp_summary(rows)
    out = ["## A. MARP's prediction against measured peak memory (steady-state steps), speed\n"]
    if s["n"]:
        a, r = s["err_alloc"], s["err_reserved"]
        out.append(f"Allocated: mean abs error **{a['mean_abs']:.1%}**, max abs {a['max_abs']:.1%} (mean signed "
                   f"{a['mean_signed']:+.1%}, {a['worst_under']:+.1%} to {a['worst_over']:+.1%}); reserved: mean abs "
                   f"**{r['mean_abs']:.1%}**, max abs {r['max_abs']:.1%} (mean signed {r['mean_signed']:+.1%}), "
                   f"over {s['n']} configurations.\n")
        if "err_step" in s:
            t = s["err_step"]
            out.append(f"Step time (the planner's `estimate_step_time` for this GPU): mean abs error "
                       f"**{t['mean_abs']:.1%}**, max abs {t['max_abs']:.1%} ({t['worst_under']:+.1%} to "
                       f"{t['worst_over']:+.1%}).\n")
    out += ["| config | params | alloc GiB | MARP | err | reserved GiB | MARP | err | first steps alloc | outside torch "
            "GiB | tokens/s | MFU | step s | MARP | err |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "err_alloc" not in r:
            out.append(f"| {r['config']} | {r.get('params', 0) / 1e9:.2f}B | {r.get('error', 'no CUDA')} |"
                       + " |" * 12)
            continue
        out.append(f"| {r['config']} | {r['params'] / 1e9:.2f}B | {_gib(r['alloc'])} | {_gib(r['pred_alloc'])} | "
                   f"{r['err_alloc']:+.1%} | {_gib(r['reserved'])} | {_gib(r['pred_reserved'])} | "
                   f"{r['err_reserved']:+.1%} | {_gib(r['first_steps_alloc'])} | {_gib(r['outside_torch'])} | "
                   f"{r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {r['step_s']:.4f} | {_step_cells(r)} |")
    return out


def _join(saves: list[dict], key: str, fmt: str) -> str:
    return ", ".join(format(s[key], fmt) for s in saves) or "-"


def _ckpt_md(ck: dict) -> list[str]:
    out = ["\n## B. Checkpoint stall in the trainer (`tasks.training.loop.train`)\n",
           f"{ck.get('model')} micro-batch {ck.get('micro_batch')} seq {ck.get('seq_len')}, {ck.get('steps')} steps, "
           f"checkpoints under {ck.get('dir')} ({ck.get('dir_free_gib')} GiB free).\n",
           "| run | tokens/s | steady tokens/s | blocked per save (s) | step after a save, excess (s) | deferred | "
           "persist (s) | final save blocked (s) | clean step (s) | step during persist (s) | peak alloc GiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for tag in [k for k in ck if k.startswith(("none", "every"))]:
        r = ck[tag]
        if "error" in r:
            out.append(f"| {tag} | {r['error']} |" + " |" * 9)
            continue
        sv = r["saves"]
        during = r["step_s_during_persist"]
        out.append(f"| {tag} | {r['tokens_per_s']:,.0f} | {r['steady_tokens_per_s'] or 0:,.0f} | "
                   f"{_join(sv, 'blocked_s', '.4f')} | {_join(sv, 'next_step_excess_s', '+.3f')} | {r['deferrals']} | "
                   f"{_join(sv, 'persist_s', '.1f')} | "
                   f"{(r['final_save'] or {}).get('blocked_s', 0):.2f} | {r['clean_step_s']:.4f} | "
                   f"{'-' if during is None else f'{during:.4f}'} | {_gib(r.get('peak_alloc'))} |")
    sy = ck.get("sync", {})
    if "blocked_s" in sy:
        out.append(f"\nSynchronous `torch.save` + fsync of the same state ({sy['bytes'] / 1e9:.2f} GB): "
                   f"**{sy['blocked_s']:.2f} s** blocked.")
        ev = ck.get(next((k for k in ck if k.startswith("every")), ""), {})
        if ev.get("saves"):
            med = statistics.median(s["blocked_s"] for s in ev["saves"])
            out.append(f"Async median blocked per intermediate save {med:.4f} s: {sy['blocked_s'] / max(med, 1e-9):,.0f}x "
                       "less.")
    elif sy:
        out.append(f"\nSynchronous save: {sy.get('error')}")
    return out


def markdown(rep: Report) -> str:
    e = rep.env
    head = [f"# GPU check\n\n{e.get('gpu', e['device'])} ({e.get('nvidia_smi', '')}), torch {e['torch']}, CUDA "
            f"{e.get('cuda')}, Python {e['python']}, {e['cpus']} CPUs, {e['date']}, `{e['command']}`.\n"]
    parts = _marp_md(rep.marp) if rep.marp else []
    parts += _ckpt_md(rep.checkpoint) if rep.checkpoint else []  # a part skipped (--skip) gets no section
    return "\n".join(head + parts) + "\n"


def third_party_modules() -> list[str]:
    """Top-level modules imported from outside the standard library and this repository (what the device needs)."""
    mine = {p.name for p in REPO.iterdir()}
    return sorted({n.split(".")[0] for n in sys.modules} - set(sys.stdlib_module_names) - mine - {"__main__"}
                  - {n for n in {x.split(".")[0] for x in sys.modules} if n.startswith("_")})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for gpu_check.json and gpu_check.md")
    ap.add_argument("--smoke", action="store_true", help="tiny models, few steps (checks the script on a CPU)")
    ap.add_argument("--set", choices=list(CONFIG_SETS), default="fit",
                    help="part A's configurations: those the memory model was corrected on (fit), or a held-out set")
    ap.add_argument("--gpu", help="catalog GPU type MARP predicts for (default: the device's name, else H100-80GB)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--ckpt-dir", help="where part B writes checkpoints (default: /tmp, else /dev/shm)")
    ap.add_argument("--budget-a-s", type=float, default=150.0, help="part A starts no configuration after this")
    ap.add_argument("--skip", choices=["a", "b"], help="leave out one part")
    ap.add_argument("--no-sync", action="store_true", help="leave out part B's synchronous torch.save baseline")
    ap.add_argument("--b-steps", type=int, help="part B's steps (default 150)")
    ap.add_argument("--no-alloc-probe", action="store_true", help="leave out part B's lone pinned-buffer allocation")
    ap.add_argument("--b-runs", nargs="+", help="part B's runs: none, everyN, with -bufK to force K snapshot buffers")
    args = ap.parse_args()
    dev = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                       else "cpu")
    scratch = Path(tempfile.mkdtemp(prefix="gpucheck-"))
    os.environ.setdefault("FRENZY_CACHE", str(scratch / "cache"))
    rep = Report(Path(args.out), environment(dev, "python " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])))
    rep.write()
    log(f"{rep.env.get('gpu', dev)}; torch {torch.__version__}")
    gpu = default_catalog().get(args.gpu or rep.env.get("gpu") or "H100-80GB")
    log(f"MARP predicts for {gpu.name}")
    tmp = scratch / "work"
    if args.skip != "a":
        full = CONFIG_SETS[args.set]
        configs, steps = (SMOKE_CONFIGS, (2, 2)) if args.smoke else (full, (3, 5))
        part_a(rep, configs, dev, gpu, tmp, steps, time.perf_counter() + args.budget_a_s)
    if args.skip != "b":
        cs = CKPT_SMOKE if args.smoke else CKPT
        cs.steps = args.b_steps or cs.steps
        part_b(rep, cs, dev, args.ckpt_dir, args.b_runs or ["none", f"every{cs.every}"], not args.no_sync,
               not args.no_alloc_probe)
    rep.env["third_party_modules"] = third_party_modules()
    rep.write()
    shutil.rmtree(scratch, ignore_errors=True)
    log(f"done; third-party modules imported: {' '.join(rep.env['third_party_modules'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
