"""Evaluation suites: which datasets to run on a checkpoint, with the prior cost of each (the suite YAML contract).

A suite names its datasets with their size, mode and prior seconds per example for inference (on one GPU) and
for metrics (on one CPU worker), and the model load time from remote storage and from node shared memory.
The built-in suites live in `tasks/evaluation/suites/*.yaml`; `load_suite(name_or_path)` reads either.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.errors import FrenzyError


class SuiteError(FrenzyError, ValueError):
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
        return Suite.model_validate(data)
    except yaml.YAMLError as err:
        raise SuiteError(f"{source}: not YAML: {err}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise SuiteError(f"{source}: {where}: {first['msg']}") from None
