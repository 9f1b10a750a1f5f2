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

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SuiteError(ValueError):
    """A suite that cannot be used; the message names the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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
    examples: int = Field(ge=1)
    """Examples to evaluate (the whole dataset, or the first N of it)."""
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
    if str(spec) in names:
        text = resources.files("tasks.evaluation").joinpath(f"suites/{spec}.yaml").read_text()
        source = f"suite {spec}"
    else:
        p = Path(spec).expanduser()
        if not p.is_file():
            raise SuiteError(f"{spec}: neither a built-in suite ({', '.join(names)}) nor a YAML file")
        text, source = p.read_text(), str(p)
    try:
        data = yaml.safe_load(text)
        if isinstance(data, dict) and "name" not in data:
            data["name"] = Path(str(spec)).stem
        suite = Suite.model_validate(data)
    except yaml.YAMLError as err:
        raise SuiteError(f"{source}: not YAML: {err}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise SuiteError(f"{source}: {where}: {first['msg']}") from None
    if suite.lmeval is not None and source != f"suite {spec}":
        suite.lmeval = anchored(suite.lmeval, Path(spec).expanduser().resolve().parent)
    return suite


def anchored(src: LmevalSource, base: Path) -> LmevalSource:
    """`src` with its include paths and task YAML paths made absolute from `base` (the suite file's directory)."""
    def fix(p: str) -> str:
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else (base / q).resolve())

    tasks = [fix(t) if t.endswith((".yaml", ".yml")) else t for t in src.tasks]
    return src.model_copy(update={"include": [fix(p) for p in src.include], "tasks": tasks})
