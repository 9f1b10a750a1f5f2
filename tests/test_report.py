"""The run report says what happened, consistently (issue 30, points 5 and 11): every committed checkpoint counted
once, the measured throughput beside the plan's, no "worst op type" when nothing straggled, the sandbox flag not
plotted as a score, a flat score on a real scale, and no "alternatives" table holding one plan."""

from __future__ import annotations

from cluster.ledger import Allocation, NodeAllocation
from tasks.evaluation.record import EvalSummary
from tasks.planning.layout import Layout
from tasks.planning.plans import ResourcePlan
from tasks.report import RunReport, StragglerSummary, _score_rows, flat_limits, markdown, render_html
from tasks.training.checkpoint import CheckpointRecord


def _plan(tok_s: float, rank: int = 1) -> ResourcePlan:
    return ResourcePlan(rank=rank, gpu_type="cpu", gpus=1, min_gpu_memory_gib=1.0, acceptable_gpu_types=["cpu"],
                        layout=Layout(), predicted_device_gib=1.0, predicted_allocated_gib=1.0, est_step_time_s=0.1,
                        gpu_seconds_per_step=0.1, tokens_per_s=tok_s)


def _eval(step: int, pass1: float) -> EvalSummary:
    return EvalSummary(uri=f"file:///c/step_{step:08d}", run="j", step=step, suite="quick",
                       scores={"humaneval": {"pass@1": pass1, "isolated": 1.0}}, makespan_s=1.0,
                       predicted_makespan_s=1.0, result="r.json", history_plot=None)


def _report(tmp_path, **kw) -> RunReport:
    base = dict(job="j", model="gpt-tiny", cluster="local", plans=[_plan(113_000.0)], chosen=0,
                allocation=Allocation(id="a" * 16, job="j", plan_index=0, gpus=1, min_mem_gib=1.0,
                                      nodes=[NodeAllocation(node="n", gpu_type="cpu", gpu_indices=[0])],
                                      lease_expiry=0.0),
                final_step=200, resumed_from_step=100, tokens_per_s=48_000.0,
                # a resumed run: this attempt wrote two checkpoints, the root holds four
                checkpoints=[CheckpointRecord(step=s, uri=f"u{s}", blocked_s=0, persist_s=0, bytes=1) for s in (150, 200)],
                committed_steps=[50, 100, 150, 200], progress=str(tmp_path / "none.jsonl"),
                evaluations=[_eval(s, 0.0) for s in (50, 100, 150, 200)], timings_s={"train": 1.0},
                stragglers=StragglerSummary(slowdown=1.0, waste=0.0, worst_optype="forward-compute", worst_stage="0",
                                            worst_dp_rank="0", heatmap=None))
    return RunReport(**{**base, **kw})


def test_the_summary_counts_every_committed_checkpoint_the_table_shows(tmp_path):
    md = markdown(_report(tmp_path))
    assert "4 checkpoints committed (steps 50, 100, 150, 200)" in md
    assert [k for k in _score_rows(_report(tmp_path))[0] if k.startswith("step")] == \
        ["step 50", "step 100", "step 150", "step 200"]


def test_measured_throughput_is_compared_with_the_plan(tmp_path):
    assert "48,000 tokens/s measured (plan predicted 113,000: measured is 42% of it)" in markdown(_report(tmp_path))


def test_no_worst_op_type_is_named_when_nothing_straggled(tmp_path):
    md = markdown(_report(tmp_path))
    assert "S = 1.000" in md and "no worker held the others up" in md and "worst op type" not in md
    slow = StragglerSummary(slowdown=1.3, waste=0.23, worst_optype="dp-comm", worst_stage="1", worst_dp_rank="3",
                            heatmap=None)
    assert "worst op type dp-comm, stage 1, DP rank 3" in markdown(_report(tmp_path, stragglers=slow))


def test_the_sandbox_flag_is_stated_not_scored(tmp_path):
    r = _report(tmp_path)
    assert [row["metric"] for row in _score_rows(r)] == ["humaneval pass@1"]
    assert "Evaluated with: humaneval isolated = 1." in markdown(r)
    page = render_html(r, tmp_path / "r.html").read_text()
    assert "humaneval isolated = 1" in page and "Slowdown S = 1.000" in page


def test_one_plan_is_not_called_alternatives(tmp_path):
    assert "the only one that fits" in markdown(_report(tmp_path))
    two = markdown(_report(tmp_path, plans=[_plan(113_000.0), _plan(90_000.0, rank=2)]))
    assert "chosen beside the alternatives" in two


def test_a_flat_score_is_drawn_on_a_real_scale():
    assert flat_limits([0.0, 0.0, 0.0]) == (-0.05, 1.05)
    assert flat_limits([0.0, 0.25]) is None
