"""The evaluation flows: one checkpoint (`evaluate_checkpoint`) and every checkpoint not yet evaluated
(`evaluate_pending`, for schedules). Scores become a table artifact, the run's score history a markdown
artifact and a plot; the work itself is `tasks.evaluation.runner.evaluate`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from prefect import flow, get_client, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.runtime import flow_run

from flows.logs import verbatim_console
from flows.naming import run_name, submission_base
from tasks.artifactkey import run_key, step_root
from tasks.evaluation import history
from tasks.evaluation.claim import claimed
from tasks.evaluation.pending import Target, missing, no_roots, targets
from tasks.evaluation.request import EvaluateRequest, PendingRequest
from tasks.evaluation.suite import load_suite
from tasks.evaluation.summary import EvalSummary
from tasks.pipeline.liveness import fenced


def _run_fence() -> Callable[[], str | None] | None:
    """Why this process must not publish its evaluation: its flow run no longer RUNNING on the server (a submit marked
    it Crashed, its process having sent no heartbeat for 90 s, SIGSTOPped say, and ran the step again: red team 41q
    G3's sequel). Read once, just before the publish; a server that does not answer then does not stop it (an
    outage is no reason to lose a score: the run made again, if any, finds it recorded and evaluates nothing)."""
    rid, name = flow_run.get_id(), flow_run.get_name() or "?"
    if rid is None:
        return None

    def fence() -> str | None:
        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(rid).state
        except Exception as err:  # noqa: BLE001 - see above: publish
            get_run_logger().warning("could not read this run's state before publishing its evaluation (%s: %s); "
                                     "publishing it", type(err).__name__, err)
            return None
        return fenced(state.type.value if state is not None else None, name)

    return fence


@task(name="evaluate", task_run_name="evaluate-{request.uri}")
def evaluate_task(request: EvaluateRequest) -> EvalSummary:
    from tasks.evaluation.record import Fenced, evaluate_and_record  # the evaluation stack and torch: when one runs

    logger = get_run_logger()
    request = request.resolved(submission_base())
    suite = load_suite(request.suite)
    art = create_progress_artifact(0.0, description=f"evaluating {request.uri} on {suite.name}")

    def progress(msg: str, frac: float) -> None:
        logger.info(msg)
        update_progress_artifact(art, 100.0 * frac, description=msg)

    try:
        _, summary = evaluate_and_record(request.uri, suite, request.options(), request.history_dir, progress,
                                         request.reevaluate, overwrite=True,  # the pipeline's own directory
                                         fence=_run_fence())
    except Fenced as err:
        logger.error("%s", err)
        raise
    logger.info("step %d: %s (makespan %.1fs, predicted %.1fs)", summary.step, summary.scores, summary.makespan_s,
                summary.predicted_makespan_s)
    for line in summary.failed_lines():  # the others are scored; the step stays pending (docs/evaluation.md)
        logger.error("%s", line)
    return summary


def _publish(summary: EvalSummary, history_dir: str) -> None:
    rows: list[dict] = [{"dataset": ds, "metric": k, "value": round(v, 5)} for ds, ms in summary.scores.items()
                        for k, v in ms.items()]
    rows += [{"dataset": ds, "metric": "FAILED (not scored)", "value": why} for ds, why in summary.failed.items()]
    create_table_artifact(rows, key=run_key(f"eval-{summary.suite}", summary.run, step_root(summary.uri)),
                          description=f"{summary.run} step {summary.step}: suite {summary.suite}")
    root = history.uri_key(step_root(summary.uri))  # the artifact is this root's: another root's lines are its own
    entries = [e for e in history.read(history_dir, summary.run, summary.suite) if history.uri_key(step_root(e.uri)) == root]
    cols = sorted({f"{ds} {m}" for e in entries for ds, ms in e.scores.items() for m in ms})
    lines = [f"# {summary.run}: {summary.suite} by step", "", "| step | " + " | ".join(cols) + " | failed |",
             "|---" * (len(cols) + 2) + "|"]
    for e in entries:
        vals = {f"{ds} {m}": v for ds, ms in e.scores.items() for m, v in ms.items()}
        lines.append(f"| {e.step} | " + " | ".join(f"{vals[c]:.4g}" if c in vals else "" for c in cols)
                     + f" | {', '.join(e.failed)} |")
    if summary.history_plot:
        lines += ["", f"Plot: `{summary.history_plot}`"]
    create_markdown_artifact("\n".join(lines), key=run_key(f"eval-history-{summary.suite}", summary.run, step_root(summary.uri)),
                             description="score history of the run")


@flow(name="evaluate-checkpoint", flow_run_name=run_name("evaluate-{request.uri}"), log_prints=True)
def evaluate_checkpoint(request: EvaluateRequest) -> EvalSummary:
    """Evaluate one committed checkpoint on a suite: scores table, score history and its plot."""
    verbatim_console()
    request = request.resolved(submission_base())
    summary = evaluate_task(request)
    _publish(summary, request.history_dir)
    return summary




@flow(name="evaluate-pending", log_prints=True)
def evaluate_pending(request: PendingRequest) -> list[EvalSummary]:
    """Evaluate, oldest first, each committed checkpoint not yet evaluated (for a schedule). A root or checkpoint
    that cannot be evaluated fails alone: it is named (log and artifact), and every other one is still evaluated."""
    verbatim_console()
    logger = get_run_logger()
    todo = targets(request, submission_base())
    if not todo:
        logger.warning("%s", no_roots(request, submission_base()))
    out: list[EvalSummary] = []
    failed: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    gone: list[tuple[str, str]] = []
    for t in todo:
        try:
            if why := missing(t):  # its own count and rows, never folded into skipped (red team 41r)
                logger.warning("missing: %s; the pass goes on", why)
                gone.append((t.root, why))
                continue
            suite = load_suite(t.suite).name
            uris, unreadable = history.survey_pending(t.root, t.history_dir, suite)
        except Exception as err:  # noqa: BLE001 - one root that cannot be read does not stop the others
            failed.append((t.root, f"{type(err).__name__}: {err}"))
            logger.error("cannot cover %s: %s", t.root, err)
            continue
        for why in unreadable:  # a step whose manifest cannot be read: named, the others still evaluated
            failed.append((t.root, why))
            logger.error("cannot evaluate a checkpoint under %s: %s", t.root, why)
        logger.info("%d checkpoint(s) to evaluate under %s on %s", len(uris), t.root, t.suite)
        for i, uri in enumerate(uris, 1):
            logger.info("%d/%d under %s: %s", i, len(uris), t.root, uri)
            try:
                _evaluate_claimed(request, t, suite, uri, (out, failed, skipped))
            except Exception as err:  # noqa: BLE001 - one step (a server error starting its run) does not end the pass
                failed.append((uri, f"{type(err).__name__}: {err}"))
                logger.error("evaluation of %s could not run: %s; the pass goes on", uri, err)
    _publish_pending(out, failed, skipped, gone)
    return out


def _evaluate_claimed(request: PendingRequest, t: Target, suite: str, uri: str,
                      into: tuple[list[EvalSummary], list[tuple[str, str]], list[tuple[str, str]]]) -> None:
    """Evaluate `uri` under a claim (tasks/evaluation/claim.py): a step another run is evaluating, or scored since
    this run listed it, is skipped and said so; the claim goes when the evaluation ends, failed or not."""
    logger = get_run_logger()
    out, failed, skipped = into
    by = f"evaluate-pending run {flow_run.get_name() or flow_run.get_id()}"
    with claimed(t.history_dir, uri, suite, by) as holder:
        if holder is not None:
            why = f"being evaluated by {holder.describe(time.time())}"
        elif uri not in history.pending(t.root, t.history_dir, suite):
            why = "scored meanwhile by another run"
        else:
            why = ""
            state = evaluate_checkpoint(EvaluateRequest(uri=uri, suite=t.suite, schedule=request.schedule,
                                                        gpus_per_node=request.gpus_per_node,
                                                        history_dir=t.history_dir, reevaluate=False),
                                        return_state=True)
            if state.is_completed():
                out.append(done := completed_summary(state, t.history_dir, suite, uri))
                if done.failed:  # scored but for these: named here, and the step is pending again next pass
                    failed.append((uri, "; ".join(done.failed_lines())))
            else:
                failed.append((uri, state.message or state.name))
                logger.error("evaluation of %s failed: %s", uri, state.message)
    if why:
        skipped.append((uri, why))
        logger.info("%s: skipped, %s", uri, why)


def completed_summary(state: Any, history_dir: str, suite: str, uri: str) -> EvalSummary:
    """The summary of the Completed evaluation run of `uri` on `suite`: its result, or, where its state came back
    from the API without its data (a dropped connection: Prefect read the state again, and results are not
    persisted), the score that run wrote to the history. A step that was scored is never reported as failed with
    "State data is missing" (red team 41h R4)."""
    from prefect.exceptions import MissingResult

    from tasks.evaluation.engine import resolve_manifest
    from tasks.evaluation.record import recorded
    from tasks.training import checkpoint as ck

    try:
        return state.result()
    except MissingResult as err:
        storage, m = resolve_manifest(uri)
        done = recorded(history_dir, m.run, m.step, suite, storage.url(ck.step_dir(m.step)), whole=False)
        if done is None:
            raise RuntimeError(f"its evaluation run Completed, but its state came back from the API without its result "
                               f"and the history in {history_dir} has no score of {m.run} step {m.step} on {suite}: "
                               "evaluate it again (the next pass does)") from err
        return done


def _publish_pending(done: list[EvalSummary], failed: list[tuple[str, str]], skipped: list[tuple[str, str]],
                     gone: list[tuple[str, str]]) -> None:
    lines = [f"# evaluate-pending: {pending_counts(done, failed, skipped, gone)}", ""]
    for title, rows, what in (("failed", failed, "checkpoint or root"), ("skipped", skipped, "checkpoint or root"),
                              ("missing", gone, "checkpoint root")):
        if rows:
            lines += [f"| {title}: {what} | why |", "|---|---|"] + [f"| `{u}` | {_cell(why)} |" for u, why in rows] + [""]
    create_markdown_artifact("\n".join(lines), key="evaluate-pending", description="the last pending evaluation pass")


def pending_counts(done: list[EvalSummary], failed: list[tuple[str, str]], skipped: list[tuple[str, str]],
                   gone: Sequence[tuple[str, str]] = ()) -> str:
    """The pass in counts that add up: a step scored but for some datasets is evaluated (and counted among those
    with failed datasets), not also failed; failed are the steps or roots that could not be evaluated at all (red team
    41q Y1: "2 evaluated, 2 failed" for two checkpoints read as four); skipped are steps another run has or is scoring;
    missing are checkpoint roots that do not exist (deleted, or a job that never committed: red team 41r counted them
    as skipped)."""
    partly = sum(1 for d in done if d.failed)
    with_failed = f" ({partly} with failed datasets)" if partly else ""
    return (f"{len(done)} evaluated{with_failed}, {len(failed) - partly} could not be evaluated, "
            f"{len(skipped)} skipped, {len(gone)} missing")


def _cell(text: str, limit: int = 2000) -> str:
    """One table cell: the whole cause (paths included) on one line, cut only past `limit` and then said so."""
    one = " ".join(text.replace("|", "/").split())
    return one if len(one) <= limit else one[:limit] + f" … ({len(one) - limit} more characters in the flow run's log)"
