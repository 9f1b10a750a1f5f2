"""Seeded synthetic trace families for held-out checks of the placement policy (benchmarks/placement_load.py).

- `production`: the shape of a production fleet of long single-GPU jobs (issue 26): 99% 1-GPU and 1% 8-GPU jobs;
  run times heavy at the top: ~20% short (5-50 min), ~79% of 4.2-4.7 h, ~1% of 5-24 h (p10 ~27 min, p50 ~4.4 h,
  p99 ~4.7 h, max up to 24 h). Poisson arrivals (the benchmark rescales them to an offered load).
- `mixed`: a wider fleet: 60% 1-GPU, 25% 2-4 GPUs, 15% 8-16 GPUs; log-normal run times (median 1 h, sigma 1.5,
  clipped to 2 min-48 h), Poisson arrivals.

The jobs are traced and rigid, as a production trace's (cluster/traces.py): each keeps its GPU count and runs in its
recorded time on the reference GPU; the model and batch come from the trace rule of `cluster/traces.py` (Pollux
GPU-hour buckets, 16 sequences per GPU, the next smaller GPT-2 where that does not fit the recorded GPUs).
"""

from __future__ import annotations

import math
import random

from cluster.traces import BATCH_PER_GPU, TraceJob, fit_to_record, model_for_gpu_hours, parse_generated

FAMILIES = ("production", "mixed")


def _job(name: str, t: float, d: float, g: int) -> TraceJob:
    return fit_to_record(TraceJob(name=name, submit_s=t, duration_s=d, num_gpus=g, model=model_for_gpu_hours(d * g / 3600),
                                  global_batch=BATCH_PER_GPU * g, elastic=False, traced=True))


def production(n_jobs: int = 400, seed: int = 0, mean_interarrival_s: float = 600.0) -> list[TraceJob]:
    """The production-shaped family (module docstring)."""
    r = random.Random(f"production-{seed}")
    out, t = [], 0.0
    for k in range(n_jobs):
        g = 8 if r.random() < 0.01 else 1
        u = r.random()
        d = r.uniform(300, 3000) if u < 0.2 else r.uniform(4.2 * 3600, 4.7 * 3600) if u < 0.99 else \
            r.uniform(5 * 3600, 24 * 3600)
        t += r.expovariate(1 / mean_interarrival_s)
        out.append(_job(f"prod-{seed}-{k}", t, d, g))
    return out


def mixed(n_jobs: int = 200, seed: int = 0, mean_interarrival_s: float = 600.0) -> list[TraceJob]:
    """The mixed-width family (module docstring)."""
    r = random.Random(f"mixed-{seed}")
    out, t = [], 0.0
    for k in range(n_jobs):
        u = r.random()
        g = 1 if u < 0.6 else r.choice((2, 4)) if u < 0.85 else r.choice((8, 16))
        d = min(48 * 3600.0, max(120.0, math.exp(r.gauss(math.log(3600), 1.5))))
        t += r.expovariate(1 / mean_interarrival_s)
        out.append(_job(f"mixed-{seed}-{k}", t, d, g))
    return out


def parse_synthetic(spec: str) -> list[TraceJob]:
    """`production:N[:SEED]` or `mixed:N[:SEED]` -> the trace."""
    n, seed = parse_generated(spec, FAMILIES, "production:400:1")
    return (production if spec.startswith("production:") else mixed)(n, seed)
