"""Score history per training run: one JSON line per evaluated checkpoint, and a plot of each metric by step.

The history lives in `<history_dir>/<run>/history.jsonl` (default `evals/`). `pending()` lists the committed
checkpoints of a root that have no entry for a suite yet (what the scheduled deployment evaluates).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from tasks.paths import place_key
from tasks.training import checkpoint as ck
from tasks.training.storage import Storage
from tasks.userfiles import LIMITS, UserFileError, json_loads, load_json, path_kind, read_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class HistoryEntry(BaseModel):
    """One line of a run's `history.jsonl`: one checkpoint's scores on one suite."""

    run: str
    step: int
    uri: str
    """The checkpoint evaluated (its step directory)."""
    suite: str
    scores: dict[str, dict[str, float]]
    """{dataset: {metric: value}}."""
    time: str = ""
    """When the score was recorded (UTC, ISO 8601)."""
    failed: dict[str, str] = {}
    """Datasets not scored, with their causes: such a step is still pending (`survey_pending`)."""
    result: str = ""
    """The evaluation's `result.json` (beside its predictions, scores and trial logs); empty on a line written before
    lines named it: `result_file` finds that one in the old layout."""


def history_file(history_dir: str | Path, run: str) -> Path:
    return Path(history_dir) / run / "history.jsonl"


def append(history_dir: str | Path, run: str, step: int, uri: str, suite: str, scores: dict,
           failed: dict[str, str] | None = None, result: str | Path = "") -> Path:
    p = history_file(history_dir, run)
    p.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"run": run, "step": step, "uri": uri, "suite": suite, "scores": scores,
                       "time": datetime.now(UTC).isoformat(timespec="seconds")} | ({"failed": failed} if failed else {})
                      | ({"result": str(result)} if result else {}))
    with open(p, "a") as f:  # one short line per append: atomic on a local filesystem
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return p


def read(history_dir: str | Path, run: str, suite: str | None = None) -> list[HistoryEntry]:
    """Entries oldest step first; the newest entry wins when a step of one root was evaluated twice. Roots that
    share a run name share its history: each root's line of a step is kept (one root's score is not another's)."""
    p = history_file(history_dir, run)
    if path_kind(p, "score history") == "missing":
        return []
    by_step: dict[tuple[str, int, str], HistoryEntry] = {}
    for n, line in enumerate(read_text(p, "score history", LIMITS["jsonl"]).splitlines(), 1):
        if line.strip():
            e = json_loads(line, str(p), line=n)
            try:  # the run is the file's own (a line written before entries named it has none)
                entry = HistoryEntry.model_validate({"run": run, **e} if isinstance(e, dict) else e)
            except ValidationError as err:
                bad = ", ".join(".".join(map(str, x["loc"])) or "(top level)" for x in err.errors())
                raise UserFileError(f"{p}:{n}: not a score history entry ({bad}: an object with suite, step, uri and "
                                    "scores); delete the line (the next evaluation of that step writes it again)") from None
            if suite is None or entry.suite == suite:
                by_step[(entry.suite, entry.step, uri_key(entry.uri))] = entry
    return [by_step[k] for k in sorted(by_step)]


def uri_key(uri: str) -> str:
    """`place_key(uri)`, or `uri` itself where it names no place a path can (a NUL byte, a loop): such a line is
    still read, as its own root."""
    try:
        return place_key(uri)
    except (OSError, ValueError):
        return uri


def result_file(history_dir: str | Path, e: HistoryEntry) -> Path | None:
    """The `result.json` of the evaluation that wrote line `e`: the one the line names, or, for a line of the old
    layout (none named), `<history_dir>/<run>/step_<N>/<suite>/result.json` when that still holds this very
    checkpoint's result (another root of the same run name may have replaced it: then None, not its files)."""
    if e.result:
        return Path(e.result)
    old = Path(history_dir) / e.run / ck.step_dir(e.step) / e.suite / "result.json"
    if path_kind(old, "evaluation result") != "file":
        return None
    try:
        uri = load_json(old, "evaluation result").get("uri", "")
    except (OSError, ValueError, AttributeError):  # unreadable, or not a result: not this line's files
        return None
    return old if isinstance(uri, str) and uri and uri_key(uri) == uri_key(e.uri) else None


def _stderr_twin(name: str) -> str | None:
    """The metric whose standard error series `name` is (lm-eval's `acc_stderr,none` of `acc,none`), else None."""
    metric, sep, filt = name.partition(",")
    return metric.removesuffix("_stderr") + sep + filt if metric.endswith("_stderr") else None


def preload_plotting() -> threading.Thread:
    """Import the plotting stack (matplotlib's Figure and Agg canvas: about a second, most of drawing the plot) in a
    daemon thread, so that the plot after an evaluation does not start with it; call it while the evaluation's
    trials run (the calling process waits on them). Importing again later waits for this one to finish."""

    def imports() -> None:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401

    t = threading.Thread(target=imports, name="preload-plotting", daemon=True)
    t.start()
    return t


def root_tag(root: str) -> str:
    """8 hex digits that stand for checkpoint root `root` however it is spelled (tasks.paths.place_key)."""
    return hashlib.sha256(uri_key(root).encode()).hexdigest()[:8]


def root_label(root: str) -> str:
    """How a plot's legend names checkpoint root `root`: its tag and the end of its path (`1a2b3c4d …/lena/a`)."""
    tail = "/".join(root.rstrip("/").split("/")[-2:])
    return f"{root_tag(root)} …/{tail}"


def _series(entries: list[HistoryEntry]) -> dict[str, dict[str, dict[int, float]]]:
    """{"DATASET METRIC": {checkpoint root: {step: value}}}: roots that share a run name share its history, and each
    keeps its own line (red team 41l: the plot drew one value per step, the newest root's)."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for e in entries:
        root = uri_key(e.uri.rstrip("/").rsplit("/", 1)[0])
        for ds, metrics in e.scores.items():
            for m, v in metrics.items():
                out.setdefault(f"{ds} {m}", {}).setdefault(root, {})[e.step] = v
    return out


def figure(history_dir: str | Path, run: str, suite: str) -> Figure | None:
    """One panel per dataset metric against the training step (a metric's standard error as its error bars, not a
    panel of its own), one line per checkpoint root with a legend of their tags where several roots share the run
    name; None when there is nothing to plot. Fixed spacing, not tight_layout: with the dozens of panels of an
    lm-eval suite, measuring every tick label took seconds of each evaluation."""
    entries = read(history_dir, run, suite)
    if not entries:
        return None
    from matplotlib.figure import Figure  # not pyplot: a notebook keeps its inline backend

    lines = _series(entries)
    panels = sorted(n for n in lines if _stderr_twin(n) not in lines)
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(4.2 * cols, 2.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, name in zip(axes.flat, panels, strict=False):
        errs = next((pts for twin, pts in lines.items() if _stderr_twin(twin) == name), {})
        for root, pts in sorted(lines[name].items()):
            steps, err = sorted(pts), errs.get(root)
            ax.errorbar(steps, [pts[s] for s in steps], marker="o", yerr=[err.get(s, 0.0) for s in steps] if err
                        else None, capsize=3 if err else 0, label=root_label(root) if len(lines[name]) > 1 else None)
        if len(lines[name]) > 1:
            ax.legend(fontsize=7, title="checkpoint root", title_fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{run}: suite {suite}")
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.12 / rows ** 0.5, top=1 - 0.12 / rows ** 0.5, hspace=0.65,
                        wspace=0.3)
    return fig


def plot(history_dir: str | Path, run: str, suite: str, out: Path | None = None) -> Path | None:
    """Draw `figure` to `out` (default `<history_dir>/<run>/history-<suite>.png`); None when there is nothing to
    plot."""
    fig = figure(history_dir, run, suite)
    if fig is None:
        return None
    out = out or history_file(history_dir, run).with_name(f"history-{suite}.png")
    from tasks.outdir import atomic_path

    # redrawn after every evaluation (two at once take turns): never half a PNG
    with atomic_path(out, "the score history plot", by_content=True, wait=True, make_parent=True) as tmp:
        fig.savefig(tmp, dpi=90)
    return out


def pending(root_uri: str, history_dir: str | Path, suite: str) -> list[str]:
    """Step URIs of every committed checkpoint under `root_uri` not yet evaluated on `suite` (or whose newest
    evaluation left a dataset unscored: `failed`), oldest first."""
    return survey_pending(root_uri, history_dir, suite)[0]


def survey_pending(root_uri: str, history_dir: str | Path, suite: str) -> tuple[list[str], list[str]]:
    """`pending`'s step URIs, and why each step whose manifest is there but cannot be read is not among them (a
    corrupt or truncated manifest: never evaluated, so it is named, not skipped in silence)."""
    storage = Storage(root_uri)
    manifests, broken = ck.survey(storage)
    out = []
    for m in sorted(manifests, key=lambda m: m.step):
        uri = storage.url(ck.step_dir(m.step))
        # scored means scored at this very URI: roots that share a run name (copies, two users' `exp` named together)
        # share a history file, and one root's score is not another's
        # a step whose newest entry names failed datasets is not done: the next pass evaluates it again
        done = {(e.step, uri_key(e.uri)) for e in read(history_dir, m.run, suite) if not e.failed}
        if (m.step, place_key(uri)) not in done:
            out.append(uri)
    return out, [str(err) for err in broken]
