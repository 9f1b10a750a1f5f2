"""Generation speed of the evaluation engine: the KV-cached batched decoder against per-token recomputation.

The same random-initialised model (gpt-tiny and gpt-mini by default, context 512) and 16 prompts of 40-90 bytes; 256 new tokens
each, greedy. `recompute` is generation as the engine did it before (a full forward over the window per token, one
prompt at a time); `cached` is `LM.generate_batch` (one prefill, then one position per token, all 16 rows at once).
Both must produce the same tokens (checked). Reports generated tokens/s of each and the ratio.

    python benchmarks/decode.py       # writes benchmarks/results/decode.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.evaluation.engine import LM, ModelInfo  # noqa: E402
from tasks.jobspec import ModelSpec  # noqa: E402
from tasks.training.model import GPT  # noqa: E402


def measure(preset: str, seq_len: int, batch: int, new: int) -> dict:
    spec = ModelSpec.model_validate({"preset": preset})
    torch.manual_seed(0)
    lm = LM(GPT(spec, seq_len).state_dict(), ModelInfo(model=spec.model_dump(), seq_len=seq_len))
    prompts = [f"def function_{i}(x, y):\n    # {'compute ' * (i % 6 + 3)}the result\n    return" for i in range(batch)]
    t0 = time.perf_counter()
    ref = [lm.generate_recompute(p, new) for p in prompts]
    t_re = time.perf_counter() - t0
    lm.generate_batch(prompts[:2], 8)  # warm-up
    t0 = time.perf_counter()
    got = lm.generate_batch(prompts, new)
    t_kv = time.perf_counter() - t0
    tokens = batch * new
    row = {"preset": preset, "params": sum(p.numel() for p in lm.model.parameters()), "seq_len": seq_len,
           "batch": batch, "new_tokens": new, "recompute_tokens_per_s": tokens / t_re,
           "cached_tokens_per_s": tokens / t_kv, "speedup": t_re / t_kv, "same_tokens": got == ref}
    print(row, file=sys.stderr, flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["gpt-tiny", "gpt-mini"])
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    rows = [measure(p, a.seq_len, a.batch, a.new) for p in a.preset]
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
           "no GPU", "command": "python benchmarks/decode.py " + " ".join(sys.argv[1:]), "rows": rows}
    out = REPO / "benchmarks" / "results"
    (out / "decode.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Generation: KV-cached batched vs per-token recompute ({doc['date']}, {doc['machine']})", "",
             f"`{doc['command']}`; context {a.seq_len}, {a.batch} prompts, {a.new} new tokens each, greedy; "
             "recompute is generation as before (the full window per token, one prompt at a time), cached is "
             f"`LM.generate_batch` (batch {a.batch})", "",
             "| model | parameters | recompute tokens/s | cached tokens/s | speedup (target >= 10x) | same tokens |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['recompute_tokens_per_s']:,.0f} | "
              f"{r['cached_tokens_per_s']:,.0f} | **{r['speedup']:.1f}x** | {r['same_tokens']} |" for r in rows]
    (out / "decode.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["same_tokens"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
