"""Generation speed of the evaluation engine: the KV-cached batched decoder against per-token recomputation, and
against `transformers` `generate` on the same weights.

The same random-initialised model (gpt-tiny and gpt-mini by default, context 512) and 16 prompts of 40-90 bytes; 256 new tokens
each, greedy. `recompute` is generation as the engine did it before (a full forward over the window per token, one
prompt at a time); `cached` is `LM.generate_batch` (one prefill, then one position per token, all 16 rows at once).
Both must produce the same tokens (checked). Reports generated tokens/s of each and the ratio.

Against transformers: the model exported with `export_hf` (GPT2LMHeadModel), loaded by `AutoModelForCausalLM`
(fp32, its default SDPA attention), `generate` greedy on the same left-padded token rows with their attention mask,
exactly `--new` tokens; Frenzy's `decode.greedy` on the same rows. The two alternate for `--rounds` rounds (the
machine is shared: alternating keeps drift out of the ratio); the table gives the median of each and the median of
the per-round ratios, and every round must produce the same tokens.

    python benchmarks/decode.py       # writes benchmarks/results/decode.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
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


def _top_ops(fn, n: int = 5) -> list[dict]:  # noqa: ANN001 - a generation to profile
    """Where a generation's time goes: the `n` ops with the most self CPU time (torch.profiler), with their share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ops) or 1
    return [{"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6,
             "share": e.self_cpu_time_total / total} for e in ops[:n]]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def against_transformers(preset: str, seq_len: int, batch: int, new: int, rounds: int, device: str = "cpu",
                         dtype: str = "float32", profile_ops: bool = True) -> dict:
    """Frenzy's greedy decoder against `transformers` `generate` on the same exported weights and token rows, on
    `device` in `dtype` (both models cast alike)."""
    import transformers

    from tasks.evaluation.decode import greedy
    from tasks.hf.convert import export_hf

    spec = ModelSpec.model_validate({"preset": preset})
    torch.manual_seed(0)
    state = GPT(spec, seq_len).state_dict()
    lm = LM(state, ModelInfo(model=spec.model_dump(), seq_len=seq_len), device=device)
    lm.model.to(getattr(torch, dtype))
    with tempfile.TemporaryDirectory() as tmp:
        hf = transformers.AutoModelForCausalLM.from_pretrained(export_hf(state, spec, seq_len, Path(tmp) / "m"),
                                                               dtype=getattr(torch, dtype)).to(device).eval()
    hf.generation_config.eos_token_id = hf.generation_config.bos_token_id = None  # byte model: no end-of-text
    rows = [list(f"def function_{i}(x, y):\n    # {'compute ' * (i % 6 + 3)}the result\n    return".encode())
            for i in range(batch)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)

    def run_hf() -> list[list[int]]:
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)
        return out[:, width:].tolist()

    run_hf(), greedy(lm.model, rows, 8), run_hf(), greedy(lm.model, rows, 8)  # warm-up: the full batch (its kernels)
    profile = ({"transformers": _top_ops(run_hf), "frenzy": _top_ops(lambda: greedy(lm.model, rows, new))}
               if profile_ops else {})
    t_hf, t_fz, same, agree = [], [], True, []
    for _ in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        ref = run_hf()
        _sync(device)
        t_hf.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = greedy(lm.model, rows, new)
        _sync(device)
        t_fz.append(time.perf_counter() - t0)
        same = same and got == ref
        agree.append(sum(a == b for g, r in zip(got, ref, strict=True) for a, b in zip(g, r, strict=True)) / (batch * new))
    tokens = batch * new
    row = {"preset": preset, "params": sum(p.numel() for p in lm.model.parameters()), "seq_len": seq_len,
           "batch": batch, "new_tokens": new, "rounds": rounds, "transformers_tokens_per_s": tokens / statistics.median(t_hf),
           "frenzy_tokens_per_s": tokens / statistics.median(t_fz),
           "speedup": statistics.median(a / b for a, b in zip(t_hf, t_fz, strict=True)),
           "round_speedups": [a / b for a, b in zip(t_hf, t_fz, strict=True)], "same_tokens": same,
           "token_agreement": min(agree), "device": device, "dtype": dtype, "profile": profile}
    print(row, file=sys.stderr, flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["gpt-tiny", "gpt-mini"])
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds against transformers (default 3)")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="torch threads for both (default: cores - 1)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: the comparison with transformers only")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="both models' dtype")
    ap.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")
    ap.add_argument("--no-recompute", action="store_true", help="only the comparison with transformers (the recompute "
                    "baseline takes minutes: gpt-mini makes 6 tokens/s)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="folder for decode[_DEVICE].{json,md}")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import transformers

    on_cpu = a.device == "cpu"
    rows = [measure(p, a.seq_len, a.batch, a.new) for p in a.preset] if on_cpu and not a.no_recompute else []
    hf_rows = [against_transformers(p, a.seq_len, a.batch, a.new, a.rounds, a.device, a.dtype, not a.no_profile)
               for p in a.preset]
    gpu = torch.cuda.get_device_name() if not on_cpu else "no GPU"
    doc = {"date": datetime.now(UTC).date().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, {gpu}",
           "command": "python benchmarks/decode.py " + " ".join(sys.argv[1:]), "threads": a.threads,
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, "rows": rows,
           "against_transformers": hf_rows}
    name = ("decode" if not a.no_recompute else "decode_transformers") if on_cpu else f"decode_{a.device.split(':')[0]}_{a.dtype}"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Generation: KV-cached batched vs per-token recompute ({doc['date']}, {doc['machine']})", "",
             f"`{doc['command']}`; context {a.seq_len}, {a.batch} prompts, {a.new} new tokens each, greedy; "
             "recompute is generation as before (the full window per token, one prompt at a time), cached is "
             f"`LM.generate_batch` (batch {a.batch})", "",
             "| model | parameters | recompute tokens/s | cached tokens/s | speedup (target >= 10x) | same tokens |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['recompute_tokens_per_s']:,.0f} | "
              f"{r['cached_tokens_per_s']:,.0f} | **{r['speedup']:.1f}x** | {r['same_tokens']} |" for r in rows]
    if not rows:
        where = gpu if not on_cpu else "the CPU"
        lines = [f"# Generation on {where}: Frenzy against transformers ({doc['date']}, {doc['machine']})", "",
                 f"`{doc['command']}`"]
    lines += ["", f"## Against `transformers` `generate` (transformers {transformers.__version__}, torch "
              f"{torch.__version__}, {a.device}, {a.dtype}, {a.threads} CPU thread(s), median of {a.rounds} alternating rounds)",
              "", f"The same weights (exported with `export_hf`, loaded by `AutoModelForCausalLM`, {a.dtype}, SDPA), the same "
              f"{a.batch} left-padded rows with their attention mask, {a.new} new tokens, greedy.", "",
              "| model | parameters | transformers tokens/s | Frenzy tokens/s | speedup (target >= 1.5x) | per round | "
              "same tokens (share) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['transformers_tokens_per_s']:,.0f} | "
              f"{r['frenzy_tokens_per_s']:,.0f} | **{r['speedup']:.2f}x** | "
              f"{', '.join(f'{x:.2f}' for x in r['round_speedups'])} | {r['same_tokens']} ({100 * r['token_agreement']:.1f}%) |"
              for r in hf_rows]
    for r in hf_rows:
        lines += ["", f"Where the time goes, {r['preset']} (torch.profiler, one generation each, self CPU time):", ""]
        for who, ops in r["profile"].items():
            lines.append(f"- {who}: " + "; ".join(f"`{o['op']}` {100 * o['share']:.0f}% ({o['calls']} calls)" for o in ops))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["same_tokens"] for r in rows + hf_rows) or not on_cpu else 1


if __name__ == "__main__":
    sys.exit(main())
