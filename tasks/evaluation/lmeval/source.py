"""lm-evaluation-harness tasks as a suite source.

A suite's `lmeval` section (`LmevalSource`) names tasks, groups or tags the way `lm_eval --tasks` does, from the
YAML directories in `include`. `expand` loads them with lm-eval's own `TaskManager` (only the included directories
are indexed unless `defaults: true`), checks that each can run here, builds every request with lm-eval's templates
and few-shot sampler (seeded as `lm_eval` seeds it) once, writes them to a content-addressed file under
`$FRENZY_CACHE/lmeval/`, and adds one suite dataset per task. Trials read that file (they never import lm_eval);
metric jobs apply the task's filters and `process_results`; `aggregate` uses lm-eval's aggregation, standard errors
and group aggregation, so the numbers are the ones `lm_eval` prints.

Refused, each with a message naming the task and the fix: data that is not local (a Hub `dataset_path`, remote
`data_files`), tasks marked `unsafe_code` (their tests would run outside Frenzy's sandbox), multimodal tasks,
sampling or beam-search generation kwargs. Nothing is ever downloaded: HF_DATASETS_OFFLINE and HF_HUB_OFFLINE
are set before the datasets library loads.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tasks.errors import FrenzyError
from tasks.evaluation.lmeval.requests import RequestError, gen_settings
from tasks.evaluation.suite import LmevalSource, Suite, SuiteDataset
from tasks.training.data import cache_dir

#: the dataset factory of an expanded lm-eval task (`resolve` reads `module:factory`)
FACTORY = "tasks.evaluation.lmeval.dataset:make"
#: `dataset_path` values that read local files given in `data_files`
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow"}
_LOCK = threading.RLock()


class LmevalTaskError(FrenzyError):
    """An lm-eval task that cannot run through Frenzy; the message names the task and the fix."""


def require_lm_eval() -> None:
    """Set the offline switches (before `datasets` is imported), check that lm_eval is installed, and have its
    templates compiled once each (`compile_templates_once`)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise LmevalTaskError("lm-eval tasks need the lm_eval package: pip install -e '.[lmeval]' "
                              "(lm_eval==0.4.13)") from None
    compile_templates_once()


def compile_templates_once() -> None:
    """lm-eval renders a task's Jinja fields (doc_to_text, doc_to_target, doc_to_choice, ...) through
    `lm_eval.utils.apply_template`, which compiles the template source again for every document and field
    (`env.from_string`): most of the time of building a task's requests, and of its metric jobs. Here its
    environment keeps each compiled template by its source, so a source is compiled once per process. A compiled
    template renders exactly what a fresh compile of the same source renders (and may be rendered from several
    threads), so the requests and scores are unchanged."""
    from lm_eval import utils

    env = utils.env
    with _LOCK:
        if getattr(env, "_frenzy_compiled_once", False):
            return
        compile_source = env.from_string
        cached = lru_cache(maxsize=4096)(compile_source)

        def from_string(source: Any, globals: Any = None, template_class: Any = None) -> Any:  # noqa: A002
            if globals is None and template_class is None and isinstance(source, str):
                return cached(source)
            return compile_source(source, globals, template_class)

        env.from_string = from_string
        env._frenzy_compiled_once = True


def _local_files(spec: Any) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, dict):
        return [f for v in spec.values() for f in _local_files(v)]
    if isinstance(spec, list | tuple):
        return [f for v in spec for f in _local_files(v)]
    return []


def check_local(path: str | None, data_files: Any) -> None:
    """Refuse a `datasets.load_dataset` call that would read anything but local files."""
    if path in LOCAL_BUILDERS:
        files = _local_files(data_files)
        if not files:
            raise LmevalTaskError(f"dataset_path: {path} needs data_files (dataset_kwargs: {{data_files: {{test: "
                                  "path/to/test.jsonl}}}) naming local files")
        for f in files:
            if "://" in f:
                raise LmevalTaskError(f"data_files names {f}, which is not a local file; Frenzy never downloads: "
                                      "copy it to disk and name the path")
            if not glob.glob(os.path.expanduser(f)):
                raise LmevalTaskError(f"data_files names {f}, which does not exist (relative paths are from the "
                                      f"directory the evaluation runs in, {Path.cwd()}): give an absolute path")
        return
    if path and "://" not in path and Path(path).expanduser().is_dir():
        return
    raise LmevalTaskError(f"dataset_path {path!r} is not local data (a Hugging Face Hub dataset would be "
                          "downloaded, which Frenzy never does): save its splits as JSONL/CSV/parquet and set "
                          "dataset_path: json (or csv, parquet) with dataset_kwargs: {data_files: {test: FILE}}, or "
                          "dataset_path: a local directory")


@contextmanager
def local_data_only() -> Iterator[None]:
    """While lm-eval loads tasks, `datasets.load_dataset` reads local files only."""
    import datasets

    original = datasets.load_dataset

    def guarded(path: str | None = None, name: str | None = None, data_files: Any = None, **kw: Any) -> Any:
        check_local(path, data_files)
        return original(path=path, name=name, data_files=data_files, **kw)

    with _LOCK:
        datasets.load_dataset = guarded
        try:
            yield
        finally:
            datasets.load_dataset = original


@dataclass
class Loaded:
    """lm-eval's view of a suite's tasks: leaf tasks, groups, and each task's evaluation documents."""

    tasks: dict[str, Any]
    groups: dict[str, Any]
    docs: dict[str, list] = field(default_factory=dict)

    def documents(self, name: str) -> list:
        if name not in self.docs:
            self.docs[name] = list(self.tasks[name].eval_docs)
        return self.docs[name]


def load(src: LmevalSource) -> Loaded:
    """The tasks of `src`, loaded once per process while the files under its include paths stay as they are (metric
    jobs and aggregation reuse them; a long-lived worker sees edited task files)."""
    return _load(src.model_dump_json(), _fingerprint(src))


def _fingerprint(src: LmevalSource) -> tuple:
    files = []
    for p in [*src.include, *(t for t in src.tasks if t.endswith((".yaml", ".yml")))]:
        q = Path(p)
        for f in sorted(q.rglob("*")) if q.is_dir() else [q] if q.is_file() else []:
            if f.is_file():
                st = f.stat()
                files.append((str(f), st.st_size, st.st_mtime_ns))
    return tuple(files)


@lru_cache(maxsize=8)
def _load(src_json: str, fingerprint: tuple) -> Loaded:
    src = LmevalSource.model_validate_json(src_json)
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    with _LOCK:
        for p in src.include:
            if not Path(p).exists():
                raise LmevalTaskError(f"lmeval.include names {p}, which does not exist")
        tm = TaskManager(include_path=list(src.include) or None, include_defaults=src.defaults)
        with local_data_only():
            try:
                loaded = tm.load(_names(tm, src))
            except ValueError as err:  # a task named twice (alone and in a group, or in two groups)
                raise LmevalTaskError(f"lmeval.tasks: {err}; name each task once") from None
    for name, task in loaded["tasks"].items():
        _check_task(name, task)
        _configure(task, src)
    return Loaded(dict(loaded["tasks"]), dict(loaded["groups"]))


def _names(tm: Any, src: LmevalSource) -> list[str]:
    """`src.tasks` as lm-eval loads them: YAML files as they are, glob patterns matched, unknown names refused."""
    out = []
    for name in src.tasks:
        if name.endswith((".yaml", ".yml")):
            if not Path(name).is_file():
                raise LmevalTaskError(f"lmeval.tasks names {name}, which is not a file")
            out.append(name)
            continue
        found = tm.match_tasks([name]) if any(c in name for c in "*?[") else [name] if name in tm.all_tasks else []
        if not found:
            known = ", ".join(tm.all_tasks[:30]) + (" ..." if len(tm.all_tasks) > 30 else "")
            raise LmevalTaskError(f"lm-eval task {name!r} is not in {', '.join(src.include) or 'no include path'}"
                                  f"{' or lm-eval' if src.defaults else ''} (known: {known or 'none'}); add its "
                                  "directory to lmeval.include, or set lmeval.defaults: true for lm-eval's own tasks")
        out += [f for f in found if f not in out]
    return out


def _check_task(name: str, task: Any) -> None:
    cfg = task.config
    if getattr(task, "UNSAFE_CODE", False):
        raise LmevalTaskError(f"lm-eval task {name} is marked unsafe_code: its metric runs generated code outside "
                              "Frenzy's sandbox; evaluate code with Frenzy's exec datasets (humaneval, a JSONL exec "
                              "dataset), which run it sandboxed")
    if getattr(task, "MULTIMODAL", False):
        raise LmevalTaskError(f"lm-eval task {name} is multimodal (doc_to_image/doc_to_audio); Frenzy evaluates "
                              "text models only")
    if task.OUTPUT_TYPE not in ("loglikelihood", "loglikelihood_rolling", "multiple_choice", "generate_until"):
        raise LmevalTaskError(f"lm-eval task {name} has output_type {task.OUTPUT_TYPE}, which Frenzy does not run")
    if task.OUTPUT_TYPE == "generate_until":
        try:
            gen_settings(dict(cfg.generation_kwargs or {}), None)
        except RequestError as err:
            raise LmevalTaskError(f"lm-eval task {name}: {err}") from None


def _configure(task: Any, src: LmevalSource) -> None:
    """num_fewshot and the few-shot seed as `lm_eval.simple_evaluate` sets them."""
    if src.num_fewshot is not None:
        if task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=src.num_fewshot)
    elif task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=src.fewshot_seed)


def build_requests(task: Any, src: LmevalSource) -> list[dict]:
    """Every document's requests, as lm-eval's evaluator builds them: [{"id": doc_id, "requests": [[type, args,
    idx, repeats], ...]}] in document order."""
    from lm_eval.evaluator_utils import get_sample_size

    task.set_fewshot_seed(seed=src.fewshot_seed)  # the sampler's state depends on every earlier draw
    task.build_all_requests(limit=get_sample_size(task, src.limit), rank=0, world_size=1)
    rows: dict[int, list] = {}
    for inst in task.instances:
        if inst.request_type == "loglikelihood" and len(inst.args) > 1 and inst.args[1] == "":
            raise LmevalTaskError(
                f"lm-eval task {task.config.task}: document {inst.doc_id} has an empty continuation (its doc_to_target "
                "or doc_to_choice gives ''), whose log-likelihood is undefined (lm-eval's HF backend stops on an "
                "assertion there); give every document a non-empty target and choices, or drop such documents "
                "with process_docs")
        rows.setdefault(inst.doc_id, []).append([inst.request_type, list(inst.args), inst.idx, inst.repeats])
    return [{"id": d, "requests": sorted(r, key=lambda x: x[2])} for d, r in rows.items()]


def write_requests(rows: list[dict], task: str) -> Path:
    """The requests as JSONL under $FRENZY_CACHE/lmeval/, named by their content's sha256 (written once)."""
    try:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    except TypeError as err:
        raise LmevalTaskError(f"lm-eval task {task}: a request is not plain text ({err})") from None
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    dest = cache_dir() / "lmeval" / f"{task}-{digest}.jsonl"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, dest)
    return dest


def _entry(name: str, task: Any, rows: list[dict], path: Path, src: LmevalSource) -> SuiteDataset:
    """The suite dataset of one task, with prior costs from its request counts (learned priors replace them)."""
    kind = task.OUTPUT_TYPE
    per_doc = sum(len(r["requests"]) for r in rows) / max(len(rows), 1)
    if kind == "generate_until":
        infer = 0.002 * gen_settings(dict(task.config.generation_kwargs or {}), None).max_gen_toks
    else:
        infer = (0.05 if kind == "loglikelihood_rolling" else 0.003) * per_doc
    return SuiteDataset(name=name, examples=len(rows), mode="gen" if kind == "generate_until" else "ppl",
                        infer_s_per_example=infer, metric_s_per_example=0.001, dataset=FACTORY,
                        options={"task": name, "requests": str(path), "source": src.model_dump(mode="json")})


def expand(suite: Suite) -> Suite:
    """`suite` with one dataset per task of its `lmeval` section (the suite itself when it has none, or when it is
    expanded already)."""
    if suite.lmeval is None or any(d.dataset == FACTORY for d in suite.datasets):
        return suite
    loaded = load(suite.lmeval)
    own = {d.name for d in suite.datasets}
    entries = []
    for name, task in loaded.tasks.items():
        if name in own or name in loaded.groups:
            raise LmevalTaskError(f"suite {suite.name}: lm-eval task {name} has the name of another dataset or group "
                                  "of the suite; rename one")
        rows = build_requests(task, suite.lmeval)
        entries.append(_entry(name, task, rows, write_requests(rows, name), suite.lmeval))
    return suite.model_copy(update={"datasets": [*suite.datasets, *entries]})


def bootstrap_without_fork() -> None:
    """lm-eval bootstraps standard errors (perplexity, median, f1, bleu, ...) on a `multiprocessing.Pool` of the
    default start method, fork on Linux. Forked from Frenzy's metric thread while other threads of the process hold
    locks, a worker can start deadlocked, and the pool's exit then waits for it for ever (it hung the lm-eval suite
    test twice in CI). Replaced, in this process, by the same chunks, seeds and order on a forkserver pool, whose
    workers fork from a clean single-threaded server: the same numbers. DISABLE_MULTIPROC keeps lm-eval's serial
    path."""
    import multiprocessing as mp

    import lm_eval.api.metrics as m

    if getattr(m.bootstrap_stderr, "frenzy", False):
        return

    def bootstrap_stderr(f: Any, xs: Any, iters: int) -> float:
        if os.getenv("DISABLE_MULTIPROC"):
            return m.sample_stddev(m._bootstrap_internal_no_mp(f, xs, iters))
        chunk = min(1000, iters)
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["lm_eval.api.metrics"])
        res: list[float] = []
        with ctx.Pool(mp.cpu_count()) as pool:
            for part in pool.imap(m._bootstrap_internal(f, chunk), [(i, xs) for i in range(iters // chunk)]):
                res.extend(part)
        return m.sample_stddev(res)

    bootstrap_stderr.frenzy = True  # type: ignore[attr-defined]
    bootstrap_stderr.lm_evals = m.bootstrap_stderr  # type: ignore[attr-defined]
    m.bootstrap_stderr = bootstrap_stderr


def task_metrics(src: LmevalSource, name: str, scores: list[dict]) -> dict[str, Any]:
    """One task's metrics from its per-document scores, by lm-eval's aggregation (standard errors bootstrapped
    where lm-eval bootstraps them), with the sample count its group aggregation weighs by; "N/A" left out."""
    from collections import defaultdict

    from lm_eval.evaluator_utils import _compute_task_aggregations

    raw: dict[tuple[str, str], list] = defaultdict(list)
    for sc in scores:
        for key, value in sc.items():
            metric, _, filt = key.rpartition(",")
            raw[(metric, filt)].append(tuple(value) if isinstance(value, list) else value)
    bootstrap_without_fork()
    with _LOCK:
        agg, n = _compute_task_aggregations(load(src).tasks[name], raw, src.bootstrap_iters)
    return {"sample_len": n, **{k: float(v) for k, v in agg.items() if isinstance(v, int | float)}}


def finish(src: LmevalSource, per_task: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Task metrics (`task_metrics`) plus every group of the suite whose tasks are all there, by lm-eval's group
    aggregation; metric keys as lm-eval prints them (`acc,none`, `acc_stderr,none`)."""
    from lm_eval.evaluator_utils import EvalAcc, aggregate_groups

    loaded = load(src)
    acc = EvalAcc(groups={k: g for k, g in loaded.groups.items()
                          if all(t.task_name in per_task for t in g.get_all_tasks())})
    acc.metrics = {name: {"name": name, "alias": name, **m} for name, m in per_task.items()}
    res = aggregate_groups(acc)
    out = {name: {k: float(v) for k, v in m.items() if "," in k and isinstance(v, int | float)}
           for name, m in res.metrics.items()}
    return {k: v for k, v in out.items() if v}


def aggregate(src: LmevalSource, per_task: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Every task's and group's metrics from per-document scores (`task_metrics`, then `finish`)."""
    return finish(src, {name: task_metrics(src, name, scores) for name, scores in per_task.items()})
