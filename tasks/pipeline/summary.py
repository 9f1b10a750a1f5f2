"""What a finished run shows: the run report's record and the `SubmitResult` the flow returns, both built from the
`Run` alone."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.ledger import Allocation, RunRecord
from tasks.evaluation.summary import EvalSummary
from tasks.paths import place_key
from tasks.pipeline.evaluations import scored, step_uri
from tasks.pipeline.request import SubmitRequest, SubmitResult
from tasks.pipeline.run import TERMINAL, Run, Stage
from tasks.planning.plans import ResourcePlan
from tasks.report import RunReport, StragglerSummary
from tasks.stragglers.request import StragglerReport
from tasks.training import checkpoint as ck
from tasks.training.request import TrainResult
from tasks.training.storage import Storage


def committed_steps(root: str) -> list[int]:
    """Every step committed under `root`, earlier attempts' included (what the report counts)."""
    try:
        return sorted(m.step for m in ck.committed(Storage(root)))
    except Exception:  # noqa: BLE001 - the report falls back to this run's own checkpoints
        return []


def run_report(run: Run) -> RunReport:
    """The report of a trained, evaluated run."""
    assert run.result is not None and run.attempt is not None
    return _report(run.request, run.cluster, run.plans, run.attempt.plan, run.attempt.allocation, run.result,
                   run.evaluations, run.timings_s, [r.line() for r in run.recoveries], run.stragglers,
                   [f.line() for f in run.evaluation_failures])


def rerun_report(done: SubmitResult, request: SubmitRequest, cluster: str) -> RunReport:
    """The report of a finished run submitted again (`already_finished`'s result): its scores as the history holds
    them now (a later `evaluate-pending` pass's included) and every failure, so the report the rerun names says what
    the rerun printed (red team 41r S19: it showed the scores of when it was first written)."""
    return _report(request, cluster, done.plans, done.plan, done.allocation, done.train, done.evaluations,
                   done.timings_s, [r.line() for r in done.recoveries], done.stragglers,
                   [f.line() for f in done.evaluation_failures])


def _report(request: SubmitRequest, cluster: str, plans: list[ResourcePlan], chosen: ResourcePlan,
            allocation: Allocation, res: TrainResult, evaluations: list[EvalSummary], timings_s: dict[str, float],
            recoveries: list[str], strag: StragglerReport | None, failures: list[str]) -> RunReport:
    job = request.job
    return RunReport(job=job.name, model=job.model.display_name, cluster=cluster, plans=plans[:10],
                     chosen=min(plans.index(chosen), 9) if chosen in plans else 0,
                     allocation=allocation, final_step=res.final_step,
                     resumed_from_step=res.resumed_from_step, tokens_per_s=res.tokens_per_s,
                     checkpoints=res.checkpoints, progress=str(Path(res.run_dir) / "progress.jsonl"),
                     evaluations=evaluations, timings_s=timings_s, spikes=res.spike_counts,
                     committed_steps=committed_steps(job.training.checkpoint.uri),
                     recoveries=recoveries, evaluation_failures=failures,
                     stragglers=StragglerSummary(**strag.model_dump(include=set(StragglerSummary.model_fields)))
                     if strag else None)


def run_record(run: Run) -> RunRecord:
    """The ledger's record of `run`: where its files are and how far it got (the result once reported)."""
    r = run.request
    return RunRecord(job=run.job, stage=run.stage.value, checkpoint_root=r.job.training.checkpoint.uri or "",
                     run_dir=run.run_dir, history_dir=r.history_dir, suite=r.suite_spec if run.suite else "",
                     steps=r.job.training.steps, report=run.report, error=run.error,
                     result=submit_result(run).model_dump_json() if run.stage is Stage.REPORTED else None)


def name_taken(recs: list[RunRecord], request: SubmitRequest, active_jobs: set[str]) -> str | None:
    """Why this job may not run under its name now: another run of that name (another checkpoint root: another
    user's, or another directory's; `recs` are the ledger's runs of the name) is not finished and its name holds GPUs
    or waits for them. None when the name is free, or only this very run has it (a rerun resumes it)."""
    if request.job.name not in active_jobs:
        return None
    root = request.job.training.checkpoint.uri
    for rec in recs:
        if place_key(rec.checkpoint_root) != place_key(root or "") and rec.stage not in {s.value for s in TERMINAL}:
            return (f"{rec.job}: another run of this name is running ({rec.owner}, checkpoints in "
                    f"{rec.checkpoint_root}); give the job another name, or wait for it to end")
    return None


def foreign_root(request: SubmitRequest) -> str | None:
    """Why this job may not train under its checkpoint root: the newest step committed there is another job's (its
    evaluations and scores would be filed under that job's name, and this one would wait for scores that never
    come). None when the root is empty, unreadable (the trainer says why) or this job's own."""
    root = request.job.training.checkpoint.uri
    try:
        found = ck.committed(Storage(root or ""))
    except Exception:  # noqa: BLE001 - the trainer's resume names a root it cannot read
        return None
    if not found or found[0].run == request.job.name:
        return None
    return (f"{root} holds the checkpoints of job {found[0].run!r} (newest step {found[0].step}): give "
            f"{request.job.name!r} its own training.checkpoint.uri, or name the job {found[0].run!r} to continue that "
            "run")


def foreign_run_dir(request: SubmitRequest) -> str | None:
    """Why this job may not use its run directory: it holds another job's run (its job.json), whose report, result
    and trace this one would overwrite or mix with its own. None when it is empty or this job's."""
    try:
        other = json.loads((Path(str(request.run_dir)) / "job.json").read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None  # none yet (the trainer writes it), or not a job file of ours
    if not other or other == request.job.name:
        return None
    return (f"the run directory {request.run_dir} holds the run of job {other!r} (its job.json), not "
            f"{request.job.name!r}: give each job its own --run-dir (the default is runs/<job name>)")


def outputs_in_root(request: SubmitRequest) -> str | None:
    """Why this job may not run with these directories: its run directory (the trace, log and report) or its history
    directory (the evaluations' outputs) is its local checkpoint root or inside it (`checkpoint.uri: .` beside the
    default `runs/<job name>`). Frenzy never writes among checkpoints, so this would fail after training (red team 41h
    N13): refused before anything starts, naming the settings to change. None when each is outside the root."""
    root = request.job.training.checkpoint.uri or ""
    if not root or ("://" in root and not root.startswith("file://")):
        return None  # an object store holds no directory of this machine
    ckdir = Path(root.removeprefix("file://")).expanduser().resolve()
    inside = [f"the {what} {q} ({setting})" for what, setting, p in (
        ("run directory", "--run-dir, default ./runs/<job name>", request.run_dir),
        ("history directory", "--history-dir, default ./evals", request.history_dir))
        if p and ((q := Path(p).expanduser().resolve()) == ckdir or ckdir in q.parents)]
    if not inside:
        return None
    # a root that holds the directory submitted from (`uri: .`, `..`) is no directory of the checkpoints' own: moving
    # the root is a fix; a root of their own (`uri: ck` with `--history-dir ck/evals`) already is one (red team 41i)
    cwd = Path.cwd().resolve()
    fix = ("Give the checkpoints a directory of their own (training.checkpoint.uri: ck, say), or move those "
           "directories outside the root" if ckdir == cwd or ckdir in cwd.parents else
           f"Move {'it' if len(inside) == 1 else 'them'} outside the root (e.g. the default --run-dir runs/<job name> "
           "and --history-dir evals, beside it)")
    return (f"{request.job.name}: {' and '.join(inside)} {'is' if len(inside) == 1 else 'are'} inside the checkpoint "
            f"root {ckdir} (training.checkpoint.uri: {root}); Frenzy never writes among checkpoints, so this run would "
            f"fail after training. {fix}")


def same_place(a: str | None, b: str | None) -> bool:
    """Whether two checkpoint roots are one place, however spelled (tasks.paths.place_key: file://, relative, a
    trailing slash, a symbolic link)."""
    return a is not None and b is not None and place_key(a) == place_key(b)


def this_run(records: list[RunRecord], root: str | None) -> RunRecord | None:
    """Of `records` (one job name's runs, the most recently updated first), the run at `root` however it is spelled;
    with no root, the newest."""
    if root is None:
        return records[0] if records else None
    return next((r for r in records if same_place(r.checkpoint_root, root)), None)


def already_finished(rec: RunRecord | None, request: SubmitRequest, suite: str = "") -> SubmitResult | None:
    """The result of this very job if it has already finished: the same name and checkpoint root, reported, and its
    final step still committed there. Rerunning it then reports that run instead of training zero steps, with the
    scores the history holds now (evaluations that ended after the run reported are not left out). Not when this
    submit asks for evaluation and a committed step of the run was never evaluated (that run had evaluation off,
    red team 41i N6): the pipeline then resumes at the final step, trains nothing and evaluates those steps."""
    root = request.job.training.checkpoint.uri
    if (done := _finished(rec, request)) is None or rec is None:
        return None
    now = scored(rec.history_dir, rec.job, suite, rec.checkpoint_root) if suite else {}
    evals = {s: e for s, e in now.items() if s <= done.train.final_step} | {e.step: e for e in done.evaluations}
    evals = {s: e.model_copy(update={"earlier": True}) if e.failed else e for s, e in evals.items()}  # red team 41q Y4
    failed = [f.model_copy(update={"earlier": True}) for f in done.evaluation_failures if f.step not in evals]
    if never_evaluated(rec, request, suite):
        return None  # evaluation asked for, and committed steps never evaluated (it was off): the run evaluates them
    again = sorted({f.step for f in failed} | {s for s, e in evals.items() if e.failed})
    notes = [n for n in [fewer_steps(request, done.train.final_step), failed_before(again, root or "", rec)] if n]
    return done.model_copy(update={"already_finished": True, "evaluations": [evals[s] for s in sorted(evals)],
                                   "evaluation_failures": failed, "notes": notes})


def _finished(rec: RunRecord | None, request: SubmitRequest) -> SubmitResult | None:
    """The reported result of this very job (same name and root) whose final step is still committed there."""
    root = request.job.training.checkpoint.uri
    if rec is None or rec.stage != Stage.REPORTED.value or rec.result is None or not same_place(rec.checkpoint_root, root):
        return None
    if request.job.training.steps not in committed_steps(root or ""):
        return None  # more steps asked for, or the final checkpoint is gone: train
    return SubmitResult.model_validate_json(rec.result)


def never_evaluated(rec: RunRecord | None, request: SubmitRequest, suite: str = "") -> list[int]:
    """The committed steps of this job's finished run that were never evaluated on `suite` (nor tried), when this
    submit asks for evaluation: the rerun trains nothing and evaluates exactly these."""
    if not suite or rec is None or (done := _finished(rec, request)) is None:
        return []
    evals = {s for s in scored(rec.history_dir, rec.job, suite, rec.checkpoint_root) if s <= done.train.final_step}
    evals |= {e.step for e in done.evaluations} | {f.step for f in done.evaluation_failures}
    root = request.job.training.checkpoint.uri or ""
    return [s for s in committed_steps(root) if s <= done.train.final_step and s not in evals]


def failed_before(steps: list[int], root: str, rec: RunRecord) -> str | None:
    """What to say about the steps whose evaluation (or some of its datasets) failed in the finished run or a later
    evaluation and that have no full score since: the causes shown are from then (the cause may be fixed by now),
    and how to have them evaluated again."""
    if not steps:
        return None
    one = step_uri(root, steps[0])
    return (f"step(s) {', '.join(map(str, steps))}: their evaluation (or some of its datasets) failed in an earlier "
            f"evaluation of {rec.job} and was not tried again by this run; the causes below are from then. "
            f"To evaluate them again now: `frenzy evaluate {one} "
            f"--suite {rec.suite or 'SUITE'}` (one per step), or a pass of the evaluate-pending deployment (hourly; "
            "now: `prefect deployment run evaluate-pending/evaluate-pending`), then submit again to see the scores")


def fewer_steps(request: SubmitRequest, final_step: int) -> str | None:
    """What to say when the job asks for fewer steps than its run holds (the job was edited after it ran): the result
    is the longer run's, and a shorter run needs its own checkpoint root."""
    job, asked = request.job, request.job.training.steps
    if final_step <= asked:
        return None
    return (f"{job.name} now asks for {asked} steps, but its run (checkpoints in {job.training.checkpoint.uri}) holds "
            f"{final_step}: this is the {final_step}-step run, not a {asked}-step one (its step {asked} was trained on "
            f"a {final_step}-step schedule). To train {asked} steps, give the job a new name or a new "
            "training.checkpoint.uri")


def submit_result(run: Run) -> SubmitResult:
    """What `frenzy submit --json` prints for a reported run."""
    assert run.result is not None and run.attempt is not None and run.report is not None
    return SubmitResult(job=run.job, plan=run.attempt.plan, plans=run.plans, allocation=run.attempt.allocation,
                        train=run.result, evaluations=run.evaluations, stragglers=run.stragglers, report=run.report,
                        released=not run.held, timings_s=run.timings_s, recoveries=run.recoveries,
                        evaluation_failures=run.evaluation_failures,
                        notes=[n for n in [fewer_steps(run.request, run.result.final_step), unscored_note(run),
                                           failed_note(run)] if n])


def unscored_note(run: Run) -> str | None:
    """deployment mode: the committed steps (still on disk) with neither a score nor a failure when submit stopped
    waiting (`eval_timeout_s` ran out: a paused pool, no worker, slow evaluations), with the command that evaluates
    them: a run no worker takes never scores its step (red team 41q G3: the note promised a worker would)."""
    if run.mode != "deployment" or run.result is None:
        return None
    settled = {e.step for e in run.evaluations} | {f.step for f in run.evaluation_failures}
    on_disk = set(committed_steps(run.result.checkpoint_uri))
    left = sorted({c.step for c in run.result.checkpoints} & on_disk - settled)
    if not left:
        return None
    r, more = run.request, " (and alike for the others)" if len(left) > 1 else ""
    return (f"no score for step(s) {', '.join(map(str, left))} within eval_timeout_s ({r.eval_timeout_s:.0f} s; the "
            "warning above names each one's run and its state): a run still Scheduled or Running scores its step only "
            f"if a worker takes it or its process finishes; to evaluate one now: `frenzy evaluate "
            f"{step_uri(run.result.checkpoint_uri, left[0])} --suite {r.suite_spec} --history-dir {r.history_dir}`{more}, "
            "or let the hourly evaluate-pending run, or submitting the job again, evaluate them")


def failed_note(run: Run) -> str | None:
    """The steps whose evaluation failed in this run (after the one rerun a crash gets), with the command that
    evaluates them again once the cause is fixed (a dead worker, a full disk): a second loss ended the step with its
    cause and no way on (red team 41r S4)."""
    now = [f.step for f in run.evaluation_failures if not f.earlier]
    if not now or run.result is None:
        return None
    r, more = run.request, " (one per step)" if len(now) > 1 else ""
    return (f"step(s) {', '.join(map(str, now))}: no score (the causes below); once the cause is fixed, evaluate "
            f"again with `frenzy evaluate {step_uri(run.result.checkpoint_uri, now[0])} --suite {r.suite_spec} "
            f"--history-dir {r.history_dir}`{more}, or with a server a pass of the evaluate-pending deployment "
            "(`prefect deployment run evaluate-pending/evaluate-pending`); submitting the job again then shows the scores")
