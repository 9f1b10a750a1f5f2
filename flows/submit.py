"""The `submit` flow: one job from "here is my model and batch size" to trained, evaluated and analysed checkpoints,
with its GPUs given back.

    plan (MARP, cached) -> place (HAS through the ledger; waits in the queue) -> train on the allocation's GPUs
    -> evaluate each committed checkpoint while training goes on -> final evaluation -> release -> stragglers
    -> run report (HTML + markdown artifact)

`frenzy submit`, `frenzy demo`, the `submit` deployment and a notebook all call this flow. The GPUs are released on
every exit path (success, failure, cancellation: the trainer commits its current step first); a crashed flow process
gives them back when its lease runs out. A re-run resumes from the newest verified checkpoint.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event
from prefect.futures import PrefectFuture
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from cluster.catalog import default_catalog
from cluster.inventory import Cluster, load_cluster
from cluster.ledger import DEFAULT_LEASE_S, Allocation, LeaseKeeper, Ledger, LedgerError
from cluster.nodecheck import check_nodes, cordon_faulty, local_probe
from flows.evaluate import EvaluateRequest, evaluate_task
from flows.naming import run_name
from flows.place import LeaseLost, place, release
from flows.plan import PlanRequest, plan_resources, plans_markdown
from flows.stragglers import StragglerReport, StragglerRequest, stragglers_task
from flows.train import NodeRanks, TrainRequest, TrainResult, train_task
from tasks.diagnosis.agent import config_from_env
from tasks.diagnosis.diagnose import Diagnosis, diagnose
from tasks.diagnosis.recovery import Action, decide
from tasks.errors import FrenzyError
from tasks.evaluation import history
from tasks.evaluation.record import EvalSummary
from tasks.evaluation.suite import load_suite
from tasks.formschema import drop_null_branches
from tasks.jobspec import JobSpec
from tasks.planning.calibration import OomObservation, load_observations, model_key, record_oom
from tasks.planning.plans import RankBy, ResourcePlan
from tasks.report import RunReport, StragglerSummary, markdown, render_html
from tasks.training import checkpoint as ck
from tasks.training.elastic import Placed, note_placement, recovery_lines, replan_after_oom, tune_auto
from tasks.training.launch import TrainFailed, default_run_dir, request_kill, request_stop
from tasks.training.storage import Storage

EVAL_DEPLOYMENT = "evaluate-checkpoint/evaluate-on-checkpoint"


class SubmitRequest(BaseModel):
    """A job to run end to end: the model and batch size are the user's, the GPUs are Frenzy's choice."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              json_schema_extra=drop_null_branches)

    job: JobSpec = Field(json_schema_extra={"position": 0})
    """The job (the job YAML as a form): model, batch, steps, checkpointing."""
    cluster: str = Field("local", json_schema_extra={"position": 1})
    """Where it may run: `local` (this worker's GPUs, or its CPU), a preset, or a cluster YAML on the worker."""
    suite: SkipJsonSchema[str | None] = None
    """Evaluation suite (core, quick, or a suite YAML) overriding the job's `evaluation.suite` (`frenzy submit
    --suite`); empty: the job's, else core. Not on the form, which has the job's: one field per concept."""
    ledger: str | None = None
    """Allocation ledger: a SQLite path or SQLAlchemy URL; empty: $FRENZY_LEDGER or ~/.frenzy/ledger.db."""
    rank_by: RankBy = "balanced"
    """Plan ranking HAS walks (balanced: the fastest plan among those within 25% of the cheapest compute)."""
    max_wait_s: float = Field(3600.0, gt=0)
    """Give up (cleanly, leaving the queue) when no plan fits within this many seconds."""
    lease_s: float = Field(DEFAULT_LEASE_S, ge=5)
    """Allocation lease; a crashed flow's GPUs come back this long after its last heartbeat."""
    evaluation: Literal["auto", "in-flow", "deployment", "off"] = Field("auto", title="Evaluation mode")
    """in-flow: evaluate each checkpoint inside this run while training continues; deployment: the
    `evaluate-on-checkpoint` deployment does it on the commit events; auto: deployment when the server has it."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device kind for training and evaluation; auto uses CUDA when the allocation holds GPUs."""
    run_dir: str | None = None
    """Progress, log, op traces, result and report; default runs/<job name>."""
    history_dir: str = "evals"
    """Evaluation results and the per-run score history."""
    eval_timeout_s: float = Field(1800.0, gt=0)
    """deployment mode: how long to wait for the triggered evaluations after training before evaluating here."""
    max_restarts: int = Field(2, ge=0, le=20)
    """Automatic recoveries from training failures (diagnosed from the log; tasks/diagnosis/recovery.py)."""
    hang_s: float = Field(900.0, ge=5)
    """A trainer that writes no progress record for this long is killed and treated as a node fault."""
    executor: str = Field("local", pattern=r"^(local|ray|ray://\S+)$")
    """`local`: training runs as processes on this worker's own GPUs; `ray` (the Ray cluster this worker joined,
    or $RAY_ADDRESS) or `ray://HOST:PORT`: the allocation's ranks run as Ray actors on its nodes, which may be
    several (with cluster `local`, the Ray cluster's nodes are the inventory)."""

    @property
    def cluster_spec(self) -> str:
        """The inventory: the Ray cluster's nodes when training runs on Ray and no other cluster is named."""
        return self.executor if self.executor != "local" and self.cluster == "local" else self.cluster


class SubmitResult(BaseModel):
    """What a submitted job leaves behind (`frenzy submit --json`)."""

    job: str
    plan: ResourcePlan
    """The plan HAS placed."""
    plans: list[ResourcePlan]
    """Every plan considered, best first."""
    allocation: Allocation
    train: TrainResult
    evaluations: list[EvalSummary]
    """One per evaluated checkpoint, oldest first."""
    stragglers: StragglerReport | None
    report: str
    """Path of the self-contained HTML run report."""
    released: bool
    """True once the allocation's GPUs are back in the ledger."""
    timings_s: dict[str, float]
    recoveries: list[dict] = []
    """Each training failure, its diagnosis and the action taken, in order."""


class PipelineError(FrenzyError, RuntimeError):
    """The pipeline cannot go on; the message names the fix."""


def failure_message(job: str, failure: BaseException, root_cause_line: str | None, reason: str, log: Path) -> str:
    """Why training stopped, in one paragraph, the cause first: the trainer's own message when it named the problem
    (a missing data.path, storage it cannot reach: a restart fails the same way), else the root-cause line the
    diagnosis found in the log; then the action decided and where the log is. The tracebacks stay in the log."""
    said = str(failure).splitlines()[0].strip() if str(failure) else ""
    if said and not said.startswith(("trainer exited with code", "trainer killed")):
        return f"{job}: {said} (the trainer stopped on it; fix it and rerun; log {log})"
    cause = (root_cause_line or "").strip() or said or "the trainer failed without an error line"
    return f"{job}: training failed: {cause}. {reason}; log {log}"


def _committed_steps(root: str) -> list[int]:
    """Every step committed under `root`, earlier attempts' included (what the report counts)."""
    try:
        return sorted(m.step for m in ck.committed(Storage(root)))
    except Exception:  # noqa: BLE001 - the report falls back to this run's own checkpoints
        return []


def _host_node(alloc: Allocation) -> str:
    """The allocation's node, which must be this worker's host: training runs as local processes."""
    host = socket.gethostname()
    names = [n.node for n in alloc.nodes]
    if len(names) != 1 or not (names[0] == host or names[0].startswith(f"{host}-")):
        raise PipelineError(f"HAS placed the job on {', '.join(names)}, but this worker ({host}) trains only on its "
                            "own GPUs; run the worker on that node, or submit with cluster=local")
    return names[0]


def training_request(request: SubmitRequest, alloc: Allocation, chosen: ResourcePlan, run_dir: Path,
                     suite: str = "") -> TrainRequest:
    """The trainer's request for exactly the allocation's GPUs and the chosen plan's layout."""
    job = request.job.model_copy(deep=True)
    if job.training.micro_batch is None:
        job.training.micro_batch = chosen.layout.micro_batch
    if request.executor != "local":  # Ray: one actor per allocated GPU on its node, the nodes may be several
        placement = [NodeRanks(node=n.node, ranks=len(n.gpu_indices), gpus=n.gpu_type != "cpu") for n in alloc.nodes]
        return TrainRequest(job=job, nproc=sum(p.ranks for p in placement), tp=chosen.layout.tp, resume=True,
                            device="cpu" if not placement[0].gpus else request.device, run_dir=str(run_dir),
                            analyze_stragglers=False, evaluation_suite=suite or None, executor=request.executor,
                            placement=placement)
    _host_node(alloc)
    node = alloc.nodes[0]
    on_cpu = node.gpu_type == "cpu"
    return TrainRequest(job=job, nproc=len(node.gpu_indices), tp=chosen.layout.tp, resume=True,
                        device="cpu" if on_cpu else request.device, run_dir=str(run_dir),
                        gpu_indices=None if on_cpu else node.gpu_indices, analyze_stragglers=False,
                        evaluation_suite=suite or None)


def _eval_mode(request: SubmitRequest) -> str:
    if request.evaluation != "auto":
        return request.evaluation
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():  # the ephemeral API runs no workers: evaluate here
        return "in-flow"
    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(EVAL_DEPLOYMENT)
        return "deployment"
    except Exception:  # noqa: BLE001 - no such deployment (or no server): evaluate here
        return "in-flow"


def _suite_spec(request: SubmitRequest) -> str:
    """The suite as the user named it (a built-in name or a YAML path), for the evaluations this flow runs; the
    history files are keyed by the suite's own name."""
    return request.suite or (request.job.evaluation.suite if request.job.evaluation else "core")


def _from_history(request: SubmitRequest, run: str, suite: str) -> dict[int, EvalSummary]:
    """Summaries of the steps of `run` the history already holds for `suite` (evaluated earlier or elsewhere)."""
    out = {}
    for e in history.read(request.history_dir, run, suite):
        res = Path(request.history_dir) / run / ck.step_dir(e["step"]) / suite / "result.json"
        out[e["step"]] = EvalSummary(uri=e["uri"], run=run, step=e["step"], suite=suite, scores=e["scores"],
                                     makespan_s=0.0, predicted_makespan_s=0.0, result=str(res), history_plot=None)
    return out


class _Evaluator:
    """Evaluates each newly committed checkpoint of a root, oldest first, in this flow's thread; steps the
    history already has (a resumed job) are not evaluated again."""

    def __init__(self, request: SubmitRequest, root: str, run: str, suite: str, device: str) -> None:
        self.request, self.root, self.suite, self.device = request, root, suite, device
        self.done: dict[int, EvalSummary] = _from_history(request, run, suite)
        self.missed: set[int] = set()

    def _evaluate(self, m: ck.Manifest) -> None:
        uri = f"{self.root.rstrip('/')}/{ck.step_dir(m.step)}"
        try:
            self.done[m.step] = evaluate_task(EvaluateRequest(uri=uri, suite=_suite_spec(self.request),
                                                              device=self.device,
                                                              executor=self.request.executor,
                                                              history_dir=self.request.history_dir))
        except Exception as err:  # noqa: BLE001 - one checkpoint that cannot be evaluated does not fail the job
            self.missed.add(m.step)
            get_run_logger().warning("evaluation of step %d failed: %s (retention may have removed it: raise "
                                     "training.checkpoint.keep to evaluate every checkpoint)", m.step, err)

    def catch_up(self) -> None:
        ms = [m for m in ck.committed(Storage(self.root)) if m.step not in self.done and m.step not in self.missed]
        for m in sorted(ms, key=lambda m: m.step):
            self._evaluate(m)


def collect_scores(read: Callable[[], dict[int, EvalSummary]], steps: list[int], timeout_s: float,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> dict[int, EvalSummary]:
    """deployment mode: the scores the event-triggered evaluations wrote to the history, waiting (at most
    `timeout_s`) until every committed step in `steps` has one. The runs finish in any order: the final step's
    score can land before an earlier step's."""
    deadline = clock() + timeout_s
    while True:
        found = read()
        if set(steps) <= set(found) or clock() > deadline:
            return found
        sleep(2.0)


def _train_and_evaluate(request: SubmitRequest, treq: TrainRequest, suite: str, mode: str,
                        keeper: LeaseKeeper) -> tuple[TrainResult, list[EvalSummary]]:
    logger = get_run_logger()
    root = treq.job.training.checkpoint.uri
    device = "cuda" if treq.gpu_indices else "cpu"
    ev = _Evaluator(request, root, treq.job.name, suite, device) if mode == "in-flow" else None
    # only the deployment mode needs the commit events; in-flow, they would have each step evaluated twice
    treq = treq.model_copy(update={"announce_commits": mode == "deployment"})
    fut: PrefectFuture = train_task.submit(treq)
    progress = Path(treq.run_dir or ".") / "progress.jsonl"
    last_size, last_change = -1, time.monotonic()
    try:
        while not fut.state.is_final():
            size = progress.stat().st_size if progress.exists() else 0
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > request.hang_s:
                logger.error("no progress record for %.0f s: killing the trainer (a hang)", request.hang_s)
                request_kill(Path(treq.run_dir or "."), f"no progress record for {request.hang_s:.0f} s")
                last_change = time.monotonic()
            if keeper.lost.is_set():
                request_stop(Path(treq.run_dir or "."))
                fut.wait()
                raise LeaseLost(f"{treq.job.name}: the allocation's lease was lost while training; training was "
                                "stopped after committing its step")
            if ev is not None:
                ev.catch_up()
            fut.wait(timeout=2.0)
        result: TrainResult = fut.result()
    except BaseException:
        # cancelled, crashed or failed here: ask the trainer to commit its step and stop, then let it finish
        if not fut.state.is_final():
            request_stop(Path(treq.run_dir or "."))
            with contextlib.suppress(Exception):
                fut.wait(timeout=120)
        raise
    steps = [c.step for c in result.checkpoints]
    if ev is not None:  # the final evaluation, and any commit the loop had not reached yet
        ev.catch_up()
        evals = ev.done
    elif mode == "deployment":
        logger.info("waiting for the evaluate-on-checkpoint runs of steps %s", steps)
        evals = collect_scores(lambda: _from_history(request, result.job, suite), steps, request.eval_timeout_s)
        if missing := sorted(set(steps) - set(evals)):
            logger.warning("no score for step(s) %s within %.0f s of training's end%s", missing,
                           request.eval_timeout_s, "; evaluating the final step here" if max(steps) in missing else "")
        if steps and max(steps) not in evals:
            evals[max(steps)] = evaluate_task(EvaluateRequest(uri=result.checkpoints[-1].uri,
                                                              suite=_suite_spec(request), device=device,
                                                              history_dir=request.history_dir))
    else:
        evals = {}
    return result, [evals[s] for s in sorted(evals)]


class Recovery(BaseModel):
    diagnosis: Diagnosis
    action: Action


@task(name="recover", task_run_name="recover-{job}")
def recover_task(job: str, log: str, offset: int, restarts_done: int, max_restarts: int) -> Recovery:
    """Diagnose the failed attempt's part of the log, decide the action; visible as an artifact and an event."""
    with open(log, "rb") as f:
        f.seek(offset)
        d = diagnose(f.read(), agent=config_from_env())  # the LLM agent only where one is configured
    d.log = log
    act = decide(d, restarts_done, max_restarts)
    create_markdown_artifact(
        f"## Training failure of `{job}`\n\n| | |\n|---|---|\n| type | {d.type} ({d.category}) |\n"
        f"| where | rank {d.rank if d.rank is not None else '?'}, node {d.node or '?'} |\n"
        f"| root cause | `{(d.root_cause_line or '-').replace('|', '/')[:300]}` (line {d.line_no}) |\n"
        f"| symptoms | {len(d.evidence)} other error lines |\n| action | **{act.kind}**"
        f"{' + node check' if act.node_check else ''}: {act.reason} |\n",
        key=_key(f"diagnosis-{job}"), description=f"diagnosis of a training failure of {job}")
    emit_event(event="frenzy.training.failed", resource={"prefect.resource.id": f"frenzy.job.{job}"},
               payload={"type": d.type, "category": d.category, "rank": d.rank, "node": d.node,
                        "root_cause_line": d.root_cause_line, "action": act.kind, "reason": act.reason,
                        "restarts_done": restarts_done})
    return Recovery(diagnosis=d, action=act)


def _check_allocation_nodes(ledger: Ledger, alloc: Allocation, logger: object, executor: str = "local") -> None:
    """The recovery's node check on the allocation's nodes: on Ray, each is first asked whether it is alive at all
    (cluster/ray_health.py: dead nodes go `down`, unreachable ones are cordoned), then the rest run the two-round
    collective test on the nodes themselves; a node the test cannot clear (unverified) is cordoned too."""
    nodes = [n.node for n in alloc.nodes]
    probe = local_probe()
    if executor != "local":
        from cluster.ray_exec import ray_probe
        from cluster.ray_health import settle_suspects

        address = None if executor == "ray" else executor
        nodes, verdicts = settle_suspects(ledger, nodes, address)
        for v in verdicts.values():
            if v.verdict != "alive":
                logger.warning("node check: %s is %s (%s after %.1f s); %s", v.node, v.verdict, v.how,  # type: ignore[attr-defined]
                               v.seconds, "down" if v.verdict == "dead" else "cordoned")
        probe = ray_probe(address=address)
    if len(nodes) < 2:
        logger.info("node check skipped: %s healthy node(s) left in the allocation (%s) and the pairwise test needs "  # type: ignore[attr-defined]
                    "two; resuming on healthy GPUs as the ledger sees them", len(nodes), ", ".join(nodes) or "-")
        return
    res = check_nodes(nodes, probe=probe)
    for n in cordon_faulty(ledger, res):
        logger.warning("node check: %s failed its collective twice; cordoned", n)  # type: ignore[attr-defined]
    for n in res.unverified if executor != "local" else []:  # no node cleared it: not a pass on a cluster
        ledger.cordon(n, "unverified by the node check after a lost rank")
        logger.warning("node check: %s could not be verified; cordoned", n)  # type: ignore[attr-defined]


def _record_oom(job: JobSpec, plan: ResourcePlan, d: Diagnosis, cluster: Cluster) -> None:
    """An out-of-memory observation MARP learns from (tasks/planning/calibration.py): what it predicted, and the
    GPU it ran out on."""
    gpu = next(g for g in cluster.gpu_types(default_catalog()) if g.name == plan.gpu_type)
    record_oom(OomObservation(model_key=model_key(job), model=job.model.display_name, seq_len=job.training.seq_len,
                              gpu_type=plan.gpu_type, gpu_memory_gib=gpu.memory_gib, layout=plan.layout.label(),
                              predicted_device_gib=plan.predicted_device_gib, job=job.name, line=d.root_cause_line))


def _recover(request: SubmitRequest, ledger: Ledger, cluster: Cluster, alloc: Allocation, chosen: ResourcePlan,
             candidates: list[ResourcePlan], recoveries: list[dict], log: tuple[Path, int], failure: TrainFailed,
             logger: object) -> list[ResourcePlan]:
    """After a training failure: diagnose the log, record the recovery, check nodes; the plans to place next (the
    plans MARP gives after an out-of-memory, calibrated by it). Raises PipelineError when the run should stop."""
    job, (log_path, log_offset) = request.job, log
    rec = recover_task(job.name, str(log_path), log_offset, len(recoveries), request.max_restarts)
    recoveries.append(rec.model_dump())
    if rec.action.kind == "stop":
        raise PipelineError(failure_message(job.name, failure, rec.diagnosis.root_cause_line, rec.action.reason,
                                            log_path)) from failure
    if rec.action.node_check:
        _check_allocation_nodes(ledger, alloc, logger, request.executor)
    if rec.action.kind == "replan":
        _record_oom(job, chosen, rec.diagnosis, cluster)
        bigger = replan_after_oom(job, cluster, request.rank_by, load_observations())  # [elastic hook]
        if not bigger:
            raise PipelineError(f"{job.name}: out of memory on {chosen.gpu_type} ({chosen.layout.label()}), and "
                                "no plan has more memory per GPU on this cluster; lower micro_batch, enable "
                                "recompute or zero_stage 3, or add GPUs with more memory") from failure
        candidates = bigger
    logger.warning("recovery %d/%d: %s -> %s", len(recoveries), request.max_restarts, rec.diagnosis.type,
                   rec.action.kind)
    return candidates


def _analyse_stragglers(trace: str | None, logger: object) -> StragglerReport | None:
    """The straggler analysis of the run's op trace; the job trained, so a trace it cannot use is logged, not raised."""
    if not trace:
        return None
    try:
        return stragglers_task(StragglerRequest(trace=trace))
    except Exception as err:  # noqa: BLE001
        logger.warning("straggler analysis of %s failed: %s", trace, err)  # type: ignore[attr-defined]
        return None


@task(name="report")
def report_task(report: RunReport, path: str) -> str:
    """The run report: HTML with plots on disk, the same as a markdown artifact."""
    out = render_html(report, path)
    create_markdown_artifact(markdown(report, str(out)), key=_key(f"report-{report.job}"),
                             description=f"run report of {report.job}")
    return str(out)


def _key(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


@dataclass
class _Attempt:
    """One pass of the submit loop: where it was placed, and how training ended."""

    alloc: Allocation
    chosen: ResourcePlan
    placed: Placed
    """This attempt's resources, for the elastic hook's record of a recovery that moved the job."""
    log: tuple[Path, int]
    """The training log and its size before this attempt: the diagnosis reads only what this attempt wrote."""
    result: TrainResult | None = None
    evals: list[EvalSummary] = field(default_factory=list)
    failure: TrainFailed | None = None
    released: bool = False


def _runnable_plans(request: SubmitRequest, cluster: Cluster) -> list[ResourcePlan]:
    """MARP's plans the trainer can run (data x tensor parallel), best first, published as an artifact."""
    job = request.job
    plans = plan_resources(PlanRequest(job=job, cluster=request.cluster_spec, rank_by=request.rank_by, top=1000),
                           load_observations(), cluster)
    runnable = [p for p in plans if p.layout.pp == 1]  # the trainer runs data x tensor parallel layouts
    if not runnable:
        raise PipelineError(f"{job.name}: every plan needs pipeline parallelism (pp > 1), which the trainer does not "
                            "run yet; add GPUs with more memory or enable recompute / zero_stage 3")
    create_markdown_artifact(plans_markdown(PlanRequest(job=job, cluster=request.cluster_spec), runnable[:10]),
                             key=_key(f"plans-{job.name}"), description="MARP resource plans, best first")
    return runnable


def _check_shared_paths(request: SubmitRequest, alloc: Allocation, run_dir: Path) -> None:
    """On Ray: the run directory, the evaluation history and a local checkpoint root are the same directories on every
    node of the allocation (cluster/ray_exec.check_shared_paths); a PipelineError naming the fix when not."""
    from cluster.ray_exec import RayExecutorError, check_shared_paths

    folders: list[str | Path] = [run_dir, request.history_dir]
    uri = request.job.training.checkpoint.uri
    if "://" not in uri or uri.startswith("file://"):
        folders.append(uri.removeprefix("file://"))
    try:
        check_shared_paths([n.node for n in alloc.nodes], folders,
                           None if request.executor == "ray" else request.executor)
    except RayExecutorError as err:
        raise PipelineError(f"{request.job.name}: {err}") from None


def _attempt(request: SubmitRequest, ledger: Ledger, candidates: list[ResourcePlan], runnable: list[ResourcePlan],
             recoveries: list[dict], placed_before: Placed | None, run_dir: Path, suite: str,
             timings: dict[str, float], logger: object) -> _Attempt:
    """Place on the first candidate that fits, train and evaluate under a kept lease, and release the GPUs whatever
    happens; a training failure is returned (for diagnosis), anything else raises."""
    t = time.monotonic()
    if request.executor != "local":  # nothing is placed on a node Ray already knows is gone
        from cluster.ray_health import sync_ledger

        sync_ledger(ledger, None if request.executor == "ray" else request.executor)
    alloc = place(request.job.name, candidates, ledger_url=request.ledger, timeout_s=request.max_wait_s,
                  lease_s=request.lease_s, precision=request.job.training.precision, steps=request.job.training.steps)
    timings["queue"] += time.monotonic() - t
    chosen = candidates[alloc.plan_index]
    placed = note_placement(recoveries, placed_before, chosen, alloc, request.job, logger)  # [elastic hook]
    logger.info("placed on %s: plan %d (%d x %s, %s)",  # type: ignore[attr-defined]
                ", ".join(f"{n.node}{n.gpu_indices}" for n in alloc.nodes),
                runnable.index(chosen) + 1, chosen.gpus, chosen.gpu_type, chosen.layout.label())
    log_path = run_dir / "train.log"
    log_offset = log_path.stat().st_size if log_path.exists() else 0
    at = _Attempt(alloc=alloc, chosen=chosen, placed=placed, log=(log_path, log_offset))
    try:
        keeper = LeaseKeeper(ledger, alloc.id, request.lease_s)
        with keeper:
            t = time.monotonic()
            if request.executor != "local":  # every node must see the files this run writes, before it trains
                _check_shared_paths(request, alloc, run_dir)
            treq = training_request(request, alloc, chosen, run_dir, suite)
            tune_auto(treq.job, ledger, chosen, alloc, len(recoveries), logger)  # [elastic hook]
            mode = _eval_mode(request)
            logger.info("evaluation: %s%s", mode, f" on suite {suite}" if suite else "")  # type: ignore[attr-defined]
            try:
                at.result, at.evals = _train_and_evaluate(request, treq, suite, mode, keeper)
            except TrainFailed as err:
                at.failure = err
            timings["train+evaluate"] += time.monotonic() - t
    finally:
        try:
            release(alloc.id, request.ledger)
            at.released = True
        except LedgerError as err:  # the lease runs out anyway; say so rather than hide the original error
            logger.error("could not release allocation %s (%s); its lease expires in %.0f s",  # type: ignore[attr-defined]
                         alloc.id, err, request.lease_s)
    return at


@flow(name="submit", flow_run_name=run_name("submit-{request.job.name}"), log_prints=True)
def submit(request: SubmitRequest) -> SubmitResult:
    """Plan, place, train (evaluating checkpoints as they commit), evaluate, release, analyse, report."""
    logger = get_run_logger()
    # every file the run writes, as absolute paths resolved here: Ray's nodes run in the directory of `ray start`
    request = request.model_copy(update={"history_dir": str(Path(request.history_dir).absolute()),
                                         "run_dir": str(Path(request.run_dir).absolute()) if request.run_dir else None})
    job, t0, timings = request.job, time.monotonic(), {}
    suite = load_suite(request.suite or (job.evaluation.suite if job.evaluation else "core")).name \
        if request.evaluation != "off" else ""
    cluster = load_cluster(request.cluster_spec)  # an unknown cluster or suite fails before anything starts
    runnable = _runnable_plans(request, cluster)
    timings["plan"] = time.monotonic() - t0

    ledger = Ledger(request.ledger)
    ledger.sync(cluster)
    if suite:  # the scheduled evaluate-pending covers the roots the ledger knows
        ledger.note_checkpoints(job.name, Storage(job.training.checkpoint.uri).uri, _suite_spec(request))
    run_dir = (Path(request.run_dir) if request.run_dir else default_run_dir(job)).absolute()
    candidates, recoveries = runnable, []
    placed: Placed | None = None  # [elastic hook] the previous attempt's resources (tasks/training/elastic.py)
    timings["queue"] = timings["train+evaluate"] = 0.0
    while True:  # one pass per attempt: place, train, and on a training failure diagnose and recover
        at = _attempt(request, ledger, candidates, runnable, recoveries, placed, run_dir, suite, timings, logger)
        placed = at.placed
        if at.failure is None:
            break
        candidates = _recover(request, ledger, cluster, at.alloc, at.chosen, candidates, recoveries, at.log,
                              at.failure, logger)
        if any(c not in runnable for c in candidates):  # a replan after an OOM brings fresh plans
            runnable = candidates
    result, evals, chosen, alloc = at.result, at.evals, at.chosen, at.alloc
    assert result is not None  # an attempt without a failure trained

    t = time.monotonic()
    strag = _analyse_stragglers(result.trace, logger)
    timings["stragglers"] = time.monotonic() - t
    timings["total"] = time.monotonic() - t0
    rep = RunReport(job=job.name, model=job.model.display_name, cluster=cluster.name, plans=runnable[:10],
                    chosen=min(runnable.index(chosen), 9), allocation=alloc, final_step=result.final_step,
                    resumed_from_step=result.resumed_from_step, tokens_per_s=result.tokens_per_s,
                    checkpoints=result.checkpoints, progress=str(Path(result.run_dir) / "progress.jsonl"),
                    evaluations=evals, timings_s=timings, spikes=result.spike_counts,
                    committed_steps=_committed_steps(job.training.checkpoint.uri), recoveries=recovery_lines(recoveries),
                    stragglers=StragglerSummary(**strag.model_dump(include=set(StragglerSummary.model_fields)))
                    if strag else None)
    path = report_task(rep, str(Path(result.run_dir) / "report.html"))
    logger.info("report: %s", path)
    return SubmitResult(job=job.name, plan=chosen, plans=runnable, allocation=alloc, train=result,
                        evaluations=evals, stragglers=strag, report=path, released=at.released, timings_s=timings,
                        recoveries=recoveries)
