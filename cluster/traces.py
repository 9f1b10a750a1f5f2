"""Job traces for the cluster simulator: the generic CSV, Philly and Sia formats, and the Frenzy NewWorkload.

Every reader returns `TraceJob`s sorted by submit time. A trace job is rigid: `duration_s` is its run time on
the reference GPU (`REFERENCE_GPU` unless the caller says otherwise) with the `num_gpus` the user asked for.

**Model attachment rule** (none of the public traces says what model a job trains, so MARP could not plan it):
- a job that names a `model` preset keeps it;
- Sia workloads map the application to a model of similar cost: cifar10 -> gpt2-124m, deepspeech2 -> gpt2-350m,
  bert -> bert-large, yolov3 -> gpt2-774m, imagenet -> gpt2-1.5b;
- otherwise the job's GPU time (`duration_s x num_gpus`) picks the model by the Pollux buckets:
  < 1 GPU-hour gpt2-124m, 1-10 gpt2-350m, 10-100 gpt2-774m, >= 100 gpt2-1.5b.
- The global batch, when the trace has none, is `16 x num_gpus` sequences of 1,024 tokens (16 sequences per
  GPU, what a user sizing for the GPUs they asked for would pick); precision is fp16 mixed (it runs on every
  GPU type of the Sia/Frenzy clusters, including Turing).

**Sia workloads carry no run time** (Sia derives it from per-application throughput profiles that are not
public). We give each application the geometric middle of its Pollux GPU-time bucket: cifar10 0.25 GPU-hours,
deepspeech2 and bert 2, yolov3 15, imagenet 100, times a deterministic factor in [0.5, 2) from the job name,
divided by `num_replicas`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from tasks.errors import FrenzyError
from tasks.userfiles import LIMITS, UserFileError, open_user_file, path_kind, read_text

TraceFormat = Literal["generic", "philly", "sia"]
REFERENCE_GPU = "A100-40GB-SXM"
PolicyName = Literal["has", "has-arrival", "has-sjf", "fcfs", "fifo", "ilp"]
POLICIES: tuple[str, ...] = ("has", "fcfs", "fifo", "ilp")
"""Policies compared by default. Also accepted: `has-sjf` (the name `has` had before it became the default) and
`has-arrival` (the default's placement in arrival order: dropped from the defaults, it lost to `has` on every
trace family, benchmarks/results/placement_load.md)."""
ALL_POLICIES: tuple[str, ...] = (*POLICIES, "has-arrival", "has-sjf")
"""The simulator's policies (cluster/simulator.py); here so the CLI can list them without importing the simulator.
`has-sjf` is `has` with the queue ordered by predicted run time (`queue_order="shortest"`)."""

SIA_MODELS = {"cifar10": "gpt2-124m", "deepspeech2": "gpt2-350m", "bert": "bert-large", "yolov3": "gpt2-774m",
              "imagenet": "gpt2-1.5b", "ncf": "gpt2-124m"}
SIA_GPU_HOURS = {"cifar10": 0.25, "ncf": 0.25, "deepspeech2": 2.0, "bert": 2.0, "yolov3": 15.0, "imagenet": 100.0}
BATCH_PER_GPU = 16


class TraceError(FrenzyError, ValueError):
    """A trace file that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class TraceJob:
    """One rigid job of a trace."""

    name: str
    submit_s: float
    duration_s: float
    """Run time on the reference GPU with `num_gpus` GPUs."""
    num_gpus: int
    """What the user asked for (baselines use it; HAS ignores it and uses MARP's plans)."""
    model: str
    global_batch: int
    seq_len: int = 1024
    precision: str = "fp16-mixed"


def model_for_gpu_hours(gpu_hours: float) -> str:
    """The Pollux GPU-time bucket rule (module docstring)."""
    if gpu_hours < 1:
        return "gpt2-124m"
    if gpu_hours < 10:
        return "gpt2-350m"
    if gpu_hours < 100:
        return "gpt2-774m"
    return "gpt2-1.5b"


def _unit_hash(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / 16**12


def _job(name: str, submit: float, duration: float, gpus: int, model: str | None, batch: int | None,
         precision: str = "fp16-mixed", where: str = "") -> TraceJob:
    if duration <= 0 or not 1 <= gpus <= 1_000_000 or submit < 0:
        raise TraceError(f"{where or 'trace'}: job {name}: submit_time must be >= 0, duration > 0 and num_gpus 1 to "
                         f"1,000,000 (got {submit}, {duration}, {gpus})")
    if batch is not None and not 1 <= batch <= 1 << 22:
        raise TraceError(f"{where or 'trace'}: job {name}: global_batch must be 1 to 4,194,304 (got {batch})")
    from tasks.presets import MODEL_PRESETS

    model = model or model_for_gpu_hours(duration * gpus / 3600)
    if model not in MODEL_PRESETS:
        raise TraceError(f"{where or 'trace'}: job {name}: unknown model preset {model!r}; see `frenzy presets`")
    return TraceJob(name=name, submit_s=float(submit), duration_s=float(duration), num_gpus=int(gpus), model=model,
                    global_batch=int(batch or BATCH_PER_GPU * gpus), precision=precision)


"""The most jobs a trace may hold (generated ones too): the simulator's documented limit (docs/guarantees.md)."""


MAX_JOBS = 100_000
"""The most jobs a trace may hold, read or generated: the simulator's memory and time grow with it (the documented
limit, docs/guarantees.md)."""


def _rows(path: Path, required: set[str], max_rows: int | None = MAX_JOBS) -> list[dict[str, str]]:
    """The CSV's rows as dicts, through the refusing reader (a regular file within `LIMITS['csv']`, UTF-8); more
    than `max_rows` data rows are refused before any is used."""
    try:
        text = read_text(path, "trace file", LIMITS["csv"])
    except UserFileError as err:
        raise TraceError(str(err)) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        names = list(reader.fieldnames or [])
        cols = set(names)
        twice = sorted(c for c in cols if names.count(c) > 1)
        if twice:
            raise TraceError(f"{path}:1: duplicate column {', '.join(twice)} in the header (which one counts would be a "
                             "guess); keep one")
        if not required <= cols:
            raise TraceError(f"{path}: missing columns {sorted(required - cols)} (has {sorted(cols)}); "
                             "pick the right --format")
        rows = []
        for row in reader:
            rows.append(row)
            if max_rows is not None and len(rows) > max_rows:
                raise TraceError(f"{path}: more than {max_rows:,} jobs, the simulator's limit; cut the trace (e.g. "
                                 f"`head -n {max_rows + 1}`) or split it")
        return rows
    except csv.Error as err:
        raise TraceError(f"{path}:{reader.line_num}: not a CSV row: {err}") from None


def _number(row: dict[str, str], col: str, kind: type[int] | type[float], where: str) -> Any:
    """`row[col]` as a finite `kind`; a cell that is not one names its line and column."""
    text = (row.get(col) or "").strip()
    what = "a whole number" if kind is int else "a number"
    try:
        v = kind(text)
    except ValueError:
        raise TraceError(f"{where}: column {col} must be {what}, got {text!r}") from None
    if not math.isfinite(v) or abs(v) > 1e15:
        raise TraceError(f"{where}: column {col} must be a finite number of at most 1e15, got {text!r}")
    return v


def read_generic(path: str | Path) -> list[TraceJob]:
    """`submit_time,duration,num_gpus[,model,global_batch]` (design.md), plus optional `name` and `precision`."""
    p = Path(path)
    out = []
    for i, r in enumerate(_rows(p, {"submit_time", "duration", "num_gpus"}), start=2):
        where = f"{p}:{i}"
        out.append(_job(r.get("name") or f"job-{i - 1}", _number(r, "submit_time", float, where),
                        _number(r, "duration", float, where), _number(r, "num_gpus", int, where),
                        r.get("model") or None,
                        _number(r, "global_batch", int, where) if r.get("global_batch") else None,
                        r.get("precision") or "fp16-mixed", where))
    return sorted(out, key=lambda j: (j.submit_s, j.name))


def read_philly(path: str | Path, *, max_jobs: int = 160, start: str | None = "2017-10-09 06:00:00",
                min_duration_s: float = 60.0, max_gpu_hours: float = 1000.0, max_gpus: int | None = None,
                ) -> list[TraceJob]:
    """Pollux's Philly CSV (`timestamp,duration,num_gpus,gpu_time,cluster`): the first `max_jobs` jobs submitted
    at or after `start`, keeping (like Pollux) jobs of at least `min_duration_s` and under `max_gpu_hours`, and
    optionally no larger than `max_gpus`. Submit times are relative to the first kept job."""
    p = Path(path)
    rows = []
    t0 = datetime.fromisoformat(start) if start else None
    for i, r in enumerate(_rows(p, {"timestamp", "duration", "num_gpus"}, max_rows=None), start=2):
        try:
            ts = datetime.fromisoformat(r["timestamp"])
        except ValueError as err:
            raise TraceError(f"{p}:{i}: column timestamp: {err}") from None
        dur, gpus = _number(r, "duration", float, f"{p}:{i}"), int(_number(r, "num_gpus", float, f"{p}:{i}"))
        if (t0 and ts < t0) or dur < min_duration_s or dur * gpus / 3600 >= max_gpu_hours:
            continue
        if max_gpus is not None and gpus > max_gpus:
            continue
        rows.append((ts, dur, gpus, i))
    rows.sort()
    rows = rows[:max_jobs]
    if not rows:
        raise TraceError(f"{p}: no job after {start} matches the filters")
    base = rows[0][0]
    return [_job(f"philly-{line}", (ts - base).total_seconds(), dur, gpus, None, None, where=f"{p}:{line}")
            for ts, dur, gpus, line in rows]


def read_sia(path: str | Path) -> list[TraceJob]:
    """Sia/Pollux workload files (`name,time,application,num_replicas,batch_size`); see the module docstring."""
    p = Path(path)
    out = []
    for i, r in enumerate(_rows(p, {"name", "time", "application", "num_replicas"}), start=2):
        app = r["application"]
        if app not in SIA_MODELS:
            raise TraceError(f"{p}:{i}: unknown application {app!r} (known: {', '.join(sorted(SIA_MODELS))})")
        n = _number(r, "num_replicas", int, f"{p}:{i}")
        if n < 1:
            raise TraceError(f"{p}:{i}: column num_replicas must be >= 1, got {n}")
        gpu_h = SIA_GPU_HOURS[app] * (0.5 * 4 ** _unit_hash(r["name"]))  # factor in [0.5, 2)
        out.append(_job(r["name"], _number(r, "time", float, f"{p}:{i}"), gpu_h * 3600 / n, n, SIA_MODELS[app], None,
                        where=f"{p}:{i}"))
    return sorted(out, key=lambda j: (j.submit_s, j.name))


def load_trace(path: str | Path, fmt: TraceFormat | None = None, **philly: object) -> list[TraceJob]:
    """Read a trace; the format is guessed from the header when not given."""
    p = Path(path).expanduser()
    try:
        if path_kind(p, "trace file") == "missing":
            hint = ("; a generated trace is newworkload:N[:SEED], production:N[:SEED] or mixed:N[:SEED]"
                    if ":" in str(path) else "")
            raise TraceError(f"{p}: no such trace file{hint}")
        if fmt is None:
            with open_user_file(p, "trace file", LIMITS["csv"]) as f:
                header = f.readline(1 << 16).decode(errors="replace")
            fmt = "sia" if "num_replicas" in header else "philly" if "timestamp" in header else "generic"
    except UserFileError as err:
        raise TraceError(str(err)) from None
    if fmt == "generic":
        return read_generic(p)
    if fmt == "philly":
        return read_philly(p, **philly)  # type: ignore[arg-type]
    if fmt == "sia":
        return read_sia(p)
    raise TraceError(f"unknown trace format {fmt!r}: use generic, philly or sia")


NEW_WORKLOAD_MODELS = ("gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "bert-base", "bert-large")


def new_workload(n_jobs: int = 30, *, seed: int = 0, mean_interarrival_s: float = 0.0,
                 steps: tuple[int, int] = (300, 3000), reference_gpu: str = REFERENCE_GPU) -> list[TraceJob]:
    """The Frenzy paper's NewWorkload: GPT-2 (124M-1.5B) and BERT (base, large) jobs with batch sizes 16-128
    sequences of 1,024 tokens in bf16. The paper submits them as one queue: with `mean_interarrival_s=0` (default)
    every job arrives at t=0 in generation order; otherwise arrivals are Poisson. The user's GPU count is what a user who does not plan
    memory would ask for: 1, 2 or 4 GPUs (probabilities .4/.35/.25). `steps` is drawn log-uniformly and turned
    into a reference duration with the step-time model at the user's GPU count on `reference_gpu`."""
    from cluster.jobperf import JobKey, reference_step_time

    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n_jobs):
        model = rng.choice(NEW_WORKLOAD_MODELS)
        batch = rng.choice((16, 32, 64, 128))
        gpus = rng.choices((1, 2, 4), weights=(0.4, 0.35, 0.25))[0]
        n_steps = int(math.exp(rng.uniform(math.log(steps[0]), math.log(steps[1]))))
        job = TraceJob(name=f"nw-{i:03d}-{model}-b{batch}", submit_s=round(t, 1), duration_s=1.0, num_gpus=gpus,
                       model=model, global_batch=batch, precision="bf16-mixed")
        dur = n_steps * reference_step_time(JobKey.of(job), reference_gpu, gpus)
        out.append(replace(job, duration_s=round(dur, 1)))
        t += rng.expovariate(1 / mean_interarrival_s) if mean_interarrival_s > 0 else 0.0
    return out


def parse_newworkload(spec: str) -> tuple[int, int]:
    """`newworkload:N[:SEED]` -> (N, SEED)."""
    parts = spec.split(":")
    try:
        if parts[0] != "newworkload" or not 2 <= len(parts) <= 3 or not 1 <= int(parts[1]) <= MAX_JOBS:
            raise ValueError
        return int(parts[1]), int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
        raise TraceError(f"{spec!r}: write newworkload:N or newworkload:N:SEED with 1 <= N <= {MAX_JOBS:,} jobs, "
                         "e.g. newworkload:30:0") from None


def write_generic(jobs: list[TraceJob], path: str | Path) -> None:
    """Write jobs as the generic CSV (with model, global_batch and name columns)."""
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submit_time", "duration", "num_gpus", "model", "global_batch", "name", "precision"])
        for j in jobs:
            w.writerow([j.submit_s, j.duration_s, j.num_gpus, j.model, j.global_batch, j.name, j.precision])


def offered_load(trace: Sequence[TraceJob], gpus: int) -> float:
    """The trace's offered load on `gpus` GPUs: the GPU-seconds it asks for (duration x GPUs, on the reference GPU)
    over the GPU-seconds of its arrival span. 0 where every job arrives at once (the span is empty)."""
    if not trace or gpus <= 0:
        return 0.0
    span = max(t.submit_s for t in trace) - min(t.submit_s for t in trace)
    return sum(t.duration_s * t.num_gpus for t in trace) / (span * gpus) if span > 0 else 0.0


def at_load(trace: Sequence[TraceJob], gpus: int, load: float) -> list[TraceJob]:
    """The trace with its arrivals stretched or squeezed (the order and relative gaps kept, starting at 0) so that its
    `offered_load` on `gpus` GPUs is `load`. A trace whose jobs all arrive at once has no span to scale."""
    if load <= 0:
        raise TraceError(f"load must be > 0 (got {load})")
    if not trace:
        return []
    t0 = min(t.submit_s for t in trace)
    span = max(t.submit_s for t in trace) - t0
    if span <= 0:
        raise TraceError("every job of the trace arrives at the same time: there are no arrival gaps to rescale to a "
                         "load; drop --load, or use a trace with arrival times")
    f = sum(t.duration_s * t.num_gpus for t in trace) / (load * gpus) / span
    return [replace(t, submit_s=(t.submit_s - t0) * f) for t in trace]
