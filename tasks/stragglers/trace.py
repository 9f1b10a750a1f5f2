"""The straggler trace format: parquet, one row per op, plus a meta YAML (the what-if paper's public format).

Columns `dp_rank` (int8), `stage` (int8), `rank` (int16), `step` (int64), `optype` (category), `start_ts`
(float32, seconds from the start of the step), `duration` (float32 seconds), `seq_id` (int32, per worker, step
and optype in start order), `mc` (int8, model chunk), `gmc` (int16, mc * pp + stage), `mb_id` (int8, -1 for
non-compute); an int8 column is written as int16 when its values need it (more than 127 DP ranks).
The meta YAML holds `trial_name, run_id, dp_size, pp_size, tp_size, dsp_size, vpp_size, world_size`.
One TP rank per (dp, stage) is traced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from tasks.errors import FrenzyError
from tasks.userfiles import UserFileError, load_yaml, path_kind, refuse_bool_numbers, regular_file, validation_message

COMPUTE = ("forward-compute", "backward-compute")
PP_COMM = ("forward-send", "forward-recv", "backward-send", "backward-recv")
DP_COMM = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")
TAIL = ("gc", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "optimizer-clip-main-grad", "optimizer")
OPTYPES = COMPUTE + PP_COMM + DP_COMM + TAIL
#: ops whose ideal duration is the mean of their durations; every other op is communication (median transfer)
LOCAL = ("forward-compute", "backward-compute", "gc", "optimizer")

COLUMNS = {"dp_rank": np.int8, "stage": np.int8, "rank": np.int16, "step": np.int64, "optype": None,
           "start_ts": np.float32, "duration": np.float32, "seq_id": np.int32, "mc": np.int8, "gmc": np.int16,
           "mb_id": np.int8}


MAX_DEGREE = 65536
"""The largest parallel degree a meta file may give (a job of more ranks than any cluster holds is a typo)."""


class TraceError(FrenzyError, ValueError):
    """A trace or meta file that cannot be analysed; the message names the fix."""


def _as_text(v: object) -> str:
    return "" if v is None else str(v)


class JobMeta(BaseModel):
    """The parallel layout of the traced job. The artifact's own meta files write `run_id: 0` (an int): names are
    taken as text whatever YAML made of them."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(classmethod(refuse_bool_numbers))

    trial_name: Annotated[str, BeforeValidator(_as_text)] = ""
    run_id: Annotated[str, BeforeValidator(_as_text)] = ""
    dp_size: int = Field(ge=1, le=MAX_DEGREE)
    pp_size: int = Field(1, ge=1, le=MAX_DEGREE)
    tp_size: int = Field(1, ge=1, le=MAX_DEGREE)
    dsp_size: int = Field(1, ge=1, le=MAX_DEGREE)
    vpp_size: int = Field(1, ge=1, le=MAX_DEGREE)
    world_size: int = Field(0, ge=0, le=MAX_DEGREE**2)


@dataclass
class Trace:
    """Columns as numpy arrays; `optype` holds indices into OPTYPES."""

    meta: JobMeta
    cols: dict[str, np.ndarray]
    path: str = ""

    @property
    def n_ops(self) -> int:
        return len(self.cols["step"])


def find_meta(trace_path: Path) -> Path:
    """The meta YAML beside a trace: `meta*.yaml` in its directory (exactly one)."""
    found = sorted(trace_path.parent.glob("meta*.yaml")) + sorted(trace_path.parent.glob("meta*.yml"))
    if len(found) != 1:
        what = "no meta*.yaml" if not found else f"{len(found)} meta files ({', '.join(p.name for p in found)})"
        raise TraceError(f"{trace_path.parent} has {what}; pass the job's meta YAML with --meta")
    return found[0]


def load_meta(path: Path) -> JobMeta:
    """The job's meta YAML, through the refusing reader and the project's strict YAML loader."""
    try:
        doc = load_yaml(path, "meta YAML")
    except UserFileError as err:
        raise TraceError(f"cannot read the meta YAML: {err}") from None
    if not isinstance(doc.data, dict):
        raise TraceError(f"{path}: a meta YAML is a mapping (dp_size, pp_size, tp_size, ...)")
    try:
        meta = JobMeta.model_validate(doc.data)
    except ValidationError as err:
        raise TraceError(validation_message(err, doc, str(path), "meta YAML")) from None
    ranks = meta.dp_size * meta.pp_size * meta.tp_size * meta.dsp_size
    if meta.world_size and meta.world_size != ranks:
        raise TraceError(f"{path}: world_size {meta.world_size} is not dp_size x pp_size x tp_size x dsp_size = "
                         f"{meta.dp_size} x {meta.pp_size} x {meta.tp_size} x {meta.dsp_size} = {ranks}; fix the "
                         "meta YAML (or drop world_size: it is computed)")
    meta.world_size = ranks
    return meta


def check_layout(meta: JobMeta, cols: dict[str, np.ndarray], trace: Path, source: str) -> None:
    """Refuse a meta whose layout is not the trace's: every DP rank and stage the meta names must be traced, and no
    traced rank, stage or model chunk may lie outside it (an analysis against the wrong layout is a wrong answer)."""
    for col, key, size in (("dp_rank", "dp_size", meta.dp_size), ("stage", "pp_size", meta.pp_size),
                           ("mc", "vpp_size", meta.vpp_size)):
        seen = np.unique(cols[col])
        if not len(seen):
            continue
        outside, count = int(seen.min()) < 0 or int(seen.max()) >= size, len(seen)
        if outside or (col != "mc" and count != size):
            raise TraceError(f"{source}: {key} {size} does not match the trace {trace}, whose {col} values are "
                             f"{int(seen.min())}..{int(seen.max())} ({count} distinct); give the job's own meta YAML "
                             "with --meta, or fix it")


def load_trace(path: str | Path, meta: str | Path | JobMeta | None = None) -> Trace:
    """Read a trace parquet file (or a directory holding `trace.parquet` or one `*.parquet`) and its meta."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():
        files = [p / "trace.parquet"] if (p / "trace.parquet").exists() else sorted(p.glob("*.parquet"))
        if len(files) != 1:
            raise TraceError(f"{p} holds {len(files)} parquet files; name the trace file")
        p = files[0]
    try:
        if path_kind(p, "trace parquet") == "missing":
            raise TraceError(f"no trace at {p}")
        regular_file(p, "trace parquet")
    except UserFileError as err:
        raise TraceError(str(err)) from None
    source = "the meta given" if isinstance(meta, JobMeta) else str(Path(meta) if meta else find_meta(p))
    if not isinstance(meta, JobMeta):
        meta = load_meta(Path(source))
    try:
        table = pq.read_table(p)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise TraceError(f"{p} is not a readable parquet file: {err}") from err
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(f"{p} lacks the columns {missing}; a straggler trace has {list(COLUMNS)}")
    cols: dict[str, np.ndarray] = {}
    for name, dtype in COLUMNS.items():
        col = table.column(name)
        if name == "optype":
            cols[name] = _optype_codes(col, p)
            continue
        arr = col.to_numpy()
        if arr.dtype.kind == "f" and dtype is not None and np.dtype(dtype).kind == "i":
            raise TraceError(f"column {name} of {p} holds floats; it must be integers")
        internal = np.float64 if name in ("start_ts", "duration") else np.int64 if name == "step" else np.int32
        cols[name] = arr.astype(internal, copy=True)
    for name in ("start_ts", "duration"):
        if not np.isfinite(cols[name]).all():
            raise TraceError(f"column {name} of {p} has NaN or infinite values; drop those rows")
    if (cols["duration"] < 0).any():
        raise TraceError(f"{int((cols['duration'] < 0).sum())} ops of {p} have negative durations")
    check_layout(meta, cols, p, source)
    return Trace(meta=meta, cols=cols, path=str(p))


def _optype_codes(col: object, p: Path) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(col.type):
        names = [str(x) for x in col.dictionary.to_pylist()]
        idx = pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False)
    else:
        enc = pc.dictionary_encode(col)
        names = [str(x) for x in enc.dictionary.to_pylist()]
        idx = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False)
    # judge the values, not the category list: the artifact's files carry categories no row uses (its analyzer
    # adds `first-op` to the list itself)
    used = np.unique(idx)
    unknown = [names[i] for i in used if i >= 0 and names[i] not in OPTYPES]
    if unknown or (used < 0).any():
        raise TraceError(f"{p} has unknown op types {unknown or ['<null>']}; known: {', '.join(OPTYPES)}")
    lut = np.array([OPTYPES.index(n) if n in OPTYPES else -1 for n in names], dtype=np.int8)
    return lut[idx]


def write_trace(path: str | Path, cols: dict[str, np.ndarray], meta: JobMeta, *, overwrite: bool = True) -> Path:
    """Write columns (optype as indices into OPTYPES or as strings) as a trace parquet plus `meta-<run>.yaml`, each
    whole (tasks/outdir.py). Without `overwrite`, an existing parquet, or a meta file of that name describing another
    job, is refused: `analyze` would read the other trace against the wrong meta."""
    import pandas as pd

    from tasks.outdir import OutputError, atomic_path

    p = Path(path)
    run = meta.run_id or meta.trial_name or "trace"
    meta_path, meta_text = p.parent / f"meta-{run}.yaml", yaml.safe_dump(meta.model_dump(), sort_keys=False)
    if not overwrite and meta_path.is_file() and meta_path.read_text(errors="replace") != meta_text:
        raise OutputError(f"cannot write {p}: {meta_path} already describes another trace in {p.parent}; give "
                          "another directory (or --overwrite to replace it)")
    data = {}
    for name, dtype in COLUMNS.items():
        arr = np.asarray(cols[name])
        if name == "optype":
            if arr.dtype.kind in "iu":
                data[name] = pd.Categorical.from_codes(arr.astype(np.int8), categories=list(OPTYPES))
            else:
                bad = ~np.isin(arr.astype(str), OPTYPES)
                if bad.any():
                    unknown = sorted({str(x) for x in arr[bad]})
                    raise TraceError(f"unknown op types {unknown}; known: {', '.join(OPTYPES)}")
                data[name] = pd.Categorical(arr, categories=list(OPTYPES))
        elif np.dtype(dtype).kind == "i" and len(arr) and arr.max() > np.iinfo(dtype).max:
            data[name] = arr.astype(np.int16 if np.dtype(dtype).itemsize == 1 else np.int32)  # a job past 127 DP ranks
        else:
            data[name] = arr.astype(dtype)
    with atomic_path(p, "stragglers generate", overwrite=overwrite) as tmp:
        pd.DataFrame(data).to_parquet(tmp, index=False)
        with atomic_path(meta_path, "stragglers generate") as tmp_meta:
            tmp_meta.write_text(meta_text)
    return p
