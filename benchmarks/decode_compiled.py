"""The decode step through `torch.compile` (inductor's C++ CPU kernels) against the eager step and `transformers`
`generate`, in process CPU time and wall time (the machine is shared: wall time alone misled an earlier attempt).

The same weights and 16 left-padded byte rows as `benchmarks/decode.py` (`against_transformers`), 256 new tokens,
greedy, 1 thread. Per round, alternating: `generate`, Frenzy's eager step (`FRENZY_DECODE_COMPILE=0` behaviour),
Frenzy's compiled step; every round must give the same tokens from all three. The first compiled generation (the
compilation, once per process and architecture) is timed apart and left out of the rounds.

    flock /tmp/frenzy-heavy.lock nice -n 10 python benchmarks/decode_compiled.py   # prints a markdown table
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.evaluation import decode  # noqa: E402
from tasks.jobspec import ModelSpec  # noqa: E402
from tasks.training.model import GPT  # noqa: E402


def _timed(fn):  # noqa: ANN001, ANN202 - a generation
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - t0


def compare(preset: str, new: int, rounds: int) -> dict:
    import transformers

    from tasks.hf.convert import export_hf

    spec = ModelSpec.model_validate({"preset": preset})
    torch.manual_seed(0)
    model = GPT(spec, 512).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf = transformers.AutoModelForCausalLM.from_pretrained(export_hf(model.state_dict(), spec, 512, Path(tmp) / "m"),
                                                               dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = hf.generation_config.bos_token_id = None
    rows = [list(f"def function_{i}(x, y):\n    # {'compute ' * (i % 6 + 3)}the result\n    return".encode())
            for i in range(16)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])

    def run_hf() -> list[list[int]]:
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)
        return out[:, width:].tolist()

    eager, compiled = decode._CompiledStep(), decode._CompiledStep()
    eager.reason = "benchmark: the eager step"

    def run(step: decode._CompiledStep) -> list[list[int]]:
        decode.STEP = step
        return decode.greedy(model, rows, new)

    _, c_cpu, c_wall = _timed(lambda: run(compiled))  # the compilation (and a first generation)
    assert compiled.fn is not None, compiled.reason
    run_hf(), run(eager)
    t: dict[str, list[tuple[float, float]]] = {"transformers": [], "eager": [], "compiled": []}
    same, loads = True, []
    for _ in range(rounds):
        ref, *hf_t = _timed(run_hf)
        got_e, *e_t = _timed(lambda: run(eager))
        got_c, *c_t = _timed(lambda: run(compiled))
        same = same and ref == got_e == got_c
        for k, v in (("transformers", hf_t), ("eager", e_t), ("compiled", c_t)):
            t[k].append(tuple(v))
        loads.append(os.getloadavg()[0])
        print(preset, {k: v[-1] for k, v in t.items()}, "load", loads[-1], file=sys.stderr, flush=True)

    def ratio(who: str, i: int) -> tuple[float, list[float]]:
        per = [a[i] / b[i] for a, b in zip(t["transformers"], t[who], strict=True)]
        return statistics.median(per), per

    return {"preset": preset, "new": new, "rounds": rounds, "same": same, "compile_cpu_s": c_cpu,
            "compile_wall_s": c_wall, "times": t, "loads": loads,
            "ratios": {f"{who} {m}": ratio(who, i) for who in ("eager", "compiled") for i, m in ((0, "cpu"), (1, "wall"))}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["gpt-tiny", "gpt-mini"])
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    res = [compare(p, a.new, a.rounds) for p in a.preset]
    print("| model | step | speedup over generate, CPU time (median; rounds) | wall time (median; rounds) | "
          "CPU s per generation (median) | same tokens |\n|---|---|---|---|---|---|")
    for r in res:
        for who in ("eager", "compiled"):
            (mc, pc), (mw, pw) = r["ratios"][f"{who} cpu"], r["ratios"][f"{who} wall"]
            cpu = statistics.median(x[0] for x in r["times"][who])
            print(f"| {r['preset']} | {who} | **{mc:.2f}x** ({', '.join(f'{x:.2f}' for x in pc)}) | {mw:.2f}x "
                  f"({', '.join(f'{x:.2f}' for x in pw)}) | {cpu:.2f} | {r['same']} |")
        hf = statistics.median(x[0] for x in r["times"]["transformers"])
        print(f"| {r['preset']} | transformers | | | {hf:.2f} | |")
    for r in res:
        print(f"\n{r['preset']}: compilation + first generation {r['compile_cpu_s']:.1f} s CPU, "
              f"{r['compile_wall_s']:.1f} s wall; load average (1 min) after each round: "
              + ", ".join(f"{x:.1f}" for x in r["loads"]))
    return 0 if all(r["same"] for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
