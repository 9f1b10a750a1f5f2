"""Run an evaluation for real: precursors, trial processes on GPU slots, metric jobs on node CPU pools.

`evaluate(uri, suite, options)` plans the trials (`schedule.py`, with learned priors when there are some), then
- elastic: one precursor process per node copies the checkpoint to node shared memory; each GPU slot pulls the
  next trial in dispatch order once its node's copy is ready; every chunk's predictions go to the node's CPU pool
  the moment they land; the shared-memory copies are removed at the end, also on failure;
- naive: each trial loads from storage and scores its predictions itself before it releases the GPU.
It measures every phase, writes `result.json` beside the predictions and scores, folds the measurements into the
priors, and returns an `EvalResult` with the scores per dataset and the measured and predicted makespans.

On this machine a "GPU slot" is a process with `threads_per_trial` CPU threads; with `device=cuda` each slot is
pinned to one GPU through CUDA_VISIBLE_DEVICES. Several nodes on one machine are simulated (each has its own
shared-memory copy and CPU pool). With `executor="ray"` each node is a real Ray node: its precursor and trials are
processes started there by Ray tasks (so its shared-memory copy is its own) and its metric jobs are Ray tasks taking
one of its CPUs; predictions and scores go to `out_dir`, which every node must see.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.errors import EnvironmentProblem, FrenzyError, environment_problem
from tasks.evaluation import priors as P
from tasks.evaluation.datasets import DatasetError, EvalContext, frenzys_own, resolve
from tasks.evaluation.engine import hf_info, is_hf_dir, model_info, resolve_manifest, tokenizer_path
from tasks.evaluation.metricjobs import MetricJobs
from tasks.evaluation.schedule import Schedule, TrialPlan, plan_elastic_or_direct, plan_naive
from tasks.evaluation.stall import Floors, Pending, Watchdog, copying, hang_cause, pending
from tasks.evaluation.suite import PLUGIN_TIMEOUT_S, TRIAL_STALL_S, Suite, SuiteDataset
from tasks.evaluation.trial import score_chunk
from tasks.evaluation.warmstart import Warm, kill_group, popen_trial, spawn_warm, take_precursor, take_trial
from tasks.procs import exit_words


def ended(rc: int) -> str:
    """How a trial process ended, for its error: a signal by name; SIGKILL with its most common sender (red team 41i
    N8: "exited with status -9" was the whole cause of an evaluation the OOM killer ended)."""
    if rc >= 0:
        return f"exited with status {rc}"
    return "was " + exit_words(rc, lambda sig: _OOM if sig == "SIGKILL" else "")


_OOM = "most often the kernel's out-of-memory killer; see `dmesg`"


class EvalError(FrenzyError, RuntimeError):
    """An evaluation that could not finish; names the trial and its error."""


class _TrialDied(Exception):
    """A trial process that failed (a non-zero exit, a signal, an error event), with its record and the chunks it
    finished (landed; with metrics on its GPU, scored) before it did."""

    def __init__(self, cause: str, result: TrialResult, finished: set[tuple[str, int]]) -> None:
        super().__init__(cause)
        self.cause, self.result, self.finished = cause, result, finished


@dataclass
class _TrialState:
    """What a running trial has done so far (its events, as `_Run._follow` reads them)."""

    scored: set[tuple[str, int]] | None
    """The chunks scored on its GPU (None: its metrics are on the node's CPUs)."""
    load_s: float = 0.0
    loaded: bool = False
    landed: set[tuple[str, int]] = field(default_factory=set)
    finished: set[tuple[str, int]] = field(default_factory=set)
    """Landed (metrics on CPU) or scored (on its GPU): not to retry."""
    chunks: dict[tuple[str, int], ChunkResult] = field(default_factory=dict)


class EvalOptions(BaseModel):
    """How to run an evaluation."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    schedule: Literal["elastic", "naive"] = "elastic"
    """elastic: preload to shm, split/pack/LPT trials, CPU metrics with no barrier; naive: one trial per dataset."""
    nodes: int = Field(1, ge=1)
    """Nodes (simulated on this machine: each with its own shm copy and CPU pool)."""
    gpus_per_node: int = Field(1, ge=1)
    """Inference slots per node (GPUs; on a CPU machine, processes of `threads_per_trial` threads)."""
    cpu_workers_per_node: int | None = Field(None, ge=1)
    """Metric jobs at once per node; default the suite's, at most this machine's CPU count."""
    device: Literal["cpu", "cuda"] = "cpu"
    threads_per_trial: int = Field(1, ge=1)
    out_dir: str | None = None
    """Predictions, scores and result.json; default evals/<run>/step_<N>/<suite>."""
    shm_root: str = "/dev/shm"
    """Where precursors put the model (node-local shared memory)."""
    use_priors: bool = True
    """Plan with learned priors where there are some (else the suite's)."""
    learn_priors: bool = True
    """Fold this run's measurements into the priors file."""
    priors_path: str | None = None
    executor: str = Field("local", pattern=r"^(local|ray|ray://\S+)$")
    """`local`: trials, precursors and metric jobs are processes and threads here (nodes simulated); `ray` /
    `ray://HOST:PORT`: each node is a Ray node: its precursor, trials and metric jobs run there."""
    ray_nodes: list[str] | None = None
    """Ray executor: the nodes to use (`frenzy_node:` names); empty: the first `nodes` alive ones."""


class ChunkResult(BaseModel):
    dataset: str
    start: int
    stop: int
    infer_s: float
    landed_s: float
    metric_s: float = 0.0
    metric_end_s: float = 0.0
    cached: bool = False


class TrialResult(BaseModel):
    id: int
    node: int
    gpu: int
    load: str
    start_s: float
    load_s: float
    end_s: float
    chunks: list[ChunkResult]
    host: str = "local"
    """Where it ran: `local`, or the Ray node's name."""
    datasets: list[str] = []
    """The datasets whose chunks it was given (`chunks` holds those that landed)."""
    error: str | None = None
    """Why its process failed (its chunks not landed by then were retried, or their dataset failed); None: it ran."""
    retry_of: int | None = None
    """The failed trial whose chunks of one dataset this trial retried."""
    metrics_on: str = "cpu"
    """`gpu`: its chunks were scored in the trial (the naive schedule); `cpu`: by the node's metric pool."""

    @property
    def fixed_s(self) -> float:
        """The trial's cost beyond its chunks' work: its process start where no warm process hid it, the model
        load, and its exit (the wall time from dispatch to the slot being free, less inference and, with metrics on
        the GPU, scoring). This, not the `loaded` event alone, is what one more trial costs a slot."""
        work = sum(c.infer_s for c in self.chunks)
        if self.metrics_on == "gpu":
            work += sum(c.metric_s for c in self.chunks)
        return max(0.0, self.end_s - self.start_s - work)


class EvalResult(BaseModel):
    """What `frenzy evaluate --json` prints."""

    uri: str
    run: str
    step: int
    suite: str
    schedule: str
    nodes: int
    gpus_per_node: int
    cpu_workers_per_node: int
    makespan_s: float
    predicted_makespan_s: float
    precursor_s: list[float]
    scores: dict[str, dict[str, float]]
    trials: list[TrialResult]
    out_dir: str
    priors_used: list[str]
    """Datasets planned with learned priors (the rest with the suite's)."""
    ran: str = ""
    """The plan that ran: `naive`, `elastic`, or `direct` where the elastic schedule was asked for and one trial per
    dataset from storage was predicted faster (`plan_elastic_or_direct`); empty in results written before it."""
    failed: dict[str, str] = {}
    """Datasets not scored, each with its cause (its trial died twice: the second time alone); empty: all scored."""
    kept_earlier: str | None = None
    """Set when this result, with failed datasets, did not replace the complete one its directory held (`--overwrite`):
    what was kept where; this result is then in `OUT.failed/` and the history has no line of it."""


def _hosts(opts: EvalOptions) -> list[str]:
    """Where each of the `nodes` runs: `local` for all, or distinct Ray nodes (`ray_nodes`, else the alive ones)."""
    if opts.executor == "local":
        return ["local"] * opts.nodes
    from cluster.ray_exec import alive_nodes

    alive = alive_nodes(None if opts.executor == "ray" else opts.executor)  # also joins the cluster, in this thread
    names = opts.ray_nodes or alive
    if gone := [n for n in names if n not in alive]:
        raise EvalError(f"Ray nodes {', '.join(gone)} are not in the cluster (alive: {', '.join(alive)})")
    if len(names) < opts.nodes:
        raise EvalError(f"the evaluation asks for {opts.nodes} nodes but the Ray cluster offers {len(names)} "
                        f"({', '.join(names)}); lower --nodes or add Ray nodes")
    return list(names[:opts.nodes])


def _chunk_spec(suite: Suite, c) -> dict:
    d = next(x for x in suite.datasets if x.name == c.dataset)
    return {"dataset": d.name, "source": d.source, "mode": d.mode, "options": d.options, "start": c.start,
            "stop": c.stop}


def clean_stale_shm(shm_root: str) -> list[str]:
    """Remove shared-memory copies left by evaluations whose process no longer exists (a crash or SIGKILL)."""
    removed = []
    for d in Path(shm_root).glob("frenzy-eval-*"):
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
        except PermissionError:
            pass
    return removed


class _Run:
    """One evaluation's processes. The precursors may start (`start_precursors`) before the suite is planned, so
    the model copy overlaps preparing it; `execute` then runs the planned trials."""

    def __init__(self, uri: str, opts: EvalOptions, out: Path, ctx: EvalContext,
                 progress: Callable[[str, float], None], plugin_timeout_s: float = PLUGIN_TIMEOUT_S,
                 precursor_step: Pending | None = None) -> None:
        self.uri, self.opts, self.out, self.ctx = uri, opts, out, ctx
        self.precursor_step = precursor_step or copying(TRIAL_STALL_S, 0.0)
        """A precursor's deadline (a trial's model load's): past it its group is killed and its node's trials load
        the model from storage themselves (`unshared`)."""
        self.unshared: set[int] = set()
        self.progress = progress
        self.queue: list[TrialPlan] = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.failed: str | None = None
        """What failed the whole evaluation (a precursor: nothing can be scored); one dataset's failure is in `bad`."""
        self.failed_err: OSError | None = None
        """The error of the machine (a full disk) that did, when one did: raised as it is, naming its path."""
        self.bad: dict[str, str] = {}
        self.retry_of: dict[int, int] = {}  # a retry trial's id: the failed trial whose chunks of one dataset it runs
        self.next_id = 0
        self.results: list[TrialResult] = []
        self.metric_futures: list[Future] = []
        self.metric_jobs = MetricJobs(out / "trials", plugin_timeout_s)
        self.more = threading.Condition(self.lock)
        """Notified when a plugin loading beside the trials was planned or failed (`loading` fell)."""
        self.loading = 0
        """Plugins still loading in their metric processes: the slots wait for their trials before they stop."""
        self.ready = [threading.Event() for _ in range(opts.nodes)]
        self.precursor_s = [0.0] * opts.nodes
        self.precursors: list[threading.Thread] = []
        self.precursor_kills: dict[int, Callable[[], None]] = {}
        self.precursors_dropped = False
        """Set by `drop_precursors`: the plan that runs loads from storage, the copies started ahead are stopped."""
        self.shm = Path(opts.shm_root) / f"frenzy-eval-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.pools: list[ThreadPoolExecutor] = []
        self.n_chunks = 0
        self.done_chunks = 0
        self.procs: set[subprocess.Popen] = set()
        self.warm: dict[tuple[int, int], Warm] = {}  # (node, gpu): a trial process ahead; (node, -1): a precursor
        if opts.executor == "local":  # started before imports (`frenzy evaluate`) or the evaluation before (in-flow)
            for slot, early in (((0, -1), take_precursor()), ((0, 0), take_trial())):
                if early is not None:
                    self.warm[slot] = early
        self.cancels: set[Callable[[], None]] = set()
        self.closed = False
        """Set by `close` (the evaluation ended, failed or was interrupted): no process is started after it."""
        self._address = None if opts.executor in ("local", "ray") else opts.executor
        self.hosts = _hosts(opts)

    def start_precursors(self) -> None:
        """Copy the model into every node's shared memory now (one process per node)."""
        self.precursors = [threading.Thread(target=self.precursor, args=(n,), daemon=True) for n in range(self.opts.nodes)]
        for t in self.precursors:
            t.start()

    def drop_precursors(self) -> None:
        """The plan that runs loads every trial from storage (`direct`, predicted faster than the elastic one):
        stop the model copies started ahead of planning; every node's trials go on without one."""
        with self.lock:
            self.precursors_dropped = True
            kills = list(self.precursor_kills.values())
        for kill in kills:
            kill()
        for t in self.precursors:
            t.join(timeout=30)
        self.precursors = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _spawn(self, spec: dict, node: int, gpu: int):  # noqa: ANN202 - (stdout lines, then {"rc", "stderr"}), kill
        """Start a trial or precursor process: here, or on Ray node `self.hosts[node]` (the same module there); its
        stdout lines (then `{"rc", "stderr"}`) and a function that kills it and what it started."""
        path = self.out / "trials" / f"{spec['name']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, json.dumps(spec))
        if self.opts.executor != "local":
            from cluster.ray_exec import node_process

            env = {"OMP_NUM_THREADS": "1"} | ({"CUDA_VISIBLE_DEVICES": str(gpu)} if self.opts.device == "cuda" else {})
            lines, cancel = node_process(self.hosts[node], "tasks.evaluation.trial", spec, env, self._address)
            with self.lock:
                self.cancels.add(cancel)
            return lines, cancel
        warm = self._adopt(node, -1 if spec.get("precursor") else gpu, path)
        p, log = warm or self._popen(path, gpu, path.with_suffix(".stderr"))
        with self.lock:
            self.procs.add(p)
            if self.closed:  # `close` ran while it started (Ctrl-C): it must not outlive the evaluation
                kill_group(p)

        def lines():  # noqa: ANN202
            yield from p.stdout
            rc = p.wait()
            log.close()
            with self.lock:
                self.procs.discard(p)
            yield {"rc": rc, "stderr": (self.out / "trials" / f"{spec['name']}.stderr").read_text()[-2000:]}

        return lines(), lambda: kill_group(p)

    def _popen(self, path: Path, gpu: int, log_path: Path) -> tuple[subprocess.Popen, Any]:
        """A local trial process for the spec at `path`."""
        log = open(log_path, "w")  # noqa: SIM115 - closed when the process ends
        return popen_trial(str(path), self.opts.device, gpu, log), log

    def prewarm(self, node: int, gpu: int) -> None:
        """Start slot (node, gpu)'s next trial process now (local executor): its imports (torch: about 2 s of a
        trial's load on CPU) overlap planning or the slot's running trial instead of delaying the next trial."""
        if self.opts.executor != "local" or self.failed is not None:
            return
        with self.lock:
            if (node, gpu) in self.warm or self.closed:
                return
            log_path = self.out / "trials" / f"warm-n{node}-g{gpu}-{uuid.uuid4().hex[:6]}.stderr"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            w = spawn_warm(self.opts.device, gpu, log_path)
            self.procs.add(w.proc)
            self.warm[(node, gpu)] = w

    def _adopt(self, node: int, gpu: int, spec_path: Path) -> tuple[subprocess.Popen, Any] | None:
        """The slot's warm process (gpu -1: the node's early precursor), handed the spec (its log moved to the
        trial's), or None when there is none."""
        with self.lock:
            w = self.warm.pop((node, gpu), None)
            if w is not None:
                self.procs.add(w.proc)
        if w is None:
            return None
        try:
            # one started outside this evaluation's directory (an early one) copies its log there; else it is moved
            w.hand(spec_path, spec_path.with_suffix(".stderr"), relog=w.log_path.parent != spec_path.parent)
            return w.proc, w.log
        except OSError:  # it died (killed while warming): start a fresh one
            self._retire(w)
            return None

    def _retire(self, w: Warm) -> None:
        w.retire()
        with self.lock:
            self.procs.discard(w.proc)

    def _events(self, stream, name: str):  # noqa: ANN001, ANN202
        """The process's events until it ends; an error event or a failed exit raises (once the process has ended:
        the evaluation goes on, and the process is waited for and its log closed)."""
        error = None
        for line in stream:
            if isinstance(line, dict):  # the process ended
                if self.opts.executor != "local":
                    _write(self.out / "trials" / f"{name}.stderr", line["stderr"])
                if error is not None:
                    raise EvalError(f"{name}: {error} (its log: {self.out / 'trials' / (name + '.stderr')})")
                if line["rc"] != 0:  # its last line (the error), not its traceback: that stays in the log
                    last = [ln for ln in line["stderr"].splitlines() if ln.strip()][-1:] or ["no output"]
                    raise EvalError(f"{name} {ended(line['rc'])}: {last[0].strip()} (its log: "
                                    f"{self.out / 'trials' / (name + '.stderr')})")
                return
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ev.get("event") == "error":
                error = error or ev["error"]
            elif error is None:
                yield ev

    def precursor(self, node: int) -> None:
        name, dog = f"precursor-n{node}", None
        try:
            t = time.monotonic()
            spec = {"name": name, "precursor": True, "uri": self.uri, "shm_dir": str(self.shm / f"node{node}")}
            stream, kill = self._spawn(spec, node, 0)
            with self.lock:
                self.precursor_kills[node] = kill
                dropped = self.precursors_dropped
            if dropped:  # dropped while it started: stop it now
                kill()
            dog = Watchdog(kill)  # the deadline of a trial's model load, for the read and for the copy
            dog.arm(self.precursor_step)
            for _ in self._events(stream, name):  # `loaded` (read and verified): the copy's own deadline starts
                dog.arm(self.precursor_step)
            self.precursor_s[node] = time.monotonic() - t
            self.progress(f"node {node}: model in shared memory after {self.precursor_s[node]:.1f}s", self._frac())
        except Exception as err:  # noqa: BLE001
            if self.precursors_dropped:  # stopped by `drop_precursors`: no copy is needed, nothing failed
                self.unshared.add(node)
            elif dog is None or dog.fired is None:
                self.failed = self.failed or self._why(err)
            elif not self.closed:  # hung: its node goes on as a schedule without a preloaded copy does
                self.unshared.add(node)
                cause = hang_cause(name, dog.fired, str(self.out / "trials" / f"{name}.stderr"))
                self.progress(f"{cause}; node {node}'s trials load the model from storage themselves instead",
                              self._frac())
        finally:
            if dog is not None:
                dog.stop()
            if self.failed is None:  # the first trials' processes import while the suite is planned
                for g in range(self.opts.gpus_per_node):  # (not beside the copy: on 2 cores that slowed it)
                    self.prewarm(node, g)
            self.ready[node].set()

    def _why(self, err: Exception) -> str:
        """The text of an error that fails the evaluation; an error of the machine (a full disk) is kept to be raised
        as it is, so the caller names its path and the fix (red team 41n C4: `[Errno 28] ...` was all it said)."""
        if isinstance(err, OSError) and environment_problem(err) is not None and self.failed_err is None:
            self.failed_err = err
        return str(err)

    def _frac(self) -> float:
        return self.done_chunks / max(self.n_chunks, 1)

    def gpu_worker(self, node: int, gpu: int) -> None:
        self.ready[node].wait()
        while self.failed is None and not self.closed:
            with self.lock:
                while not self.queue and self.loading and self.failed is None and not self.closed:
                    self.more.wait(timeout=5.0)  # notified when a plugin loaded or failed; the timeout: `failed`
                if not self.queue:
                    return
                tr: TrialPlan = self.queue.pop(0)
            try:
                self.results.append(self._run_trial(tr, node, gpu))
            except Exception as err:  # noqa: BLE001
                if self.closed:  # the evaluation stopped (Ctrl-C, SIGTERM) and killed it: no failure, no retry
                    return  # (red team 41n C5: a spurious "[Errno 2] ...; retrying ..." was the last line)
                if not isinstance(err, _TrialDied):
                    self.failed = self.failed or self._why(err)
                    continue
                self.results.append(err.result)  # its own datasets pay, not its trial-mates' nor the evaluation
                self._trial_died(tr, err)

    def _trial_died(self, tr: TrialPlan, died: _TrialDied) -> None:
        """Retry the chunks `tr` had not finished once, as one trial per dataset (queued; this slot takes them next
        unless another is free); a retry that dies fails its dataset, whose queued chunks are then dropped."""
        left = [c for c in tr.chunks if (c.dataset, c.start) not in died.finished]
        names = list(dict.fromkeys(c.dataset for c in left))
        with self.lock:
            if tr.id in self.retry_of:
                for d in names:
                    self._drop(d, f"its trial died, then again alone: {died.cause}")
                return
            names = [d for d in names if d not in self.bad]
            for d in names:
                self.next_id += 1
                retry = tr.model_copy(update={"id": self.next_id, "chunks": [c for c in left if c.dataset == d]})
                self.retry_of[retry.id] = tr.id
                self.queue.append(retry)
        if names:
            self.progress(f"{died.cause}; retrying {', '.join(names)}, each in a trial of its own", self._frac())

    def _drop(self, dataset: str, cause: str) -> None:
        """Mark `dataset` failed with `cause` and drop its queued chunks (the caller holds the lock)."""
        self.bad.setdefault(dataset, cause)
        kept = []
        for t in self.queue:
            chunks = [c for c in t.chunks if c.dataset != dataset]
            self.n_chunks -= len(t.chunks) - len(chunks)
            if chunks:
                kept.append(t.model_copy(update={"chunks": chunks}))
        self.queue = kept

    def _fail_dataset(self, dataset: str, cause: str) -> None:
        with self.lock:
            self._drop(dataset, cause)

    def _run_trial(self, tr: TrialPlan, node: int, gpu: int) -> TrialResult:
        name = f"trial-{tr.id:04d}"
        if tr.load == "shm" and node in self.unshared:  # its node's precursor hung: no copy to load from
            tr = tr.model_copy(update={"load": "remote"})
        start = self.now()
        spec = {"name": name, "load": tr.load, "uri": self.uri, "shm_dir": str(self.shm / f"node{node}"),
                "out_dir": str(self.out), "chunks": [_chunk_spec(self.suite, c) for c in tr.chunks],
                "metrics_on_gpu": tr.metrics_on == "gpu", "threads": self.opts.threads_per_trial,
                "device": "cuda" if self.opts.device == "cuda" else "cpu"}
        st = _TrialState(scored=set() if tr.metrics_on == "gpu" else None)
        stream, kill = self._spawn(spec, node, gpu)
        if self.queue:  # this slot's next trial process starts importing while this one infers
            self.prewarm(node, gpu)

        def record(error: str | None = None) -> TrialResult:
            return TrialResult(id=tr.id, node=node, gpu=gpu, load=tr.load, start_s=start, load_s=st.load_s,
                               end_s=self.now(), chunks=list(st.chunks.values()), host=self.hosts[node], error=error,
                               retry_of=self.retry_of.get(tr.id), metrics_on=tr.metrics_on,
                               datasets=list(dict.fromkeys(c.dataset for c in tr.chunks)))

        dog = Watchdog(kill)  # a trial that makes no progress by its deadline is killed as hung (stall.py)
        try:
            self._follow(tr, node, name, stream, st, dog, start)
        except Exception as err:  # noqa: BLE001 - the process failed: its unfinished chunks are retried
            cause = str(err) if dog.fired is None else self._hung(name, dog.fired)
            raise _TrialDied(cause, record(cause), st.finished) from err
        finally:
            dog.stop()
        return record()

    def _follow(self, tr: TrialPlan, node: int, name: str, stream, st: _TrialState, dog: Watchdog,  # noqa: ANN001
                start: float) -> None:
        """Read trial `tr`'s events into `st` (each landed chunk's metric job handed to the node's pool), re-arming
        `dog` with the trial's next step after each."""
        floors = Floors(self.suite.trial_stall_s, self.suite.plugin_timeout_s, getattr(self.suite.model_load_s, tr.load),
                        lambda n: not frenzys_own(next(d.source for d in self.suite.datasets if d.name == n)))
        dog.arm(pending(tr, False, set(st.finished), st.scored, floors))
        for ev in self._events(stream, name):
            if ev["event"] == "loaded":
                st.load_s, st.loaded = self.now() - start, True
            elif ev["event"] == "landed":
                c = ev["chunk"]
                cr = ChunkResult(dataset=c["dataset"], start=c["start"], stop=c["stop"], infer_s=ev["infer_s"],
                                 landed_s=self.now(), cached=ev["cached"])
                st.chunks[(c["dataset"], c["start"])] = cr
                st.landed.add((c["dataset"], c["start"]))
                if tr.metrics_on == "cpu":
                    st.finished.add((c["dataset"], c["start"]))
                    self.metric_futures.append(self.pools[node].submit(self._metric, c, cr, node))
                else:
                    self._count(cr)
            elif ev["event"] == "scored" and st.scored is not None:
                cr = st.chunks[(ev["chunk"]["dataset"], ev["chunk"]["start"])]
                cr.metric_s, cr.metric_end_s = ev["metric_s"], self.now()
                st.finished.add((cr.dataset, cr.start))
                st.scored.add((cr.dataset, cr.start))
            dog.arm(pending(tr, st.loaded, st.landed, st.scored, floors))

    def _hung(self, name: str, step: Pending) -> str:
        """The cause of trial `name` killed at its deadline at `step`; the dataset it was at fails alone (not retried:
        it would hang again), its trial-mates' chunks are retried as after any death."""
        cause = hang_cause(name, step, str(self.out / "trials" / f"{name}.stderr"))
        if step.dataset is not None and not self.closed:
            self._fail_dataset(step.dataset, cause)
            self.progress(f"{step.dataset}: FAILED (not scored): {cause}", self._frac())
        return cause

    def _metric(self, chunk: dict, cr: ChunkResult, node: int) -> None:
        if self.failed or chunk["dataset"] in self.bad:
            return
        try:
            if self.opts.executor != "local":  # the metric job takes one CPU of the node whose trial made it
                from cluster.ray_exec import node_call

                cr.metric_s = node_call(self.hosts[node], score_chunk, chunk, self.ctx, self.out,
                                        address=self._address)
            elif frenzys_own(chunk["source"]):  # Frenzy's own `score`: a process would isolate nothing and cost
                cr.metric_s = score_chunk(chunk, self.ctx, self.out)  # ~1 s per metric process start-up
            else:  # in a process (and session) of its own: a plugin that kills its group ends only that job
                cr.metric_s = self.metric_jobs.score(chunk, self.ctx, self.out)
            cr.metric_end_s = self.now()
            self._count(cr)
        except Exception as err:  # noqa: BLE001 - that dataset fails, the others are scored
            self._fail_dataset(chunk["dataset"], f"metrics of {chunk['dataset']}[{chunk['start']}:{chunk['stop']}]: "
                                                 f"{err}")
            return
        with self.lock:
            self.left[chunk["dataset"]] -= 1
            last = self.left[chunk["dataset"]] == 0
        if last:  # the dataset's aggregate (bootstrapped errors, ...) now, while other trials still infer
            self._aggregate_early(chunk["dataset"])

    def _aggregate_early(self, name: str) -> None:
        try:
            d = next(x for x in self.suite.datasets if x.name == name)
            dest = self.out / "aggregates" / f"{name}.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(aggregate_dataset(self.suite, self.ctx, self.out, d, self.metric_jobs)))
            os.replace(tmp, dest)
        except Exception as err:  # noqa: BLE001
            self._fail_dataset(name, f"aggregating {name}: {err}")

    def _count(self, cr: ChunkResult) -> None:
        with self.lock:
            self.done_chunks += 1
        self.progress(f"{cr.dataset}[{cr.start}:{cr.stop}] scored ({self.done_chunks}/{self.n_chunks})", self._frac())

    def load_plugins(self, later: list[SuiteDataset], key: str) -> None:
        """Load each plugin dataset of `later` in a metric process (one thread each) while the planned trials run:
        one that loads is planned and its trials queued; one that raises, dies or hangs past the deadline fails
        alone (red team 41n C1b: a plugin's load held Frenzy's own datasets back)."""
        with self.lock:
            self.loading += len(later)
        for d in later:
            threading.Thread(target=self._load_plugin, args=(d, key), daemon=True, name=f"load-{d.name}").start()

    def _load_plugin(self, d: SuiteDataset, key: str) -> None:
        trials: list[TrialPlan] = []
        cause = None
        try:
            cause = _check(d, self.suite.name, self.ctx, self.metric_jobs)
            if cause is None and not self.closed:
                one = self.suite.model_copy(update={"datasets": [d]})
                trials = _schedule(one, self.opts, key, self.sched.cpu_workers_per_node)[0].trials
        except Exception as err:  # noqa: BLE001 - what the machine refuses fails the evaluation, as at planning
            self.failed = self.failed or self._why(err)
        with self.more:
            self.loading -= 1
            if cause is not None:
                self.bad.setdefault(d.name, cause)
            for t in trials:
                self.next_id += 1
                self.queue.append(t.model_copy(update={"id": self.next_id}))
                self.n_chunks += len(t.chunks)
                self.left.update(c.dataset for c in t.chunks)
            self.more.notify_all()
        if cause is not None and not self.closed:  # not a load the evaluation's stop ended
            self.progress(f"{d.name}: FAILED (not scored): {cause}", self._frac())

    def execute(self, suite: Suite, sched: Schedule, later: list[SuiteDataset] | None = None, key: str = "") -> float:
        """Run `sched`'s trials (after the precursors, which start here unless they did already), and those of the
        plugin datasets `later` once each has loaded; the seconds from the first process start to the last metric."""
        self.suite, self.sched, self.queue = suite, sched, list(sched.trials)
        self.next_id = max((t.id for t in sched.trials), default=0)
        self.left = Counter(c.dataset for t in sched.trials for c in t.chunks)  # chunks to score, per dataset
        cpus = sched.cpu_workers_per_node
        self.pools = [ThreadPoolExecutor(cpus, thread_name_prefix=f"metrics-n{n}") for n in range(self.opts.nodes)]
        self.n_chunks = sum(len(t.chunks) for t in sched.trials)
        if sched.kind == "elastic" and not self.precursors:
            self.start_precursors()
        elif sched.kind != "elastic":
            for e in self.ready:
                e.set()
        self.load_plugins(later or [], key)
        threads = [threading.Thread(target=self.gpu_worker, args=(n, g), daemon=True)
                   for n in range(self.opts.nodes) for g in range(self.opts.gpus_per_node)]
        for t in threads:
            t.start()
        for t in [*self.precursors, *threads]:
            t.join()
        for f in list(self.metric_futures):
            f.result()
        return self.now()

    def close(self) -> None:
        """Stop whatever still runs (also after a failure before `execute`, or a Ctrl-C: the trials are in process
        groups of their own, which the terminal's signal does not reach) and remove the shared-memory copies."""
        with self.lock:
            self.closed = True
            self.more.notify_all()
            warm, self.warm = list(self.warm.values()), {}
        for w in warm:  # started ahead for trials that went to other slots
            self._retire(w)
        with self.lock:
            for p in list(self.procs):
                kill_group(p)
            for cancel in list(self.cancels):
                cancel()
        self.metric_jobs.close()  # before the pools: a metric job waiting on its process is answered now
        for pool in self.pools:
            pool.shutdown(wait=True, cancel_futures=True)
        for t in self.precursors:
            t.join(timeout=30)
        shutil.rmtree(self.shm, ignore_errors=True)


def _write(path: Path, text: str) -> None:
    """`path.write_text(text)`; its OSError names `path` (a write that fills the disk names no file of its own)."""
    try:
        path.write_text(text)
    except OSError as err:
        if err.filename is None:
            raise type(err)(err.errno, err.strerror, str(path)) from err
        raise


def _check(d: SuiteDataset, suite_name: str, ctx: EvalContext, jobs: MetricJobs) -> str | None:
    """Why dataset `d` cannot be loaded (a plugin that cannot be imported, raises, kills its process group or hangs
    past the deadline while it loads, a missing file, too few examples), or None: it fails alone, as a trial that dies
    does (red team 41l B1, 41m C1b, 41n C1b). Frenzy's own datasets are loaded here; a plugin only in a metric
    process of its own session (`jobs.probe`), never in the evaluator. What the machine refuses (a full disk) still
    fails the evaluation."""
    try:
        n = len(resolve(d.source, d.mode, d.options, ctx)) if frenzys_own(d.source) else \
            jobs.probe({"dataset": d.name, "source": d.source, "mode": d.mode, "options": d.options}, ctx)
        if n < d.examples:
            raise DatasetError(f"suite {suite_name}: {d.name} asks for {d.examples} examples; the dataset has "
                               f"{n}: lower `examples`")
    except Exception as err:  # noqa: BLE001 - a plugin's own error is that dataset's, not the evaluation's
        if isinstance(err, EnvironmentProblem | MemoryError) or environment_problem(err) is not None:
            raise
        probed = not frenzys_own(d.source)  # the probe's causes name the plugin already
        return str(err) if isinstance(err, DatasetError) or probed else f"{d.source}: {type(err).__name__}: {err}"
    return None


def _check_datasets(suite: Suite, ctx: EvalContext, jobs: MetricJobs, names: set[str]) -> dict[str, str]:
    """{dataset: cause} for each dataset of `suite` named in `names` that cannot be loaded (`_check`); plugins are
    loaded at once, each in a metric process of its own."""
    todo = [d for d in suite.datasets if d.name in names and not _is_lmeval(d)]  # lm-eval: counted by `expand`
    with ThreadPoolExecutor(max(1, len(todo)), thread_name_prefix="load") as pool:
        causes = list(pool.map(lambda d: _check(d, suite.name, ctx, jobs), todo))
    return {d.name: c for d, c in zip(todo, causes, strict=True) if c is not None}


def _model(uri: str) -> tuple[str, str, int, dict]:
    """(URI to load, run name, step, model info) of a checkpoint URI or a Hugging Face model directory (step 0 of
    a run named after the directory)."""
    if is_hf_dir(uri):
        info = hf_info(uri)
        return info["source"], info["run"], 0, info
    storage, manifest = resolve_manifest(uri)
    return storage.url(f"step_{manifest.step:08d}"), manifest.run, manifest.step, model_info(manifest, storage)


def _schedule(suite: Suite, opts: EvalOptions, key: str, cpus: int) -> tuple[Schedule, list[str]]:
    """The plan of `suite`'s datasets (with learned priors when `opts` says so) and the datasets that had priors."""
    ppath = Path(opts.priors_path) if opts.priors_path else None
    planned, used = P.apply_priors(suite, key, ppath) if opts.use_priors else (suite, [])
    if opts.schedule == "elastic":
        return plan_elastic_or_direct(planned, opts.nodes, opts.gpus_per_node, cpus), used
    return plan_naive(planned, opts.nodes, opts.gpus_per_node, cpus), used


def _plan(suite: Suite, ctx: EvalContext, opts: EvalOptions, key: str, jobs: MetricJobs
          ) -> tuple[Suite, Schedule, list[str], dict[str, str], list[SuiteDataset]]:
    """The suite (lm-eval tasks expanded into datasets, their requests built once here), checked, and its plan of
    the datasets that load; those that do not, with their causes (failed alone); and the plugin datasets left to
    load beside the trials (none when the suite has no dataset of Frenzy's own that loads: they are loaded first)."""
    if suite.lmeval is not None:
        from tasks.evaluation.lmeval.source import expand

        suite = expand(suite)
    plugins = {d.name for d in suite.datasets if not frenzys_own(d.source) and not _is_lmeval(d)}
    bad = _check_datasets(suite, ctx, jobs, {d.name for d in suite.datasets} - plugins)
    later = [d for d in suite.datasets if d.name in plugins]
    if len(bad) + len(later) == len(suite.datasets):  # nothing of Frenzy's own to run while the plugins load
        bad |= _check_datasets(suite, ctx, jobs, plugins)
        later = []
    if len(bad) == len(suite.datasets):
        raise DatasetError(f"suite {suite.name}: no dataset could be loaded: " + "; ".join(f"{d}: {c}" for d, c in bad.items()))
    runnable = suite.model_copy(update={"datasets": [d for d in suite.datasets if d.name not in bad and d not in later]})
    cpus = opts.cpu_workers_per_node or min(suite.cpu_workers_per_node, os.cpu_count() or 1)
    sched, used = _schedule(runnable, opts, key, cpus)
    return suite, sched, used, bad, later


def report_only(progress: Callable[[str, float], None]) -> Callable[[str, float], None]:
    """`progress` that cannot fail the evaluation: it reports (a Prefect progress artifact, over the API), and an
    API that does not answer for a while (a server restarted) failed the whole step with `[Errno 111] Connection
    refused`, its work discarded (red team 41q B3). Its first error is said on stderr (the run's log), and the
    evaluation goes on; the reports come back when the callback works again."""
    said = threading.Event()

    def report(msg: str, frac: float) -> None:
        try:
            progress(msg, frac)
        except Exception as err:  # noqa: BLE001 - a report that cannot be made is not the evaluation's failure
            if not said.is_set():
                said.set()
                print(f"evaluation progress could not be reported ({type(err).__name__}: {err}); the evaluation "
                      f"goes on (the Prefect API not answering, most often)", file=sys.stderr, flush=True)

    return report


def evaluate(uri: str, suite: Suite, opts: EvalOptions | None = None,
             progress: Callable[[str, float], None] | None = None,
             while_running: Callable[[], object] | None = None) -> EvalResult:
    """Evaluate one committed checkpoint on a suite; see the module docstring. `while_running` is called once the
    suite is planned, as its trials start (work of the caller's that can overlap them: this process mostly waits)."""
    opts = opts or EvalOptions()
    progress = report_only(progress or (lambda msg, frac: None))
    uri, run_name, step, info = _model(uri)
    ctx = EvalContext(seq_len=int(info["seq_len"]), data=info.get("data"), tokenizer=tokenizer_path(info))
    out = Path(opts.out_dir) if opts.out_dir else Path("evals") / run_name / f"step_{step:08d}" / suite.name
    out.mkdir(parents=True, exist_ok=True)
    clean_stale_shm(opts.shm_root)
    shutil.rmtree(out / "aggregates", ignore_errors=True)  # made again by this run's metric jobs
    key = P.model_key(opts.device, info["model"])
    run = _Run(uri, opts, out, ctx, progress, suite.plugin_timeout_s, _precursor_step(suite, opts, key))
    try:
        if opts.schedule == "elastic":
            run.start_precursors()  # the model copy overlaps loading and planning the suite
        suite, sched, used, bad, later = _plan(suite, ctx, opts, key, run.metric_jobs)
        for name, cause in bad.items():
            run.bad[name] = cause
            progress(f"{name}: FAILED (not scored): {cause}", 0.0)
        if sched.kind == "direct":  # predicted faster than the elastic plan: no model copy to wait for
            run.drop_precursors()
            progress("elastic asked for, direct planned: one trial per dataset loading from storage (metrics on the "
                     "CPU pool) is predicted faster here than copying the model to shared memory first", 0.0)
        progress(f"{sched.kind}: {len(sched.trials)} trials on {opts.nodes}x{opts.gpus_per_node} slots, "
                 f"predicted {sched.makespan_s:.1f}s", 0.0)
        if while_running is not None:
            while_running()
        makespan = run.execute(suite, sched, later, key)
        if run.failed_err is not None:
            raise run.failed_err
        if run.failed:
            raise EvalError(f"evaluation of {uri} failed: {run.failed} (logs in {out / 'trials'})")
        if len(run.bad) == len(suite.datasets):
            raise EvalError(f"evaluation of {uri} scored no dataset: " + "; ".join(f"{d}: {c}" for d, c in run.bad.items()))
        scores = aggregate(suite, ctx, out, skip=run.bad, jobs=run.metric_jobs)  # a plugin's, in a metric process
    finally:
        run.close()
    res = EvalResult(uri=uri, run=run_name, step=step, suite=suite.name, schedule=opts.schedule,
                     nodes=opts.nodes, gpus_per_node=opts.gpus_per_node, cpu_workers_per_node=sched.cpu_workers_per_node,
                     makespan_s=makespan, predicted_makespan_s=sched.makespan_s,
                     precursor_s=run.precursor_s if sched.kind == "elastic" else [], scores=scores,
                     trials=sorted(run.results, key=lambda t: t.id), out_dir=str(out), priors_used=used,
                     ran=sched.kind, failed=dict(sorted(run.bad.items())))
    (out / "result.json").write_text(res.model_dump_json(indent=1))
    if opts.learn_priors:
        learn(res, suite, key, Path(opts.priors_path) if opts.priors_path else None)
    return res


def _precursor_step(suite: Suite, opts: EvalOptions, key: str) -> Pending:
    """A precursor's deadline: `trial_stall_s`, or 10x the predicted remote load (the learned one when used)."""
    ppath = Path(opts.priors_path) if opts.priors_path else None
    load = (P.apply_priors(suite, key, ppath)[0] if opts.use_priors else suite).model_load_s.remote
    return copying(suite.trial_stall_s, load)


def _is_lmeval(d: SuiteDataset) -> bool:
    return d.dataset == "tasks.evaluation.lmeval.dataset:make"  # lmeval.source.FACTORY


def aggregate_dataset(suite: Suite, ctx: EvalContext, out: Path, d: SuiteDataset, jobs: MetricJobs | None = None
                      ) -> dict:
    """One dataset's aggregate from its chunks' score files (chunks in any order); for an lm-eval task, lm-eval's
    task metrics with the sample count its group aggregation weighs by. A plugin's (not `frenzys_own`) is made in a
    metric process of `jobs` when given, so its factory and `aggregate` never run in the evaluator."""
    if twice := repeated_id(out / "predictions" / d.name):
        raise EvalError(f"{d.name} ({d.source}): {twice}; an example's `id` names its prediction and must be unique in "
                        "its dataset: give each example its own `id` in `example()` (its index, say), or none")
    if jobs is not None and not frenzys_own(d.source):
        agg = jobs.aggregate({"dataset": d.name, "source": d.source, "mode": d.mode, "options": d.options}, ctx, out)
        if agg.examples != d.examples:
            raise EvalError(f"{d.name}: {agg.examples} of {d.examples} examples scored in {out / 'scores' / d.name}")
        return agg.metrics
    files = sorted((out / "scores" / d.name).glob("*.json"))
    per = [s for f in files for s in json.loads(f.read_text())["scores"]]
    if len(per) != d.examples:
        raise EvalError(f"{d.name}: {len(per)} of {d.examples} examples scored in {out / 'scores' / d.name}")
    if _is_lmeval(d):
        from tasks.evaluation.lmeval.source import task_metrics

        return task_metrics(suite.lmeval, d.name, per)  # type: ignore[arg-type]
    return resolve(d.source, d.mode, d.options, ctx).aggregate(per)


def repeated_id(pred_dir: Path) -> str | None:
    """The first `id` that two predictions of one dataset share (its chunks' `*.jsonl` under `pred_dir`), said as
    `examples 0 and 3 have the same id 'same'`; None when each is its own (red team 41q X8: accepted in silence)."""
    seen: dict[object, int] = {}
    for f in sorted(pred_dir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if (first := seen.setdefault(row["id"], row["i"])) != row["i"]:
                return f"examples {first} and {row['i']} have the same id {row['id']!r}"
    return None


def aggregate(suite: Suite, ctx: EvalContext, out: Path, skip: dict[str, str] | None = None,
              jobs: MetricJobs | None = None) -> dict[str, dict[str, float]]:
    """Scores per dataset (but those in `skip`: failed): the aggregate a metric job made when the dataset's last chunk
    was scored (`aggregates/<name>.json`), or made here; lm-eval tasks then with their groups (those whose tasks were
    all scored), by lm-eval's aggregation."""
    res, lm_tasks = {}, {}
    for d in suite.datasets:
        if d.name in (skip or {}):
            continue
        early = out / "aggregates" / f"{d.name}.json"
        agg = json.loads(early.read_text()) if early.exists() else aggregate_dataset(suite, ctx, out, d, jobs)
        (lm_tasks if _is_lmeval(d) else res)[d.name] = agg
    if lm_tasks:
        from tasks.evaluation.lmeval.source import finish

        res.update(finish(suite.lmeval, lm_tasks))  # type: ignore[arg-type]
    return res


def learn(res: EvalResult, suite: Suite, key: str, path: Path | None = None) -> Path:
    """Fold a run's per-example times and per-trial fixed costs into the priors.

    A load prior (`shm`, `remote`) is the mean `TrialResult.fixed_s` of the run's trials that ran to the end: the
    whole cost of one more trial, exit and unhidden process start included. The `loaded` event alone (`load_s`)
    under-counts it whenever a warm process had imported torch ahead of time, and a plan learned from it split small
    suites into many short trials that each paid more than predicted (benchmarks/results/evaluation.md, 2026-11-27).
    """
    per: dict[str, dict[str, float]] = {}
    for d in suite.datasets:
        cs = [c for t in res.trials for c in t.chunks if c.dataset == d.name and not c.cached]
        n = sum(c.stop - c.start for c in cs)
        if n:
            per[d.name] = {"infer_s_per_example": sum(c.infer_s for c in cs) / n,
                           "metric_s_per_example": sum(c.metric_s for c in cs) / n}
    loads: dict[str, float] = {}
    ran = [t for t in res.trials if t.error is None]
    shm = [t.fixed_s for t in ran if t.load == "shm"]
    remote = [t.fixed_s for t in ran if t.load == "remote"] + [s for s in res.precursor_s if s > 0]
    if shm:
        loads["shm"] = sum(shm) / len(shm)
    if remote:
        loads["remote"] = sum(remote) / len(remote)
    return P.update_priors(key, per, loads, path)
