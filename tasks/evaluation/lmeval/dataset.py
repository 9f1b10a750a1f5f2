"""One lm-eval task as a Frenzy evaluation dataset (made by `source.expand`; `make` is its factory).

An example is one document: its requests as lm-eval built them (read from the task's requests file; a trial never
imports lm_eval). `infer_batch` answers a chunk's requests together (`requests.Harness`: shared contexts run once,
generation batched and KV-cached); the prediction is the responses in request order. `score` (the CPU metric job)
gives the responses to the task's filters and `process_results` exactly as lm-eval's evaluator does, keyed
`metric,filter`; `aggregate` is lm-eval's aggregation (`source.aggregate`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tasks.evaluation.datasets import DatasetError, EvalContext, EvalDataset
from tasks.evaluation.engine import LM
from tasks.evaluation.lmeval.requests import Harness
from tasks.evaluation.suite import LmevalSource


@lru_cache(maxsize=16)
def _rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


class LmevalDataset(EvalDataset):
    """An lm-eval task's documents, requests, filters and metrics."""

    prior_metric_s_per_example = 0.001

    def __init__(self, options: dict | None = None, ctx: EvalContext | None = None) -> None:
        super().__init__(options, ctx)
        for key in ("task", "requests", "source"):
            if key not in self.options:
                raise DatasetError(f"an lm-eval dataset needs option {key!r}; name lm-eval tasks in the suite's "
                                   "`lmeval` section instead of writing the entry by hand")
        self.name = str(self.options["task"])
        self.source = LmevalSource.model_validate(self.options["source"])
        self.rows = self._read(Path(self.options["requests"]))
        types = {r[0] for row in self.rows[:1] for r in row["requests"]}
        self.mode = "gen" if "generate_until" in types else "ppl"
        self._harness: tuple[int, Harness] | None = None
        self._loaded: Any = None

    def _read(self, path: Path) -> list[dict]:
        if not path.is_file():  # another node's cache: build the same requests again (the file is content-addressed)
            from tasks.evaluation.lmeval.source import build_requests, load, write_requests

            path = write_requests(build_requests(load(self.source).tasks[self.name], self.source), self.name)
            if path.name != Path(self.options["requests"]).name:
                raise DatasetError(f"lm-eval task {self.name}: its requests rebuilt here differ from the planned "
                                   f"ones ({path.name} vs {Path(self.options['requests']).name}); the task files "
                                   "or data changed since planning, or differ between nodes")
        return _rows(str(path))

    def __len__(self) -> int:
        return len(self.rows)

    def example(self, i: int) -> dict:
        return self.rows[i]

    def harness(self, lm: LM) -> Harness:
        if self._harness is None or self._harness[0] != id(lm):
            self._harness = (id(lm), Harness(lm, batch_tokens=self.source.batch_tokens, gen_batch=self.source.gen_batch))
        return self._harness[1]

    def infer(self, lm: LM, ex: dict) -> dict:
        return self.infer_batch(lm, [ex])[0]

    def infer_batch(self, lm: LM, examples: list[dict]) -> list[dict]:
        """Every request of the chunk, grouped by type so that each type is one batched call."""
        h = self.harness(lm)
        flat = [(k, j, r) for k, ex in enumerate(examples) for j, r in enumerate(ex["requests"])]
        resps: list[list[Any]] = [[None] * len(ex["requests"]) for ex in examples]
        for kind in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
            mine = [(k, j, r[1]) for k, j, r in flat if r[0] == kind]
            if not mine:
                continue
            if kind == "loglikelihood":
                out: list[Any] = [list(x) for x in h.loglikelihood([(a[0], a[1]) for _, _, a in mine])]
            elif kind == "loglikelihood_rolling":
                out = h.loglikelihood_rolling([a[0] for _, _, a in mine])
            else:
                out = h.generate_until([(a[0], dict(a[1])) for _, _, a in mine])
            for (k, j, _), o in zip(mine, out, strict=True):
                resps[k][j] = o
        return [{"resps": r} for r in resps]

    def score(self, ex: dict, prediction: dict) -> dict[str, Any]:
        """The task's filters and `process_results` on one document's responses, for every filter."""
        from lm_eval.api.instance import Instance

        from tasks.evaluation.lmeval.source import load

        if self._loaded is None:  # once per dataset object (a metric job's chunk), not per document
            self._loaded = load(self.source)
        loaded = self._loaded
        task = loaded.tasks[self.name]
        doc = loaded.documents(self.name)[ex["id"]]
        insts = []
        for (kind, args, idx, repeats), resp in zip(ex["requests"], prediction["resps"], strict=True):
            inst = Instance(request_type=kind, doc=doc, arguments=tuple(args), idx=idx,
                            metadata=(self.name, ex["id"], repeats))
            inst.resps = [tuple(resp) if isinstance(resp, list) else resp] * int(repeats or 1)
            insts.append(inst)
        for ensemble in getattr(task, "_filters", []):
            ensemble.apply(insts)
        out: dict[str, Any] = {}
        for key in insts[0].filtered_resps:
            for metric, value in task.process_results(doc, [i.filtered_resps[key] for i in insts]).items():
                out[f"{metric},{key}"] = plain(value)
        return out

    def aggregate(self, scores: list[dict]) -> dict[str, float]:
        from tasks.evaluation.lmeval.source import aggregate

        return aggregate(self.source, {self.name: scores})[self.name]


def plain(value: Any) -> Any:
    """A metric's per-document value as JSON holds it (metric jobs write their scores as JSON): numpy arrays and
    scalars (e.g. `brier_score`'s class probabilities) become lists and Python numbers, tuples lists; float64
    survives the round trip exactly, and lm-eval's aggregations take the lists as they take the arrays."""
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def make(options: dict, ctx: EvalContext) -> LmevalDataset:
    """The factory suites name (`dataset: tasks.evaluation.lmeval.dataset:make`)."""
    return LmevalDataset(options, ctx)
