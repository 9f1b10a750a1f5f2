"""How the diagnosis scales on a log whose loss flips between NaN and finite every few lines (issue 45).

A training log (progress lines `step N | loss: X | grad_norm: Y | lr: Z`, an INFO line now and then) whose loss is
NaN for 1-3 prints, then finite for 2-5, over and over: thousands of transitions per MB, each one a place where
`progress.track` looks for the next finite and non-finite loss. The log ends with a CUDA out-of-memory error.
Times the `frenzy diagnose` command (a fresh process) and the library call (in this process), per size.

    python benchmarks/diagnosis_flips.py [--mb 0.5 2 6 50] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.diagnosis.diagnose import diagnose  # noqa: E402

TAIL = ("Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 1.20 GiB is free.\n")


def flipping_log(path: Path, mb: float, seed: int = 0) -> int:
    """Write the log (about `mb` MB); return how many NaN -> finite transitions it holds."""
    rng, step, flips, nan_left, finite_left = random.Random(seed), 0, 0, 0, 0
    with open(path, "w") as f:
        f.write("INFO starting training: model=gpt-small world_size=8\n")
        while f.tell() < mb * 1_000_000:
            step += 1
            if nan_left == 0 and finite_left == 0:
                nan_left, finite_left = rng.randint(1, 3), rng.randint(2, 5)
                flips += 1
            if nan_left:
                nan_left -= 1
                loss, gnorm = "nan", "nan"
            else:
                finite_left -= 1
                loss, gnorm = f"{rng.uniform(1.5, 4.0):.4f}", f"{rng.uniform(0.1, 3.0):.3f}"
            f.write(f"step {step} | loss: {loss} | grad_norm: {gnorm} | lr: {3e-4 * (1 - step / 1e7):.3e}\n")
            if step % 50 == 0:
                f.write(f"INFO step {step}: throughput {rng.randint(90, 110)} samples/s, mem 61.2 GiB\n")
        f.write(TAIL)
    return flips


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[0.5, 2, 6, 50])
    ap.add_argument("--keep", type=Path, help="write the logs here instead of a temporary folder")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"load average {os.getloadavg()[0]:.1f}")
        for mb in a.mb:
            log = folder / f"flips-{mb:g}mb.log"
            flips = flipping_log(log, mb)
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "cli.main", "diagnose", str(log)], cwd=REPO, env=env,
                                 capture_output=True, text=True, check=True).stdout
            cli = time.perf_counter() - t0
            t0 = time.perf_counter()
            d = diagnose(str(log))
            lib = time.perf_counter() - t0
            print(f"{mb:g} MB, {flips:,} transitions: command {cli:.2f} s, library {lib:.2f} s, "
                  f"{d.type}, line {d.root_cause_line[:60]!r}; command says {out.splitlines()[0][:60]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
