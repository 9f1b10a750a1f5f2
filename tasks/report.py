"""The run report of one submitted job: one self-contained HTML file (pictures inlined) and a markdown summary.

It shows what a person wants to see after `frenzy submit` or `frenzy demo`: the chosen plan beside the
alternatives, where HAS placed it, the loss curve, every evaluated checkpoint's scores by step, and the straggler
heatmap. Pure logic: the `submit` flow builds a `RunReport` and publishes the markdown as an artifact.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from pydantic import BaseModel

from cluster.ledger import Allocation
from tasks.evaluation.summary import EvalSummary
from tasks.planning.plans import ResourcePlan
from tasks.training.checkpoint import CheckpointRecord
from tasks.training.guard import SpikeCounts


class StragglerSummary(BaseModel):
    """The headline of the straggler analysis, as the report shows it."""

    slowdown: float
    waste: float
    worst_optype: str
    worst_stage: str
    worst_dp_rank: str
    heatmap: str | None


class RunReport(BaseModel):
    """Everything the report shows; paths point at files the pipeline wrote."""

    job: str
    model: str
    cluster: str
    plans: list[ResourcePlan]
    chosen: int
    """Index into `plans` of the plan HAS placed."""
    allocation: Allocation
    final_step: int
    resumed_from_step: int | None
    tokens_per_s: float
    checkpoints: list[CheckpointRecord]
    progress: str
    """The trainer's progress.jsonl (the loss curve)."""
    evaluations: list[EvalSummary]
    stragglers: StragglerSummary | None
    timings_s: dict[str, float]
    """Wall seconds of each stage."""
    spikes: SpikeCounts | None = None
    """What the trainer's spike guard did (skipped data changes what the model was trained on)."""
    committed_steps: list[int] = []
    """Every step committed under the job's checkpoint root, earlier attempts' too (a resumed run's own
    `checkpoints` are only the ones it wrote); empty: those of `checkpoints`."""
    recoveries: list[str] = []
    """One sentence per automatic recovery: the failure, the action, where the job went (tasks/pipeline/request.Recovery.line)."""
    evaluation_failures: list[str] = []
    """One line per committed step whose evaluation failed as a whole (tasks/pipeline/evaluations.EvalFailure.line)."""


NOT_SCORES = frozenset({"isolated"})
"""Per-example values the evaluation records that describe how it ran, not how good the model is (`isolated`: the
generated code ran in the sandbox's full isolation). The report states them; it does not plot them as scores."""

NO_STRAGGLER_S = 1.005
"""Below this slowdown (0.5% of the step time) no worker held the others up: naming a "worst" op type, stage or
rank there would name noise, and it changed between identical runs."""


def committed(r: RunReport) -> list[int]:
    """The committed steps the report counts, oldest first: the same set its text, loss plot and scores use."""
    return sorted(set(r.committed_steps) or {c.step for c in r.checkpoints})


def training_line(r: RunReport) -> str:
    """Steps, the measured throughput beside the chosen plan's prediction, and the committed checkpoints."""
    planned = r.plans[r.chosen].tokens_per_s
    vs = f" (plan predicted {planned:,.0f}: measured is {r.tokens_per_s / planned:.0%} of it)" if planned > 0 else ""
    steps = committed(r)
    return (f"step {r.final_step}" + (f" (resumed from {r.resumed_from_step})" if r.resumed_from_step is not None
                                      else "") + f", {r.tokens_per_s:,.0f} tokens/s measured{vs}, {len(steps)} "
            f"checkpoint{'s' * (len(steps) != 1)} committed" + (f" (steps {', '.join(map(str, steps))})" if steps else ""))


def straggler_line(s: StragglerSummary) -> str:
    """The slowdown and, only when some worker did hold the others up, where."""
    head = f"slowdown S = {s.slowdown:.3f} ({100 * max(0.0, s.waste):.1f}% of the step time lost to stragglers)"
    if s.slowdown < NO_STRAGGLER_S:
        return head + "; no worker held the others up"
    return head + f"; worst op type {s.worst_optype}, stage {s.worst_stage}, DP rank {s.worst_dp_rank}"


def conditions(evals: list[EvalSummary]) -> list[str]:
    """How the evaluation ran, per dataset (the NOT_SCORES values of the newest evaluation)."""
    newest = max(evals, key=lambda e: e.step, default=None)
    return [f"{ds} {m} = {v:.3g}" for ds, ms in sorted(newest.scores.items()) for m, v in sorted(ms.items())
            if m in NOT_SCORES] if newest else []


def loss_curve(progress: str | Path) -> list[tuple[int, float]]:
    """(step, loss) of every step record; a resumed run's later records win for a repeated step."""
    p = Path(progress)
    if not p.exists():
        return []
    by_step: dict[int, float] = {}
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "step":
            by_step[int(rec["step"])] = float(rec["loss"])
    return sorted(by_step.items())


def _png(fig: object) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    return base64.b64encode(buf.getvalue()).decode()


def _loss_png(curve: list[tuple[int, float]], ckpt_steps: list[int]) -> str | None:
    if not curve:
        return None
    from matplotlib.figure import Figure  # not pyplot: a notebook keeps its inline backend

    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    ax.plot([s for s, _ in curve], [v for _, v in curve], color="#1f77b4", lw=1.5, label="training loss")
    for s in ckpt_steps:
        ax.axvline(s, color="#999", lw=0.7, ls=":")
    ax.set_xlabel("step (dotted: committed checkpoints)")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    return _png(fig)


def flat_limits(values: list[float]) -> tuple[float, float] | None:
    """y limits for a series that never changes (all zeros, say): from 0 to at least 1, so that it reads as the
    value it is; matplotlib's own +-0.04 around it made 0.0 look like noise. None when the series moves."""
    if not values or len(set(values)) > 1:
        return None
    v = values[0]
    return min(0.0, v) - 0.05 * max(1.0, abs(v)), max(1.0, v) * 1.05


def _scores_png(evals: list[EvalSummary]) -> str | None:
    series: dict[str, list[tuple[int, float]]] = {}
    for e in sorted(evals, key=lambda e: e.step):
        for ds, ms in e.scores.items():
            for m, v in ms.items():
                if m not in NOT_SCORES:
                    series.setdefault(f"{ds} {m}", []).append((e.step, v))
    if not series:
        return None
    from matplotlib.figure import Figure  # not pyplot: a notebook keeps its inline backend

    n = len(series)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig = Figure(figsize=(3.2 * cols, 2.4 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (name, pts) in zip(axes.flat, sorted(series.items()), strict=False):
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", ms=3)
        ax.set_title(name, fontsize=9)
        if (lim := flat_limits([v for _, v in pts])) is not None:
            ax.set_ylim(*lim)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.supxlabel("checkpoint step", fontsize=9)
    fig.tight_layout()
    return _png(fig)


def _plan_rows(r: RunReport) -> list[dict[str, str]]:
    return [{"": "chosen" if i == r.chosen else "", "rank": str(p.rank), "GPU": p.gpu_type, "GPUs": str(p.gpus),
             "layout": p.layout.label(), "peak GiB": f"{p.predicted_device_gib:.1f}",
             "step s": f"{p.est_step_time_s:.3g}", "GPU-s/step": f"{p.gpu_seconds_per_step:.3g}",
             "tok/s": f"{p.tokens_per_s:,.0f}"} for i, p in enumerate(r.plans)]


def _score_rows(r: RunReport) -> list[dict[str, str]]:
    """One row per metric, one column per evaluated step (reads left to right as training goes on)."""
    evals = sorted(r.evaluations, key=lambda e: e.step)
    metrics = sorted({(ds, m) for e in evals for ds, ms in e.scores.items() for m in ms if m not in NOT_SCORES})
    failed = sorted({ds for e in evals for ds in e.failed})  # a visible entry per dataset an evaluation left unscored
    return [{"metric": f"{ds} {m}", **{f"step {e.step}": f"{e.scores[ds][m]:.4g}" if m in e.scores.get(ds, {}) else ""
                                      for e in evals}} for ds, m in metrics] + [
        {"metric": f"{ds} (not scored)", **{f"step {e.step}": "FAILED" if ds in e.failed else "" for e in evals}}
        for ds in failed]


def _html_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join(("<tr class='chosen'>" if row.get("") == "chosen" else "<tr>") +
                   "".join(f"<td>{html.escape(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _md_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(none)"
    keys = list(rows[0])
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)] +
                     ["| " + " | ".join(row[k] for k in keys) + " |" for row in rows])


def _placement(r: RunReport) -> str:
    return ", ".join(f"{n.node}: {n.gpu_type} GPUs [{', '.join(map(str, n.gpu_indices))}]" for n in r.allocation.nodes)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _plans_heading(r: RunReport) -> str:
    return "Plans (MARP), chosen beside the alternatives" if len(r.plans) > 1 else "Plan (MARP): the only one that fits"


def markdown(r: RunReport, html_path: str | None = None) -> str:
    """The report as markdown (the Prefect artifact), without pictures."""
    p = r.plans[r.chosen]
    lines = [f"# {r.job}: {r.model} on {r.cluster}", "",
             f"**Plan:** {p.gpus} x {p.gpu_type}, {p.layout.label()}, predicted peak {p.predicted_device_gib:.1f} GiB "
             f"per GPU. **Placement:** {_placement(r)}.",
             f"**Training:** {training_line(r)}.",
             f"**Spikes:** {r.spikes.summary()}." if r.spikes and r.spikes.summary() else "", ""]
    if r.stragglers:
        lines += [f"**Stragglers:** {straggler_line(r.stragglers)}.", ""]
    if r.recoveries:
        lines += ["## Recoveries", "", *(f"{i}. {x}" for i, x in enumerate(r.recoveries, 1)), ""]
    lines += [f"## {_plans_heading(r)}", "", _md_table(_plan_rows(r)), "", "## Scores by checkpoint", "",
              _md_table(_score_rows(r))]
    if fails := [*r.evaluation_failures, *(line for e in r.evaluations for line in e.failed_lines())]:
        lines += ["", *(f"- {line}" for line in fails)]
    if cond := conditions(r.evaluations):
        lines += ["", "Evaluated with: " + ", ".join(cond) + "."]
    lines += ["", "Stage times: " + ", ".join(f"{k} {v:.1f} s" for k, v in r.timings_s.items())]
    if html_path:
        lines += ["", f"Full report with plots: `{html_path}`"]
    return "\n".join(lines)


_CSS = ("body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}th{background:#f3f3f3}tr.chosen td{font-weight:600;background:#eef6ee}img{max-width:100%}"
        ".kv{color:#555}")


def render_html(r: RunReport, out: str | Path) -> Path:
    """Write the self-contained HTML report (every picture inlined as PNG) and return its path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    p = r.plans[r.chosen]
    loss = _loss_png(loss_curve(r.progress), committed(r))
    scores = _scores_png(r.evaluations)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Frenzy run report: {html.escape(r.job)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(r.job)}: {html.escape(r.model)} on {html.escape(r.cluster)}</h1>",
             f"<p class='kv'>Chosen plan: <b>{p.gpus} x {html.escape(p.gpu_type)}</b>, {html.escape(p.layout.label())}, "
             f"predicted peak {p.predicted_device_gib:.1f} GiB per GPU, {p.est_step_time_s:.3g} s per step. "
             f"Placed on {html.escape(_placement(r))} (allocation {r.allocation.id[:8]}).</p>",
             f"<h2>{_plans_heading(r)}</h2>", _html_table(_plan_rows(r)),
             f"<h2>Training</h2><p class='kv'>{html.escape(_sentence(training_line(r)))}."
             + (f" {html.escape(r.spikes.summary())}." if r.spikes and r.spikes.summary() else "") + "</p>"]
    if r.recoveries:
        parts.append("<h3>Recoveries</h3><ol>" + "".join(f"<li>{html.escape(x)}</li>" for x in r.recoveries) + "</ol>")
    if loss:
        parts.append(f"<img alt='loss curve' src='data:image/png;base64,{loss}'>")
    parts += ["<h2>Evaluation: scores by checkpoint</h2>", _html_table(_score_rows(r))]
    if fails := [*r.evaluation_failures, *(line for e in r.evaluations for line in e.failed_lines())]:
        parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in fails) + "</ul>")
    if cond := conditions(r.evaluations):
        parts.append(f"<p class='kv'>Evaluated with: {html.escape(', '.join(cond))}.</p>")
    if scores:
        parts.append(f"<img alt='scores by step' src='data:image/png;base64,{scores}'>")
    if r.stragglers:
        s = r.stragglers
        parts.append(f"<h2>Stragglers</h2><p class='kv'>{html.escape(_sentence(straggler_line(s)))}.</p>")
        if s.heatmap and Path(s.heatmap).exists():
            img = base64.b64encode(Path(s.heatmap).read_bytes()).decode()
            parts.append(f"<img alt='straggler heatmap' src='data:image/png;base64,{img}'>")
    parts.append("<h2>Stage times</h2>" + _html_table([{k: f"{v:.1f} s" for k, v in r.timings_s.items()}]))
    parts.append("</body></html>")
    from tasks.outdir import atomic_file

    # whole, or the previous one
    atomic_file(Path(out), "\n".join(parts).encode(), "the run report", overwrite=True, by_content=True, wait=True,
                make_parent=True)
    return out
