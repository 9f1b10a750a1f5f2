"""Metric jobs (a dataset's `score` over one chunk's predictions) in processes of their own, as trials are: each in
a session (process group) of its own, so a plugin's `score` that signals its own process or group ends only that
process, and fails only its dataset (red team 41l); the evaluation, and the other datasets' metric jobs, go on. A
process serves one metric job after another (its imports, torch among them, are paid once); one that died is replaced
at the next job. Each job has a deadline (the suite's `plugin_timeout_s`): a plugin that hangs while it loads, scores
or aggregates has its process group killed then, and fails only its dataset with a cause that names the hang and the
setting (red team 41n C1b). A process's start-up, until it says it is ready, has a deadline too (`startup_s`: red team 41o
S14, one stopped as it started held the evaluation 10 min 30 s without a word). Local executor only: on Ray the job
runs in a Ray worker process of the node."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from tasks.evaluation.datasets import EvalContext
from tasks.evaluation.suite import PLUGIN_TIMEOUT_S
from tasks.evaluation.warmstart import kill_group, popen_trial
from tasks.procs import exit_words

STARTUP_FLOOR_S = 60.0
"""The least a metric process is given to start (its imports, torch among them: 0.3-1.0 s measured at load 8-9 on 2
cores), however short the suite's `plugin_timeout_s`: that setting is the plugin's time, and a cold or busy machine's
start must not fail a dataset."""


class MetricJobDied(Exception):  # noqa: N818 - a dataset's failure, named with how its process ended
    """The process of a metric job ended while it scored (a signal, or an exit of the plugin's own)."""


@dataclass(frozen=True)
class Aggregate:
    """A dataset's aggregate as a metric process made it, and how many per-example scores it read."""

    metrics: dict[str, float]
    examples: int


class MetricJobs:
    """The metric processes of one evaluation; their stderr goes to `log_dir/metrics-N.stderr`. A job that has not
    answered in `deadline_s` seconds has its process group killed and raises MetricJobDied naming the hang; so has a
    process not ready in `startup_s` (default: `deadline_s`, at least `STARTUP_FLOOR_S`)."""

    def __init__(self, log_dir: Path, deadline_s: float = PLUGIN_TIMEOUT_S, startup_s: float | None = None) -> None:
        self.log_dir = log_dir
        self.deadline_s = deadline_s
        self.startup_s = max(deadline_s, STARTUP_FLOOR_S) if startup_s is None else startup_s
        self.lock = threading.Lock()
        self.idle: list[tuple[subprocess.Popen, IO, Path]] = []
        self.live: set[subprocess.Popen] = set()
        self.logs: list[Path] = []
        self.started = 0
        self.closed = False

    def _take(self, source: str) -> tuple[subprocess.Popen, IO, Path]:
        """An idle metric process, else a new one once it is ready (for a job of dataset `source`: a start that is
        not ready in `startup_s` has its group killed and raises MetricJobDied naming it)."""
        with self.lock:
            if self.closed:
                raise MetricJobDied("the evaluation is stopping")
            if self.idle:
                return self.idle.pop()
            self.started += 1
            n = self.started
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"metrics-{n}.stderr"
        self.logs.append(path)
        log = open(path, "w")  # noqa: SIM115 - closed when the process ends or the evaluation does
        proc = popen_trial("--metrics", "cpu", 0, log)
        with self.lock:
            self.live.add(proc)
            if self.closed:
                kill_group(proc)
        if _answer(proc, None, self.startup_s)[1]:  # its `ready` line (imports done: not the plugin's time) came late
            rc = proc.wait()
            log.close()
            with self.lock:
                self.live.discard(proc)
            raise MetricJobDied(f"{source}: its metric process was not ready {self.startup_s:g}s after it started "
                                f"(stopped, or a machine too busy); its process group was killed ({exit_words(rc)}). "
                                "The evaluation went on without it; run it again")
        return proc, log, path

    def score(self, chunk: dict, ctx: EvalContext, out: Path) -> float:
        """Run `score_chunk(chunk, ctx, out)` in a metric process: its seconds; a plugin's exception is raised as
        a RuntimeError with its text, a process that ended as MetricJobDied with how and its stderr's last lines."""
        reply = self._call({"chunk": chunk, "ctx": asdict(ctx), "out": str(out)}, "scoring",
                           lambda how: f"its metric process ended while it scored ({how}: does the dataset's `score` "
                                       "signal or exit its own process or group?)")
        return float(reply["metric_s"])

    def probe(self, spec: dict, ctx: EvalContext) -> int:
        """Load (import and construct) the dataset of `spec` (`source`, `mode`, `options`) in a metric process, not
        in the evaluator: its number of examples. A plugin that ends its process or group while it loads raises
        MetricJobDied naming that; its exception, a RuntimeError with its text."""
        reply = self._call({"probe": spec, "ctx": asdict(ctx), "out": ""}, "loading",
                           lambda how: f"{spec['source']}: killed its process group while loading ({how}); the "
                                       "evaluation went on without it")
        return int(reply["examples"])

    def aggregate(self, spec: dict, ctx: EvalContext, out: Path) -> Aggregate:
        """The aggregate of dataset `spec`'s scores in `out`, made in a metric process (a plugin's `aggregate` and
        factory run there, as its `score` does)."""
        reply = self._call({"aggregate": spec, "ctx": asdict(ctx), "out": str(out)}, "aggregating",
                           lambda how: f"{spec['source']}: its metric process ended while it aggregated ({how})")
        return Aggregate(metrics={k: float(v) for k, v in reply["aggregate"].items()}, examples=int(reply["examples"]))

    def _call(self, job: dict, phase: str, died: Callable[[str], str]) -> dict:
        """One job in a metric process: its reply; `died(how)` is the cause when the process ended instead, the hang
        when it did not answer by the deadline (its group is killed then)."""
        spec = job.get("probe") or job.get("aggregate") or job.get("chunk") or {}
        proc, log, path = self._take(spec.get("source", "?"))
        line, hung = _answer(proc, job, self.deadline_s)
        if hung:
            line = ""
            died = self._hang_cause(job, phase)
        if not line:
            rc = proc.wait()
            log.close()
            with self.lock:
                self.live.discard(proc)
            tail = " | ".join(path.read_text(errors="replace").strip().splitlines()[-3:])
            raise MetricJobDied(died(exit_words(rc)) + (f"; stderr: {tail}" if tail else ""))
        with self.lock:
            self.idle.append((proc, log, path))
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def _hang_cause(self, job: dict, phase: str) -> Callable[[str], str]:
        spec = job.get("probe") or job.get("aggregate") or job.get("chunk") or {}
        what = {"loading": "its factory", "scoring": "its `score`", "aggregating": "its `aggregate`"}[phase]
        return lambda how: (f"{spec.get('source', '?')}: hung while {phase} ({what} gave no answer in "
                            f"{self.deadline_s:g}s; its metric process group was killed, {how}); if it only needs "
                            f"longer, raise `plugin_timeout_s` in the suite file (now {self.deadline_s:g}s)")

    def close(self) -> None:
        """End every metric process (killed with its group) and remove the logs that are empty; those with lines stay
        beside the trials' logs."""
        with self.lock:
            self.closed = True
            procs, idle, self.idle = list(self.live), self.idle, []
        for proc in procs:
            kill_group(proc)
            proc.wait()
        for _, log, _ in idle:
            log.close()
        for path in self.logs:
            if path.exists() and path.stat().st_size == 0:
                path.unlink(missing_ok=True)


def _answer(proc: subprocess.Popen, job: dict | None, deadline_s: float) -> tuple[str, bool]:
    """Send `job` (None: nothing, as at start-up) and read one line of `proc`'s within `deadline_s`: (the line, whether
    the deadline passed first: its group is then killed). The line is "" when the process ended (or its stdin had
    closed: it ended before the job reached it); a process that ends before its `ready` line leaves the job it is
    given to meet a closed pipe, which `_call` reports."""
    late = threading.Event()

    def expire() -> None:
        late.set()
        kill_group(proc)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True
    timer.start()
    try:
        if job is not None:
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
        line = proc.stdout.readline()
    except OSError:
        line = ""
    finally:
        timer.cancel()
    return line, late.is_set()
