"""Replay one trace under several placement policies: the `Comparison` whose `to_json()` is the document `frenzy
simulate --json` prints and the `simulate` flow returns (both call `compare_policies`, so they cannot drift apart)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.inventory import load_cluster
from cluster.simulator import LowerBounds, SimConfig, SimResult, SimSummary, lower_bounds, simulate
from cluster.synth_traces import FAMILIES, parse_synthetic
from cluster.traces import TraceError, at_load, load_trace, new_workload, offered_load, parse_newworkload


@dataclass(frozen=True)
class Comparison:
    """One trace on one cluster under each policy: the summaries, the bounds, and the full results (for the plot and
    the per-job CSV; not part of the JSON document)."""

    cluster: str
    trace: str
    jobs: int
    offered_load: float
    """The offered load the trace ran at (after `load` rescaled it)."""
    offered_load_as_given: float
    policies: dict[str, SimSummary]
    lower_bounds: LowerBounds
    results: dict[str, SimResult] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The document of `frenzy simulate --json` and the `simulate` flow (keys in this order)."""
        return {"cluster": self.cluster, "trace": self.trace, "jobs": self.jobs, "offered_load": self.offered_load,
                "offered_load_as_given": self.offered_load_as_given,
                "policies": {p: s.to_json() for p, s in self.policies.items()},
                "lower_bounds": self.lower_bounds.to_json()}


def compare_policies(cluster_spec: str, trace_spec: str, policies: Sequence[str], cfg: SimConfig, *,
                     fmt: str | None = None, max_jobs: int | None = None, load: float | None = None,
                     progress: Callable[[str], None] | None = None) -> Comparison:
    """Simulate `trace_spec` (a CSV path, `newworkload:N[:SEED]`, `production:N[:SEED]` or
    `mixed:N[:SEED]`) on `cluster_spec` under each policy; with `load`, its arrivals rescaled to that offered load
    (`cluster.traces.at_load`, as benchmarks/placement_load.py does).
    Returns the summaries, the lower bounds and the full results."""
    cluster = load_cluster(cluster_spec)
    if trace_spec.split(":")[0] in FAMILIES:
        trace = parse_synthetic(trace_spec)
    elif trace_spec.startswith("newworkload:"):
        n, seed = parse_newworkload(trace_spec)
        trace = new_workload(n, seed=seed, reference_gpu=cfg.reference_gpu)
    else:
        extra = {"max_jobs": max_jobs} if fmt == "philly" and max_jobs else {}
        trace = load_trace(trace_spec, fmt, cfg.reference_gpu, **extra)  # type: ignore[arg-type]
    if not trace:
        raise TraceError(f"{trace_spec}: no jobs in the trace (a header and no rows?); add at least one job")
    gpus = sum(n.count for n in cluster.nodes)
    as_given = offered_load(trace, gpus)
    if load is not None:
        trace = at_load(trace, gpus, load)
    results: dict[str, SimResult] = {}
    for pol in policies:
        if progress:
            progress(f"simulating {pol} on {len(trace)} jobs ...")
        results[pol] = simulate(cluster, trace, pol, cfg)
    return Comparison(cluster=cluster.name, trace=trace_spec, jobs=len(trace), offered_load=offered_load(trace, gpus),
                      offered_load_as_given=as_given, policies={p: r.summary() for p, r in results.items()},
                      lower_bounds=lower_bounds(cluster, trace, cfg), results=results)
