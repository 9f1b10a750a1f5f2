"""MARP accuracy: (A) against PyTorch's own accounting of Frenzy's GPT (MemTracker on fake tensors), and
(B) against published peak-memory measurements, side by side with the Frenzy and Megatron formulas.

    python benchmarks/marp_accuracy.py [--quick] [--json out.json]

Writes benchmarks/results/marp_accuracy.md (and .json). Part A takes ~5 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

from cluster.catalog import default_catalog
from tasks.jobspec import parse_job
from tasks.planning.baselines import frenzy_formula_bytes, megatron_formula_bytes
from tasks.planning.layout import Layout
from tasks.planning.memory import GiB, predict_peak_memory
from tasks.planning.tracker import tracked_peak

MiB = 2**20
GPT2S = {"preset": "gpt2-124m"}
BYTE = {"preset": "gpt2-124m", "vocab": 256}
LLAMA_S = {"preset": "llama2-7b", "layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 16, "ffn_hidden": 2816}
GQA_S = dict(LLAMA_S, kv_heads=4)
MQA_B = {"preset": "mistral-7b", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 1, "ffn_hidden": 1408,
         "vocab": 256}
SWIGLU_LN = {"layers": 6, "hidden": 768, "heads": 12, "mlp": "swiglu", "vocab": 256, "bias": False}
GELU_RMS_ROPE = {"layers": 6, "hidden": 768, "heads": 12, "norm": "rmsnorm", "position": "rope", "vocab": 8192}

# (name, model, micro_batch, training overrides)
CONFIGS: list[tuple[str, dict, int, dict]] = [
    ("gpt2-124m b4 s1024", GPT2S, 4, {"seq_len": 1024}),
    ("gpt2-124m b1 s1024", GPT2S, 1, {"seq_len": 1024}),
    ("gpt2-124m b8 s512", GPT2S, 8, {"seq_len": 512}),
    ("gpt2-124m b2 s2048 math", GPT2S, 2, {"seq_len": 2048, "attention": "math"}),
    ("gpt2-124m b4 s1024 full-rc", GPT2S, 4, {"seq_len": 1024, "recompute": "full"}),
    ("gpt2-124m b4 s1024 bf16", GPT2S, 4, {"seq_len": 1024, "precision": "bf16"}),
    ("gpt2-124m b2 s1024 fp32", GPT2S, 2, {"seq_len": 1024, "precision": "fp32"}),
    ("gpt2-124m b4 s1024 fp16-mixed", GPT2S, 4, {"seq_len": 1024, "precision": "fp16-mixed"}),
    ("gpt2-124m b2 s1024 sgd", GPT2S, 2, {"seq_len": 1024, "optimizer": "sgd"}),
    ("byte-124m b4 s1024", BYTE, 4, {"seq_len": 1024}),
    ("byte-124m b16 s1024", BYTE, 16, {"seq_len": 1024}),
    ("byte-124m b8 s512 math", BYTE, 8, {"seq_len": 512, "attention": "math"}),
    ("byte-124m b8 s512 math selective", BYTE, 8, {"seq_len": 512, "attention": "math", "recompute": "selective"}),
    ("byte-124m b4 s1024 math full-rc", BYTE, 4, {"seq_len": 1024, "attention": "math", "recompute": "full"}),
    ("byte-124m b4 s512 fp32 math", BYTE, 4, {"seq_len": 512, "precision": "fp32", "attention": "math"}),
    ("byte-124m b8 s1024 bf16", BYTE, 8, {"seq_len": 1024, "precision": "bf16"}),
    ("byte-124m b8 s1024 bf16 full-rc", BYTE, 8, {"seq_len": 1024, "precision": "bf16", "recompute": "full"}),
    ("gpt2-350m b4 s1024", {"preset": "gpt2-350m"}, 4, {"seq_len": 1024}),
    ("gpt2-350m b2 s1024 math", {"preset": "gpt2-350m"}, 2, {"seq_len": 1024, "attention": "math"}),
    ("gpt2-774m b1 s512", {"preset": "gpt2-774m"}, 1, {"seq_len": 512}),
    ("llama-4L MHA b2 s1024", LLAMA_S, 2, {"seq_len": 1024}),
    ("llama-4L GQA4 b2 s1024", GQA_S, 2, {"seq_len": 1024}),
    ("llama-4L GQA4 b4 s2048", GQA_S, 4, {"seq_len": 2048}),
    ("llama-4L GQA4 b2 s1024 math", GQA_S, 2, {"seq_len": 1024, "attention": "math"}),
    ("llama-4L GQA4 b2 s1024 full-rc", GQA_S, 2, {"seq_len": 1024, "recompute": "full"}),
    ("llama-4L GQA4 b2 s1024 bf16", GQA_S, 2, {"seq_len": 1024, "precision": "bf16"}),
    ("llama-4L GQA4 b1 s1024 fp32", GQA_S, 1, {"seq_len": 1024, "precision": "fp32"}),
    ("mqa byte b8 s512", MQA_B, 8, {"seq_len": 512}),
    ("mqa byte b8 s512 math", MQA_B, 8, {"seq_len": 512, "attention": "math"}),
    ("swiglu+layernorm b8 s512", SWIGLU_LN, 8, {"seq_len": 512}),
    ("swiglu+layernorm b8 s512 math", SWIGLU_LN, 8, {"seq_len": 512, "attention": "math"}),
    ("gelu+rmsnorm+rope b4 s1024", GELU_RMS_ROPE, 4, {"seq_len": 1024}),
    ("gelu+rmsnorm+rope b4 s1024 bf16", GELU_RMS_ROPE, 4, {"seq_len": 1024, "precision": "bf16"}),
    ("llama2-7b-shaped 2L b1 s4096", {"preset": "llama2-7b", "layers": 2}, 1, {"seq_len": 4096}),
    # per-op selective checkpointing (torchtitan's policy)
    ("gpt2-124m b4 s1024 op-rc", GPT2S, 4, {"seq_len": 1024, "recompute": "op"}),
    ("llama-4L GQA4 b2 s1024 op-rc", GQA_S, 2, {"seq_len": 1024, "recompute": "op"}),
    ("llama-4L GQA4 b4 s2048 bf16 op-rc", GQA_S, 4, {"seq_len": 2048, "precision": "bf16", "recompute": "op"}),
    ("llama-4L GQA4 b2 s1024 math op-rc", GQA_S, 2, {"seq_len": 1024, "attention": "math", "recompute": "op"}),
    ("swiglu+layernorm b8 s512 op-rc", SWIGLU_LN, 8, {"seq_len": 512, "recompute": "op"}),
    ("gelu+rmsnorm+rope b4 s1024 bf16 op-rc", GELU_RMS_ROPE, 4, {"seq_len": 1024, "precision": "bf16",
                                                               "recompute": "op"}),
]

# (B) published measurements. metric: allocated = torch.cuda.max_memory_allocated, reserved =
# max_memory_reserved. Each row: source, what it measured, job, layout, GPU, measured GiB.
PUBLISHED = [
    {"source": "NVIDIA/Megatron-LM PR #482 (analysis tool README), H800, Llama2-7B, flash attn, "
               "distributed optimizer; seq 2048 inferred", "metric": "allocated", "gib": 69.1,
     "model": "llama2-7b", "train": {"seq_len": 2048, "distributed_optimizer": True},
     "layout": {"dp": 8, "micro_batch": 2}, "gpu": "H100-80GB"},
    {"source": "NVIDIA/Megatron-LM PR #482, TP2 DP4 mbs4", "metric": "allocated", "gib": 55.7,
     "model": "llama2-7b", "train": {"seq_len": 2048, "distributed_optimizer": True},
     "layout": {"dp": 4, "tp": 2, "micro_batch": 4}, "gpu": "H100-80GB"},
    {"source": "NVIDIA/Megatron-LM PR #482, PP2 DP4 mbs2", "metric": "allocated", "gib": 49.8,
     "model": "llama2-7b", "train": {"seq_len": 2048, "distributed_optimizer": True},
     "layout": {"dp": 4, "pp": 2, "micro_batch": 2}, "gpu": "H100-80GB"},
    {"source": "NVIDIA/Megatron-LM PR #482, TP8 mbs4", "metric": "allocated", "gib": 28.8,
     "model": "llama2-7b", "train": {"seq_len": 2048, "distributed_optimizer": True},
     "layout": {"tp": 8, "micro_batch": 4}, "gpu": "H100-80GB"},
    {"source": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1: Llama 3.1 8B, "
               "FSDP 8, local batch 2, seq 8192, selective AC, no compile (H100 96 GB); selective AC is "
               "train_configs/llama3_8b.toml's selective_ac_option = 'op'", "metric": "reserved",
     "gib": 82.4, "model": "llama3-8b", "train": {"seq_len": 8192, "zero_stage": 3, "recompute": "op"},
     "layout": {"dp": 8, "micro_batch": 2}, "gpu": "H100-80GB"},
    {"source": "pytorch/torchtitan same file, Table 3: FSDP 128, local batch 2, selective AC (op), no compile",
     "metric": "reserved", "gib": 67.0, "model": "llama3-8b",
     "train": {"seq_len": 8192, "zero_stage": 3, "recompute": "op"},
     "layout": {"dp": 128, "micro_batch": 2}, "gpu": "H100-80GB"},
]


def run_tracker(quick: bool) -> list[dict]:
    rows = []
    configs = CONFIGS[::3] if quick else CONFIGS
    for i, (name, model, mb, train) in enumerate(configs, 1):
        job = parse_job({"model": model, "training": dict(train, global_batch=mb)})
        t0 = time.perf_counter()
        truth = tracked_peak(job, mb)["Total"]
        est = predict_peak_memory(job, Layout(micro_batch=mb))
        err = (est.allocated_bytes - truth) / truth
        rows.append({"config": name, "tracker_mib": round(truth / MiB, 1),
                     "marp_mib": round(est.allocated_bytes / MiB, 1), "marp_err": err,
                     "frenzy_err": (frenzy_formula_bytes(job, Layout(micro_batch=mb)) - truth) / truth,
                     "megatron_err": (megatron_formula_bytes(job, Layout(micro_batch=mb)) - truth) / truth,
                     "phase": est.peak_phase, "trace_s": round(time.perf_counter() - t0, 1)})
        print(f"[{i}/{len(configs)}] {name}: tracker {truth / MiB:.0f} MiB, MARP {err:+.1%}", file=sys.stderr)
    return rows


def run_published() -> list[dict]:
    rows = []
    cat = default_catalog()
    for r in PUBLISHED:
        lay = Layout(**r["layout"])
        gb = lay.dp * lay.micro_batch * max(8, lay.pp)  # several micro-batches per step (not stated)
        job = parse_job({"model": {"preset": r["model"]}, "training": dict(r["train"], global_batch=gb)})
        est = predict_peak_memory(job, lay, cat.get(r["gpu"]))
        pred = est.allocated_bytes if r["metric"] == "allocated" else est.reserved_bytes
        meas = r["gib"] * GiB
        rows.append({"source": r["source"], "metric": r["metric"], "layout": lay.label(), "measured_gib": r["gib"],
                     "marp_gib": round(pred / GiB, 1), "marp_err": (pred - meas) / meas,
                     "frenzy_err": (frenzy_formula_bytes(job, lay) - meas) / meas,
                     "megatron_err": (megatron_formula_bytes(job, lay) - meas) / meas})
    return rows


def summary(rows: list[dict]) -> dict:
    def mape(k: str) -> float:
        return statistics.mean(abs(r[k]) for r in rows)
    return {"n": len(rows), "marp_mape": mape("marp_err"), "frenzy_mape": mape("frenzy_err"),
            "megatron_mape": mape("megatron_err"), "marp_worst_under": min(r["marp_err"] for r in rows),
            "marp_worst_over": max(r["marp_err"] for r in rows)}


def markdown(a: list[dict], b: list[dict], sa: dict, sb: dict, cmd: str, secs: float) -> str:
    out = [f"# MARP accuracy\n\nMachine: {platform.machine()} {platform.processor() or ''}, "
           f"{platform.python_version()}, date {date.today()}, `{cmd}`, {secs:.0f} s.\n",
           "## A. Against PyTorch MemTracker on Frenzy's GPT (fake tensors, steady-state step, allocated bytes)\n",
           f"MARP mean abs error **{sa['marp_mape']:.2%}**, worst under {sa['marp_worst_under']:+.2%}, worst over "
           f"{sa['marp_worst_over']:+.2%} over {sa['n']} configurations. Frenzy formula {sa['frenzy_mape']:.1%}, "
           f"Megatron theory {sa['megatron_mape']:.1%}.\n",
           "| config | tracker MiB | MARP MiB | MARP | Frenzy | Megatron | peak phase |", "|---|---|---|---|---|---|---|"]
    out += [f"| {r['config']} | {r['tracker_mib']:,.0f} | {r['marp_mib']:,.0f} | {r['marp_err']:+.1%} | "
            f"{r['frenzy_err']:+.1%} | {r['megatron_err']:+.1%} | {r['phase']} |" for r in a]
    out += ["\n## B. Against published measurements\n",
            f"MARP MAPE **{sb['marp_mape']:.1%}**, Frenzy formula {sb['frenzy_mape']:.1%}, Megatron theory "
            f"{sb['megatron_mape']:.1%} over {sb['n']} rows.\n",
            "| source | metric | layout | measured GiB | MARP GiB | MARP | Frenzy | Megatron |", "|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['source']} | {r['metric']} | {r['layout']} | {r['measured_gib']} | {r['marp_gib']} | "
            f"{r['marp_err']:+.1%} | {r['frenzy_err']:+.1%} | {r['megatron_err']:+.1%} |" for r in b]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every third tracker config")
    ap.add_argument("--json", help="also write the raw rows to this file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    a, b = run_tracker(args.quick), run_published()
    sa, sb = summary(a), summary(b)
    cmd = "python benchmarks/marp_accuracy.py" + (" --quick" if args.quick else "")
    md = markdown(a, b, sa, sb, cmd, time.perf_counter() - t0)
    res = Path(__file__).parent / "results"
    res.mkdir(exist_ok=True)
    if not args.quick:
        (res / "marp_accuracy.md").write_text(md)
        (res / "marp_accuracy.json").write_text(json.dumps({"tracker": a, "published": b, "summary_tracker": sa,
                                                            "summary_published": sb}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"tracker": a, "published": b}, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
