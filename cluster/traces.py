"""Job traces for the cluster simulator: the generic CSV, Philly, Sia, Alibaba openb, SenseTime Helios and Shanghai AI
Lab Kalos (AcmeTrace, as converted) formats, and the Frenzy NewWorkload.

Every reader returns `TraceJob`s sorted by submit time.

**A traced job keeps what the trace says** (`traced=True`, every reader but the NewWorkload generator): it ran on
`num_gpus` GPUs of `gpu_type` (the trace's column where it has one, else the reference GPU, `REFERENCE_GPU` unless the
caller says otherwise) for `duration_s`. The model and batch it is given are chosen so that this holds: its recorded
layout (data parallel on every GPU, the largest micro-batch that fits, `cluster.jobperf.recorded_layout`) fits that
GPU, and the simulator calibrates its steps so that this layout takes `duration_s` there. A user who ran it asks for
GPUs that hold it (no out-of-memory restart for a job that really ran).

**Whether a job may change its GPU count** is `elastic`, a property of the job: the generic CSV's `elastic` column
(default 0), else the default of its source: Philly, openb, Helios, Kalos and the production/mixed generators are rigid (the
trace records a count, nothing says the job could run on another); Sia workloads are elastic (Sia's jobs are adaptive
by design); the NewWorkload is elastic (the Frenzy paper plans each job). A rigid job keeps its GPU count under every
policy; where its layout does not fit a GPU type it may lower its micro-batch there (the math is the same).

**Model attachment rule** (none of the public traces says what model a job trains, so MARP could not plan it):
- a job that names a `model` preset keeps it (a traced one must fit its recorded GPUs, else the reader says so);
- Sia workloads map the application to a model of similar cost: cifar10 -> gpt2-124m, deepspeech2 -> gpt2-350m,
  bert -> bert-large, yolov3 -> gpt2-774m, imagenet -> gpt2-1.5b;
- otherwise the job's GPU time (`duration_s x num_gpus`) picks the model by the Pollux buckets:
  < 1 GPU-hour gpt2-124m, 1-10 gpt2-350m, 10-100 gpt2-774m, >= 100 gpt2-1.5b; for a traced job the next smaller
  GPT-2 where that one does not fit its recorded GPU at its recorded count even at micro-batch 1.
- The global batch, when the trace has none, is `16 x num_gpus` sequences of 1,024 tokens (16 sequences per
  GPU, what a user sizing for the GPUs they asked for would pick); precision is fp16 mixed (it runs on every
  GPU type of the Sia/Frenzy clusters, including Turing).

**Sia workloads carry no run time** (Sia derives it from per-application throughput profiles that are not
public). We give each application the geometric middle of its Pollux GPU-time bucket: cifar10 0.25 GPU-hours,
deepspeech2 and bert 2, yolov3 15, imagenet 100, times a deterministic factor in [0.5, 2) from the job name,
divided by `num_replicas`.

**Formats as published** (the filters are the readers' defaults, documented per reader): the generic CSV; Pollux's
Philly CSV; Sia workload files; Alibaba's 2023 `openb_pod_list_*.csv`; SenseTime Helios `cluster_log.csv`, or its
four-column conversion `job_id,arrival_s,service_sec,gpu_count` (`read_helios`); Kalos as converted by
hyunnnchoi/AcmeTrace's `transform_trace.py` (`read_kalos`).
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

TraceFormat = Literal["generic", "philly", "sia", "openb", "helios", "kalos"]
FORMATS: tuple[str, ...] = ("generic", "philly", "sia", "openb", "helios", "kalos")
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
    gpu_type: str | None = None
    """The GPU type the trace recorded the job on (None: the reference GPU)."""
    elastic: bool = True
    """May a policy run it on another GPU count (module docstring)."""
    traced: bool = False
    """It really ran as recorded: its model fits its recorded GPUs, and a user asks for GPUs that hold it."""


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
         precision: str = "fp16-mixed", *, traced: bool = True, elastic: bool = False, gpu_type: str | None = None,
         reference_gpu: str = REFERENCE_GPU, where: str = "") -> TraceJob:
    if duration <= 0 or not 1 <= gpus <= 1_000_000 or submit < 0:
        raise TraceError(f"{where or 'trace'}: job {name}: submit_time must be >= 0, duration > 0 and num_gpus 1 to "
                         f"1,000,000 (got {submit}, {duration}, {gpus})")
    if batch is not None and not 1 <= batch <= 1 << 22:
        raise TraceError(f"{where or 'trace'}: job {name}: global_batch must be 1 to 4,194,304 (got {batch})")
    from tasks.presets import MODEL_PRESETS

    if model is not None and model not in MODEL_PRESETS:
        raise TraceError(f"{where or 'trace'}: job {name}: unknown model preset {model!r}; see `frenzy presets`")
    batch = int(batch or BATCH_PER_GPU * gpus)
    job = TraceJob(name=name, submit_s=float(submit), duration_s=float(duration), num_gpus=int(gpus),
                   model=model or model_for_gpu_hours(duration * gpus / 3600), global_batch=batch, precision=precision,
                   gpu_type=gpu_type, elastic=elastic, traced=traced)
    return fit_to_record(job, reference_gpu, keep_model=model is not None) if traced else job


FIT_MODELS = ("gpt2-1.5b", "gpt2-774m", "gpt2-350m", "gpt2-124m")
"""The models a traced job without one may be given, largest first (the Pollux buckets' GPT-2 sizes)."""


def fit_to_record(job: TraceJob, reference_gpu: str = REFERENCE_GPU, keep_model: bool = False) -> TraceJob:
    """`job` with a model that runs on its recorded GPUs (module docstring): its own where it fits (else a TraceError
    when `keep_model`), else the next smaller GPT-2 that fits."""
    from cluster.jobperf import JobKey, recorded_layout

    gpu = job.gpu_type or reference_gpu
    if recorded_layout(JobKey.of(job), gpu, job.num_gpus) is not None:
        return job
    if keep_model or job.model not in FIT_MODELS:
        raise TraceError(f"job {job.name}: {job.model} with global batch {job.global_batch} does not fit {job.num_gpus} "
                         f"{gpu} GPU(s) even at micro-batch 1, yet the trace says it ran there; give a smaller model or "
                         "batch, or the gpu_type it ran on")
    for m in FIT_MODELS[FIT_MODELS.index(job.model) + 1:]:
        smaller = replace(job, model=m)
        if recorded_layout(JobKey.of(smaller), gpu, job.num_gpus) is not None:
            return smaller
    raise TraceError(f"job {job.name}: no GPT-2 model fits {job.num_gpus} {gpu} GPU(s); give gpu_type with more memory")


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


def _within_limit(p: Path, kept: int) -> None:
    """A published trace is filtered first; what is kept must still be within the simulator's limit."""
    if kept > MAX_JOBS:
        raise TraceError(f"{p}: {kept:,} jobs pass the reader's filters, more than the simulator's limit of "
                         f"{MAX_JOBS:,}; cut a window of the trace (a time range of at most that many jobs)")


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


def _flag(row: dict[str, str], col: str, default: bool, where: str) -> bool:
    text = (row.get(col) or "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise TraceError(f"{where}: column {col} must be 0 or 1, got {text!r}")


def read_generic(path: str | Path, *, reference_gpu: str = REFERENCE_GPU) -> list[TraceJob]:
    """`submit_time,duration,num_gpus[,model,global_batch]` (`--format generic`, docs/commands.md), plus optional
    `name`, `precision`, `gpu_type` (the type it ran on), `elastic` (0/1, default 0: the job keeps its GPU count) and
    `traced` (0/1, default 1: it really ran as recorded; 0: a generated job whose user may ask for GPUs that cannot
    hold it)."""
    p = Path(path)
    out = []
    for i, r in enumerate(_rows(p, {"submit_time", "duration", "num_gpus"}), start=2):
        where = f"{p}:{i}"
        out.append(_job(r.get("name") or f"job-{i - 1}", _number(r, "submit_time", float, where),
                        _number(r, "duration", float, where), _number(r, "num_gpus", int, where),
                        r.get("model") or None,
                        _number(r, "global_batch", int, where) if r.get("global_batch") else None,
                        r.get("precision") or "fp16-mixed", traced=_flag(r, "traced", True, where),
                        elastic=_flag(r, "elastic", False, where), gpu_type=r.get("gpu_type") or None,
                        reference_gpu=reference_gpu, where=where))
    return sorted(out, key=lambda j: (j.submit_s, j.name))


def read_philly(path: str | Path, *, max_jobs: int = 160, start: str | None = "2017-10-09 06:00:00",
                min_duration_s: float = 60.0, max_gpu_hours: float = 1000.0, max_gpus: int | None = None,
                reference_gpu: str = REFERENCE_GPU) -> list[TraceJob]:
    """Pollux's Philly CSV (`timestamp,duration,num_gpus,gpu_time,cluster`): the first `max_jobs` jobs submitted
    at or after `start`, keeping (like Pollux) jobs of at least `min_duration_s` and under `max_gpu_hours`, and
    optionally no larger than `max_gpus`. Submit times are relative to the first kept job. Rigid, traced."""
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
    return [_job(f"philly-{line}", (ts - base).total_seconds(), dur, gpus, None, None, reference_gpu=reference_gpu,
                 where=f"{p}:{line}") for ts, dur, gpus, line in rows]


def read_sia(path: str | Path, *, reference_gpu: str = REFERENCE_GPU) -> list[TraceJob]:
    """Sia/Pollux workload files (`name,time,application,num_replicas,batch_size`); see the module docstring.
    Elastic, traced."""
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
                        elastic=True, reference_gpu=reference_gpu, where=f"{p}:{i}"))
    return sorted(out, key=lambda j: (j.submit_s, j.name))


OPENB_TYPES = {"V100M16": "V100-16GB", "V100M32": "V100-32GB", "T4": "T4", "A10": "A10"}
"""openb `gpu_spec` names with a catalog type (the others, P100 and the anonymised G2/G3, run as the reference GPU)."""
OPENB_END_S = 12_902_960
"""The last `deletion_time` of the openb trace: a pod deleted then was still running when the trace was cut."""


def read_openb(path: str | Path, *, min_duration_s: float = 60.0, reference_gpu: str = REFERENCE_GPU
               ) -> list[TraceJob]:
    """Alibaba's 2023 openb pod list as published (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
    pod_phase,creation_time,deletion_time,scheduled_time`): the GPU pods (`num_gpu` >= 1) that were scheduled, ran at
    least `min_duration_s` and ended before the trace was cut (`OPENB_END_S`). Submit = `creation_time`, run time =
    `deletion_time - scheduled_time`, GPUs = `num_gpu` (a fractional pod, `gpu_milli` < 1000, counts one), type =
    the first `gpu_spec` entry with a catalog type. Rigid, traced; times relative to the first kept pod."""
    p = Path(path)
    rows = []
    need = {"name", "num_gpu", "gpu_spec", "creation_time", "deletion_time", "scheduled_time"}
    for i, r in enumerate(_rows(p, need, max_rows=None), start=2):  # the published list; filtered below
        where = f"{p}:{i}"
        if not (r.get("scheduled_time") or "").strip() or _number(r, "num_gpu", int, where) < 1:
            continue
        end, ran = _number(r, "deletion_time", float, where), _number(r, "scheduled_time", float, where)
        if end - ran < min_duration_s or end >= OPENB_END_S:
            continue
        spec = [OPENB_TYPES[t] for t in (r.get("gpu_spec") or "").split("|") if t in OPENB_TYPES]
        rows.append((_number(r, "creation_time", float, where), end - ran, int(r["num_gpu"]), r["name"],
                     spec[0] if spec else None))
    if not rows:
        raise TraceError(f"{p}: no GPU pod that ran at least {min_duration_s:.0f} s")
    _within_limit(p, len(rows))
    base = min(t for t, *_ in rows)
    return sorted((_job(name, t - base, d, g, None, None, gpu_type=gt, reference_gpu=reference_gpu)
                   for t, d, g, name, gt in rows), key=lambda j: (j.submit_s, j.name))


HELIOS_LOG = {"job_id", "gpu_num", "submit_time", "duration"}
HELIOS_CONVERTED = {"job_id", "arrival_s", "service_sec", "gpu_count"}


def read_helios(path: str | Path, *, min_duration_s: float = 60.0, reference_gpu: str = REFERENCE_GPU
                ) -> list[TraceJob]:
    """SenseTime Helios: `cluster_log.csv` as published (`job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,
    start_time,end_time,duration,queue`, times as `YYYY-MM-DD HH:MM:SS`) or its four-column conversion
    (`job_id,arrival_s,service_sec,gpu_count`, arrival in seconds). GPU jobs of at least `min_duration_s`, whatever
    their final state (a failed job held its GPUs too). Rigid, traced; times relative to the first kept job."""
    p = Path(path)
    cols = {c.strip() for c in _header(p).strip().split(",")}
    converted = HELIOS_CONVERTED <= cols
    rows = []
    for i, r in enumerate(_rows(p, HELIOS_CONVERTED if converted else HELIOS_LOG, max_rows=None), start=2):
        where = f"{p}:{i}"
        if converted:
            t, d, g = (_number(r, "arrival_s", float, where), _number(r, "service_sec", float, where),
                       _number(r, "gpu_count", int, where))
        else:
            try:
                t = datetime.fromisoformat(r["submit_time"]).timestamp()
            except ValueError:
                raise TraceError(f"{where}: column submit_time must be YYYY-MM-DD HH:MM:SS, got "
                                 f"{r['submit_time']!r}") from None
            d, g = _number(r, "duration", float, where), _number(r, "gpu_num", int, where)
        if g >= 1 and d >= min_duration_s:
            rows.append((t, d, g, f"helios-{r['job_id']}"))
    if not rows:
        raise TraceError(f"{p}: no GPU job of at least {min_duration_s:.0f} s")
    _within_limit(p, len(rows))
    base = min(t for t, *_ in rows)
    return sorted((_job(n, t - base, d, g, None, None, reference_gpu=reference_gpu) for t, d, g, n in rows),
                  key=lambda j: (j.submit_s, j.name))


KALOS_COLUMNS = {"job_id", "arrival_time", "num_iteration", "gpu_workers", "gpu_per_worker"}
KALOS_GPU = "A100-80GB-SXM"
"""Kalos's GPUs (NSDI'24 paper: A100-SXM 80 GB, 8 to a node); every job of the trace ran on them."""
KALOS_ITERATION_S = 0.5
"""The converter writes a job's run time as `num_iteration` iterations of this many seconds (rounded down)."""


def read_kalos(path: str | Path, *, min_duration_s: float = 60.0, reference_gpu: str = REFERENCE_GPU
               ) -> list[TraceJob]:
    """Shanghai AI Lab's Kalos job trace (AcmeTrace, NSDI'24) as hyunnnchoi/AcmeTrace's `transform_trace.py` converted
    it (`job_id,arrival_time,num_iteration,iteration_computing_time,iteration_networking_time,gpu_workers,ps,
    gpu_per_worker,...`; examples/traces/PROVENANCE.md says what the conversion drops). Column mapping: submit =
    `arrival_time` (seconds after the first submission), run time = `num_iteration` x `KALOS_ITERATION_S` (the
    converter's `int(duration / 0.5)`), GPUs = `gpu_workers` (the job's nodes) x `gpu_per_worker` (its GPUs per node),
    which must be a whole number; type `KALOS_GPU`. The other columns are the converter's simulator settings, not
    measurements, and are not read. Jobs of at least `min_duration_s`. Rigid, traced; times relative to the first kept
    job."""
    p = Path(path)
    rows = []
    for i, r in enumerate(_rows(p, KALOS_COLUMNS, max_rows=None), start=2):
        where = f"{p}:{i}"
        d = _number(r, "num_iteration", int, where) * KALOS_ITERATION_S
        gpus = _number(r, "gpu_workers", int, where) * _number(r, "gpu_per_worker", float, where)
        if gpus != int(gpus):
            raise TraceError(f"{where}: gpu_workers x gpu_per_worker must be a whole number of GPUs, got {gpus}; "
                             "this is not the converter's output (gpu_workers = nodes, gpu_per_worker = GPUs / nodes)")
        if gpus >= 1 and d >= min_duration_s:
            rows.append((_number(r, "arrival_time", float, where), d, int(gpus), f"kalos-{r['job_id']}"))
    if not rows:
        raise TraceError(f"{p}: no GPU job of at least {min_duration_s:.0f} s")
    _within_limit(p, len(rows))
    base = min(t for t, *_ in rows)
    return sorted((_job(n, t - base, d, g, None, None, gpu_type=KALOS_GPU, reference_gpu=reference_gpu)
                   for t, d, g, n in rows), key=lambda j: (j.submit_s, j.name))


def guess_format(header: str) -> TraceFormat:
    """The format a trace file's header line belongs to."""
    cols = {c.strip() for c in header.strip().split(",")}
    if "num_replicas" in cols:
        return "sia"
    if "timestamp" in cols:
        return "philly"
    if "gpu_milli" in cols:
        return "openb"
    if HELIOS_CONVERTED <= cols or {"vc", "gpu_num"} <= cols:
        return "helios"
    if KALOS_COLUMNS <= cols:
        return "kalos"
    return "generic"


def _header(p: Path) -> str:
    """A trace file's first line, through the refusing reader (a FIFO, a device or an oversize file is named)."""
    try:
        with open_user_file(p, "trace file", LIMITS["csv"]) as f:
            return f.readline(1 << 16).decode(errors="replace")
    except UserFileError as err:
        raise TraceError(str(err)) from None


def load_trace(path: str | Path, fmt: TraceFormat | None = None, reference_gpu: str = REFERENCE_GPU,
               **philly: object) -> list[TraceJob]:
    """Read a trace; the format is guessed from the header when not given."""
    p = Path(path).expanduser()
    try:
        missing = path_kind(p, "trace file") == "missing"
    except UserFileError as err:
        raise TraceError(str(err)) from None
    if missing:
        hint = ("; a generated trace is newworkload:N[:SEED], production:N[:SEED] or mixed:N[:SEED]"
                if ":" in str(path) else "")
        raise TraceError(f"{p}: no such trace file{hint}")
    fmt = fmt or guess_format(_header(p))
    if fmt == "philly":
        return read_philly(p, reference_gpu=reference_gpu, **philly)  # type: ignore[arg-type]
    readers = {"generic": read_generic, "sia": read_sia, "openb": read_openb, "helios": read_helios,
               "kalos": read_kalos}
    if fmt not in readers:
        raise TraceError(f"unknown trace format {fmt!r}: use {', '.join(FORMATS)}")
    return readers[fmt](p, reference_gpu=reference_gpu)  # type: ignore[operator]


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


MAX_SEED = 2**63 - 1


def parse_generated(spec: str, families: Sequence[str], example: str) -> tuple[int, int]:
    """`FAMILY:N[:SEED]` -> (N, SEED), with 1 <= N <= MAX_JOBS and 0 <= SEED <= MAX_SEED; else refused with the
    ranges and `example`."""
    parts = spec.split(":")
    try:
        if parts[0] not in families or not 2 <= len(parts) <= 3:
            raise ValueError
        n, seed = int(parts[1]), int(parts[2]) if len(parts) == 3 else 0
        if not (1 <= n <= MAX_JOBS and 0 <= seed <= MAX_SEED):
            raise ValueError
        return n, seed
    except ValueError:
        forms = " or ".join(f"{f}:N[:SEED]" for f in families)
        raise TraceError(f"{spec!r}: write {forms} with 1 <= N <= {MAX_JOBS:,} jobs and 0 <= SEED < 2^63, "
                         f"e.g. {example}") from None


def parse_newworkload(spec: str) -> tuple[int, int]:
    """`newworkload:N[:SEED]` -> (N, SEED)."""
    return parse_generated(spec, ("newworkload",), "newworkload:30:0")


def write_generic(jobs: list[TraceJob], path: str | Path) -> None:
    """Write jobs as the generic CSV (with every column `read_generic` reads)."""
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submit_time", "duration", "num_gpus", "model", "global_batch", "name", "precision", "gpu_type",
                    "elastic", "traced"])
        for j in jobs:
            w.writerow([j.submit_s, j.duration_s, j.num_gpus, j.model, j.global_batch, j.name, j.precision,
                        j.gpu_type or "", int(j.elastic), int(j.traced)])


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
