"""One evaluation trial as its own process: load the model, infer its chunks, write predictions, exit.

`python -m tasks.evaluation.trial SPEC.json` (or `--warm`, then SPEC.json's path on stdin) reports on stdout, one JSON object per line:
`loaded` (model ready), `beat` (a forward pass ran: at most one a second), `landed` (a chunk's predictions file is
complete), `scored` (naive schedule only: metrics computed here, on the GPU's time) and `done`. Predictions are
written atomically per chunk; a chunk whose file exists is not inferred again, so a retried trial resumes.

`score_chunk` is the metric job: it reads a predictions file and writes the per-example scores; `--metrics` runs
metric jobs one after another, read from stdin (tasks/evaluation/metricjobs.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from tasks.evaluation.datasets import DatasetError, EvalContext, EvalDataset, resolve


def chunk_paths(out_dir: Path, dataset: str, start: int, stop: int) -> tuple[Path, Path]:
    """(predictions, scores) files of one chunk."""
    stem = f"{start:06d}-{stop:06d}"
    return out_dir / "predictions" / dataset / f"{stem}.jsonl", out_dir / "scores" / dataset / f"{stem}.json"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def dataset_for(chunk: dict, ctx: EvalContext) -> EvalDataset:
    return resolve(chunk["source"], chunk["mode"], chunk.get("options"), ctx)


def score_chunk(chunk: dict, ctx: EvalContext, out_dir: Path) -> float:
    """The metric job of one chunk: scores every prediction; returns the seconds it took (0 when cached)."""
    pred, scores = chunk_paths(out_dir, chunk["dataset"], chunk["start"], chunk["stop"])
    if scores.exists():
        return 0.0
    t0 = time.perf_counter()
    ds = dataset_for(chunk, ctx)
    rows = [json.loads(line) for line in pred.read_text().splitlines()]
    per = [ds.score(ds.example(r["i"]), r["prediction"]) for r in rows]
    dt = time.perf_counter() - t0
    _atomic_write(scores, json.dumps({"scores": per, "metric_s": dt, "examples": len(per)}))
    return dt


def example_id(ex: object, i: int, source: str = "") -> str | int:
    """The `id` an example of a dataset gives (optional: red team 41p S3), else its index `i`. One that is not a str
    or an int (bytes, a set, a float, NaN: not strict JSON, or not JSON at all) is refused, naming the plugin, the
    example and the fix (red team 41q X8: `TypeError: Object of type set is not JSON serializable`, nothing more)."""
    v = ex.get("id", i) if isinstance(ex, dict) else i
    if isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    raise DatasetError(f"{source or 'the dataset'}: example {i} has the id {v!r} ({type(v).__name__}); an example's "
                       "`id` is written as JSON beside its prediction and must be a str or an int: return e.g. "
                       f"`str(...)` as `id` from `example()`, or no `id` (its index {i} is written)")


def run_trial(spec: dict, emit=None) -> None:
    """Load the model (from shm or remote storage), infer every chunk, optionally score them here."""
    import torch

    from tasks.evaluation.engine import LM, load_remote, load_shm, tokenizer_path

    emit = emit or (lambda ev: print(json.dumps(ev), flush=True))
    torch.set_num_threads(int(spec.get("threads", 1)))
    out = Path(spec["out_dir"])
    t0 = time.perf_counter()
    state, info = load_shm(Path(spec["shm_dir"])) if spec["load"] == "shm" else load_remote(spec["uri"])
    lm = LM(state, info, spec.get("device", "cpu"))
    beat(lm, emit)
    ctx = EvalContext(seq_len=int(info["seq_len"]), data=info.get("data"), tokenizer=tokenizer_path(info))
    emit({"event": "loaded", "load_s": time.perf_counter() - t0})
    for chunk in spec["chunks"]:
        pred, _ = chunk_paths(out, chunk["dataset"], chunk["start"], chunk["stop"])
        if pred.exists():
            emit({"event": "landed", "chunk": chunk, "infer_s": 0.0, "cached": True})
            continue
        t1 = time.perf_counter()
        ds = dataset_for(chunk, ctx)
        examples = [ds.example(i) for i in range(chunk["start"], chunk["stop"])]
        preds = ds.infer_batch(lm, examples)  # generation datasets decode the chunk in batches (KV cache)
        lines = [json.dumps({"i": i, "id": example_id(ex, i, chunk["source"]), "prediction": p})
                 for i, ex, p in zip(range(chunk["start"], chunk["stop"]), examples, preds, strict=True)]
        _atomic_write(pred, "\n".join(lines) + "\n")
        emit({"event": "landed", "chunk": chunk, "infer_s": time.perf_counter() - t1, "cached": False})
    if spec.get("metrics_on_gpu"):
        for chunk in spec["chunks"]:
            emit({"event": "scored", "chunk": chunk, "metric_s": score_chunk(chunk, ctx, out)})
    emit({"event": "done"})


BEAT_S = 1.0
"""A trial says it is making progress (`beat`) at most this often."""


def beat(lm, emit, every_s: float = BEAT_S) -> None:  # noqa: ANN001 - an LM, the trial's emit
    """Emit `{"event": "beat"}` (at most every `every_s` s) whenever the model runs a forward pass: a batch that
    finishes is progress, so the runner's deadline of a trial (tasks/evaluation/stall.py) counts from the last batch,
    not the last chunk, and a long honest chunk never reaches it; a dataset hung in its own code sends none."""
    import torch

    emb = next((m for m in lm.model.modules() if isinstance(m, torch.nn.Embedding)), None)
    last = [time.monotonic()]

    def hook(*_: object) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            emit({"event": "beat"})

    if emb is not None:  # every forward pass of Frenzy's GPT embeds its tokens first
        emb.register_forward_hook(hook)


def precursor(spec: dict) -> None:
    """A node's precursor: copy the checkpoint (verified) from storage into the node's shared memory once."""
    from tasks.evaluation.engine import load_remote, write_shm

    t0 = time.perf_counter()
    state, info = load_remote(spec["uri"])
    print(json.dumps({"event": "loaded", "load_s": time.perf_counter() - t0}), flush=True)  # progress: its deadline
    nbytes = write_shm(state, info, Path(spec["shm_dir"]))  # counts again from here (tasks/evaluation/stall.py)
    print(json.dumps({"event": "done", "bytes": nbytes, "load_s": time.perf_counter() - t0}), flush=True)


def _warm() -> str | None:
    """A process started ahead of its trial (`--warm`): the imports a trial needs now, while the runner plans or
    another trial infers; then the spec's path from stdin (None at end of input: the trial went elsewhere). A line
    `SPEC<TAB>LOG` also moves this process's stderr to the file LOG (appended to)."""
    import torch  # noqa: F401

    import tasks.evaluation.decode  # noqa: F401
    import tasks.evaluation.engine  # noqa: F401

    path, _, log = sys.stdin.readline().strip().partition("\t")
    if log:
        sys.stderr.flush()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    return path or None


def _metric_job(job: dict, ctx: EvalContext) -> dict:
    """One job of a metric process: score a chunk (`{"metric_s"}`), load a dataset (`probe`: `{"examples"}`, its
    length) or aggregate its scores (`aggregate`: `{"aggregate"}`). Loading and aggregating a plugin's dataset are
    done here, not in the evaluator, so a plugin whose factory or `aggregate` ends its own process group fails alone."""
    if "probe" in job:
        try:
            return {"examples": len(dataset_for(job["probe"], ctx))}
        except DatasetError:
            raise
        except Exception as err:  # noqa: BLE001 - named as the evaluator names a dataset it cannot load
            raise DatasetError(f"{job['probe']['source']}: {type(err).__name__}: {err}") from err
    if "aggregate" in job:
        d = job["aggregate"]
        files = sorted((Path(job["out"]) / "scores" / d["dataset"]).glob("*.json"))
        per = [s for f in files for s in json.loads(f.read_text())["scores"]]
        return {"aggregate": dataset_for(d, ctx).aggregate(per), "examples": len(per)}
    return {"metric_s": score_chunk(job["chunk"], ctx, Path(job["out"]))}


def metric_worker() -> int:
    """`--metrics`: a `{"ready"}` line once imported, then metric jobs, one per line of stdin (`{"chunk"|"probe"|
    "aggregate", "ctx", "out"}`), each answered with one line (`{"metric_s"}`, `{"examples"}`, `{"aggregate"}` or
    `{"error"}`) on the stdout this process had at its start; a plugin's own prints go to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answers.write('{"ready": true}\n')  # imports done: the deadline of each job counts from here on
    answers.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            reply = _metric_job(job, EvalContext(**job["ctx"]))
        except Exception as err:  # noqa: BLE001 - the runner fails that chunk's dataset with it
            reply = {"error": err.args[0] if isinstance(err, DatasetError) and err.args else
                     f"{type(err).__name__}: {err}"}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    from tasks.procs import die_with_parent

    die_with_parent()  # in a session of its own: the evaluator's Ctrl-C or SIGKILL must still end it
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == ["--metrics"]:
        return metric_worker()
    if args[:1] == ["--warm"]:
        path = _warm()
        if path is None:
            return 0
        args = [path]
    spec = json.loads(Path(args[0]).read_text())
    try:
        if spec.get("precursor"):
            precursor(spec)
        else:
            run_trial(spec)
    except Exception as err:  # noqa: BLE001 - reported to the runner, which fails the evaluation with it
        traceback.print_exc()  # into the log the runner's error names (red team 41p S3: it was empty)
        print(json.dumps({"event": "error", "error": f"{type(err).__name__}: {err}"}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    from tasks.quickexit import exit_now

    exit_now(main())
