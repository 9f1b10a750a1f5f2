"""Op traces in the what-if paper's format: one row per op (compute per micro-batch, gradient sync, optimizer).

Columns `dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id` with `start_ts`
relative to the step start, plus a `meta-<run>.yaml` with the parallel sizes. Each rank writes its own
parquet file; `merge_traces` joins them into `trace.parquet` for the straggler analysis.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

COLUMNS = ["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id"]


class OpTracer:
    """Records ops of sampled steps; `every` = 0 disables tracing."""

    def __init__(self, rank: int, dp_rank: int, every: int, first: int = 1) -> None:
        self.rank, self.dp_rank, self.every, self.first = rank, dp_rank, every, first
        self.rows: list[dict] = []
        self.step = -1
        self._t0 = 0.0
        self._seq: defaultdict[str, int] = defaultdict(int)

    def active(self, step: int) -> bool:
        return self.every > 0 and step >= self.first and (step - self.first) % self.every == 0

    def begin_step(self, step: int) -> bool:
        """Start tracing `step` if sampled. A step number run again (a resume or a rollback re-runs it) replaces
        its earlier rows: the straggler analysis refuses a step with duplicate rows."""
        self.step = step if self.active(step) else -1
        if self.step >= 0 and self.rows and any(r["step"] == step for r in self.rows):
            self.drop(step)
        self._t0 = time.perf_counter()
        self._seq.clear()
        return self.step >= 0

    def record(self, optype: str, start: float, end: float, mb_id: int = -1) -> None:
        if self.step < 0:
            return
        seq = self._seq[optype]
        self._seq[optype] += 1
        self.rows.append({"dp_rank": self.dp_rank, "stage": 0, "rank": self.rank, "step": self.step,
                          "optype": optype, "start_ts": start - self._t0, "duration": end - start,
                          "seq_id": seq, "mc": 0, "gmc": 0, "mb_id": mb_id})

    def drop(self, step: int) -> None:
        """Forget a step's rows (its update was skipped; the step number will be traced again)."""
        self.rows = [r for r in self.rows if r["step"] != step]

    def write(self, out_dir: Path) -> Path | None:
        if not self.rows:
            return None
        import pandas as pd

        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"rank{self.rank:05d}.parquet"
        pd.DataFrame(self.rows, columns=COLUMNS).to_parquet(path, index=False)
        return path


def merge_traces(out_dir: Path, run: str, dp: int, tp: int, world: int) -> Path | None:
    """Join the per-rank files into `trace.parquet` and write `meta-<run>.yaml`; returns the trace path. An untraced
    run (no rank files) returns None without importing pandas (0.3 CPU s at every trainer's end)."""
    parts = sorted(out_dir.glob("rank*.parquet"))
    if not parts:
        return None
    import pandas as pd

    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    # one row per op: a step traced twice (files left by an interrupted attempt beside a resumed one's) keeps the
    # newest file's rows
    df = df.drop_duplicates(subset=["rank", "step", "optype", "seq_id"], keep="last")
    df = df.sort_values(["step", "rank", "start_ts"], kind="stable").reset_index(drop=True)
    from tasks.stragglers.trace import JobMeta, write_trace

    meta = JobMeta(trial_name=run, run_id=run, dp_size=dp, pp_size=1, tp_size=tp, world_size=world)
    path = write_trace(out_dir / "trace.parquet", {c: df[c].to_numpy() for c in COLUMNS}, meta)
    for p in parts:
        p.unlink()
    return path
