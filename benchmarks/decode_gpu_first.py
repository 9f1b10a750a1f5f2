"""Why a batch's first bf16 generation on a GPU runs 8-12x slower than the ones after it, and what removes it.

Each variant runs in a fresh process (no kernel or plan cache carried over): Frenzy's decoder (`decode.greedy`) on a
randomly initialised preset in `--dtype`, 16 left-padded rows, a warm-up of 8 new tokens on the full batch, then
generation 1 (`--new` tokens: the attention meets key lengths it has not seen) and generation 2 (the same lengths
again). Variants pick the scaled-dot-product-attention backends the decoder may use:
- `default`: torch's choice;
- `no-cudnn`: flash, memory-efficient and math kernels only (torch.nn.attention.sdpa_kernel);
- `cudnn`: cuDNN attention only (where it runs).
For each: seconds of generation 1 and 2, their ratio, and the kernels with the most time in a
further generation over key lengths not met before (rows 160 tokens longer), profiled.

    python benchmarks/decode_gpu_first.py --out DIR          # on a machine with a CUDA GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKENDS = {"default": None, "no-cudnn": ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"], "cudnn": ["CUDNN_ATTENTION"]}


def _rows(batch: int, shift: int) -> list[list[int]]:
    return [list(f"def function_{i + shift}(x, y):\n    # {'compute ' * (i % 6 + 3)}the result\n    return".encode())
            for i in range(batch)]


def variant(preset: str, dtype: str, backend: str, new: int, batch: int, device: str) -> dict:
    """One variant in this process: generation 1 and 2 times and generation 1's top kernels."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(REPO))
    from tasks.evaluation.decode import greedy
    from tasks.evaluation.engine import LM, ModelInfo
    from tasks.jobspec import ModelSpec
    from tasks.training.model import GPT

    spec = ModelSpec.model_validate({"preset": preset})
    torch.manual_seed(0)
    lm = LM(GPT(spec, 512).state_dict(), ModelInfo(model=spec.model_dump(), seq_len=512), device=device)
    lm.model.to(getattr(torch, dtype))
    names = BACKENDS[backend]
    ctx = (lambda: sdpa_kernel([getattr(SDPBackend, n) for n in names])) if names else contextlib.nullcontext
    rows = _rows(batch, 0)

    def gen(n: int, rows: list[list[int]] = rows) -> tuple[float, list[list[int]]]:
        torch.cuda.synchronize() if device == "cuda" else None
        t0 = time.perf_counter()
        with ctx():
            out = greedy(lm.model, rows, n)
        torch.cuda.synchronize() if device == "cuda" else None
        return time.perf_counter() - t0, out

    warm, _ = gen(8)
    g1, out1 = gen(new)
    g2, out2 = gen(new)
    g3, _ = gen(new)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    longer = [list(b"# " * 80) + r for r in rows]  # key lengths generation 1 did not meet: what is it spending on?
    with profile(activities=acts) as prof:
        gen(new, longer)
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    ev = sorted(prof.key_averages(), key=lambda e: -getattr(e, key, 0))
    total = sum(getattr(e, key, 0) for e in ev) or 1
    top = [{"kernel": e.key[:90], "calls": e.count, "share": round(getattr(e, key, 0) / total, 3)} for e in ev[:6]]
    tokens = batch * new
    return {"preset": preset, "dtype": dtype, "backend": backend, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.machine(), "warmup_s": warm,
            "gen1_s": g1, "gen2_s": g2, "gen3_s": g3, "gen1_over_gen2": g1 / g2,
            "tokens_per_s_gen1": tokens / g1, "tokens_per_s_gen2": tokens / g2,
            "same_tokens_gen1_gen2": out1 == out2, "top_kernels_fresh": top}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["gpt-mini", "gpt-100m"])
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--backend", nargs="+", default=list(BACKENDS))
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "decode_gpu_first"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # preset,dtype,backend: run one variant here, print its JSON
    a = ap.parse_args()
    if a.one:
        p, d, b = a.one.split(",")
        try:
            print(json.dumps(variant(p, d, b, a.new, a.batch, a.device)))
        except Exception as e:  # noqa: BLE001 - a backend that cannot run this shape is a result, not a crash
            print(json.dumps({"preset": p, "dtype": d, "backend": b, "error": f"{type(e).__name__}: {str(e)[:300]}"}))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for p in a.preset:
        for d in a.dtype:
            for b in a.backend:
                r = subprocess.run([sys.executable, __file__, "--one", f"{p},{d},{b}", "--new", str(a.new), "--batch",
                                    str(a.batch), "--device", a.device], capture_output=True, text=True, timeout=300)
                line = (r.stdout.strip().splitlines() or [json.dumps({"preset": p, "dtype": d, "backend": b,
                                                                       "error": r.stderr[-300:]})])[-1]
                results.append(json.loads(line))
                print({k: v for k, v in results[-1].items() if k != "top_kernels_fresh"}, flush=True)
                doc = {"machine": platform.node(), "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "results": results}
                (out / "decode_gpu_first.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
