"""Elastic evaluation scheduling: analytic timelines, coverage of every example, the lower bound, the suites."""

import random

import pytest

from tasks.evaluation.schedule import (
    GRANULARITIES,
    ORDERS,
    SPLIT_TOLERANCE,
    Schedule,
    elastic_trials,
    fewest_trials_near_best,
    lower_bound,
    plan,
    plan_elastic,
    plan_elastic_or_direct,
    plan_naive,
    plan_partitioned,
    simulate,
)
from tasks.evaluation.suite import Suite, SuiteError, load_suite


def suite(datasets, remote=10.0, shm=1.0, streams=1.0, cpus=4) -> Suite:
    return Suite.model_validate({"name": "t", "cpu_workers_per_node": cpus,
                                 "model_load_s": {"remote": remote, "shm": shm, "remote_streams_per_node": streams},
                                 "datasets": datasets})


def ds(name, n, infer, metric=0.0, mode="gen"):
    return {"name": name, "examples": n, "mode": mode, "infer_s_per_example": infer, "metric_s_per_example": metric}


def test_naive_one_gpu_is_the_sum_of_loads_inference_and_metrics():
    s = suite([ds("a", 10, 1.0, 0.5), ds("b", 20, 0.5, 0.0)])
    sch = plan_naive(s, 1, 1)
    assert sch.makespan_s == pytest.approx(2 * 10 + 10 + 5 + 10)
    assert [t.chunks[0].dataset for t in sch.trials] == ["a", "b"]


def test_remote_loads_on_one_node_share_its_nic():
    s = suite([ds(f"d{i}", 1, 1.0) for i in range(4)], remote=10.0, streams=1.0)
    sch = plan_naive(s, 1, 4)
    # four concurrent loads at a quarter speed each end together at 40 s, then 1 s of inference
    assert sch.makespan_s == pytest.approx(41.0)
    assert plan_naive(s, 4, 1).makespan_s == pytest.approx(11.0)  # one load per node: full speed


def test_elastic_preloads_once_per_node_and_overlaps_metrics():
    s = suite([ds("gen", 100, 0.1), ds("code", 10, 0.1, metric=2.0, mode="exec")], cpus=8)
    sch = plan_elastic(s, 1, 2)
    # precursor 10, shm 1, then 11 s of inference over two GPUs; metrics (20 s of CPU on 8 workers) overlap
    assert sch.makespan_s < plan_naive(s, 1, 2).makespan_s
    assert sch.makespan_s >= lower_bound(s, 1, 2) - 1e-9
    first = sch.trials[0]
    assert any(c.dataset == "code" for c in first.chunks), "the trial with long CPU metrics goes first"
    for t in sch.trials:
        assert t.load == "shm" and t.metrics_on == "cpu" and t.start_s >= 10.0


def test_barrier_delays_every_metric_until_inference_ends():
    s = suite([ds("a", 10, 1.0, 1.0), ds("b", 10, 1.0, 0.0)], cpus=1)
    p = plan_partitioned(s, 1, 2, max_task_s=100)
    ends = [c.metric_end_s for t in p.trials for c in t.chunks if c.metric_s > 0]
    last_infer = max(c.landed_s for t in p.trials for c in t.chunks)
    assert min(e - 10.0 for e in ends) >= last_infer - 1e-9


def test_every_example_is_in_exactly_one_chunk_and_the_bound_holds_on_random_suites():
    rng = random.Random(3)
    for trial in range(25):
        data = [ds(f"d{i}", rng.randint(1, 3000), rng.choice([0.01, 0.1, 1.0, 5.0]) * rng.uniform(0.5, 2),
                   rng.choice([0.0, 0.0, 0.01, 0.5]), rng.choice(["ppl", "gen", "exec"])) for i in range(rng.randint(1, 30))]
        s = suite(data, remote=rng.uniform(1, 100), shm=rng.uniform(0.1, 10), streams=rng.choice([1, 2, 8]),
                  cpus=rng.choice([1, 4, 16]))
        nodes, gpus = rng.choice([1, 2, 4]), rng.choice([1, 4, 8])
        p = plan(s, nodes, gpus)
        assert p.elastic_makespan_s >= p.lower_bound_s - 1e-6, (trial, p.elastic_makespan_s, p.lower_bound_s)
        for d in s.datasets:
            covered = sorted((c.start, c.stop) for t in p.trials for c in t.chunks if c.dataset == d.name)
            assert covered[0][0] == 0 and covered[-1][1] == d.examples
            assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))
        assert all(t.end_s is not None and t.end_s <= p.elastic_makespan_s + 1e-6 for t in p.trials)


def test_packing_merges_small_datasets_and_splits_large_ones():
    s = suite([ds("big", 1000, 1.0)] + [ds(f"s{i}", 10, 0.1) for i in range(20)])
    trials = elastic_trials(s, gpus=4, cpu_workers=4, granularity=2.0)
    big = [c for t in trials for c in t.chunks if c.dataset == "big"]
    assert len(big) >= 8  # 1000 s over 4 GPUs x 2
    assert len(trials) < len(big) + 20  # the 20 small sets share trials
    assert simulate(trials, s, 1, 4, precursor=True) > 0


def test_acme63_meets_the_papers_figures_within_ten_percent_of_the_bound():
    s = load_suite("acme63")
    assert len(s.datasets) == 63
    for nodes, target in ((1, 1.3), (4, 1.8)):
        p = plan(s, nodes, 8)
        assert p.speedup >= target
        assert p.gap_to_bound <= 0.10


def test_suite_errors_name_the_field_and_the_fix(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("name: x\ndatasets: [{name: a, examples: 3, mode: gen, infer_s_per_example: 1, colour: red}]\n")
    with pytest.raises(SuiteError, match="colour"):
        load_suite(bad)
    bad.write_text("name: x\ndatasets: [{name: a, examples: 3, mode: gen, infer_s_per_example: 1},"
                   " {name: a, examples: 3, mode: gen, infer_s_per_example: 1}]\n")
    with pytest.raises(SuiteError, match="twice"):
        load_suite(bad)
    with pytest.raises(SuiteError, match="core"):
        load_suite("no-such-suite")


def test_a_plan_with_more_trials_must_be_more_than_two_percent_faster():
    # 1 GPU, 1 CPU worker, a long metric (the core suite's learned priors on a 2-core CPU): the metric chain sets the
    # makespan, so 9 trials of under a second are predicted 0.6% faster than 1 and pay 8 more start-ups in the run
    s = suite([ds("code", 164, 0.016, metric=0.10, mode="exec"), ds("cloze", 96, 0.012), ds("line", 48, 0.01),
               ds("loss", 64, 0.002)], remote=3.0, shm=1.5, cpus=1)
    finest = min((simulate(elastic_trials(s, 1, 1, k, o), s, 1, 1, precursor=True), k, o)
                 for k in GRANULARITIES for o in ORDERS)
    sch = plan_elastic(s, 1, 1)
    assert len(sch.trials) == 1, [len(t.chunks) for t in sch.trials]
    assert sch.makespan_s <= finest[0] * (1 + SPLIT_TOLERANCE) + 1e-9
    code = [c for c in sch.trials[0].chunks if c.dataset == "code"]
    assert len(code) > 1 and sch.trials[0].chunks[0].dataset == "code", "chunks still land early for the metric pool"


def test_splitting_that_pays_is_kept():
    # 8 GPUs and one big dataset: one trial would leave 7 GPUs idle
    s = suite([ds("big", 800, 1.0)], remote=10.0, shm=1.0, cpus=4)
    sch = plan_elastic(s, 1, 8)
    assert len(sch.trials) >= 8
    assert sch.makespan_s < 0.2 * plan_naive(s, 1, 8).makespan_s


def test_fewest_trials_near_best_picks_by_tolerance_then_count():
    s = suite([ds("a", 100, 0.1)], cpus=1)
    one, many = elastic_trials(s, 1, 1, 1.0), elastic_trials(s, 4, 1, 4.0)
    assert len(one) < len(many)

    def sched(trials, span):
        return Schedule(kind="elastic", nodes=1, gpus_per_node=1, cpu_workers_per_node=1, trials=trials,
                        makespan_s=span, precursor_s=0.0, gpu_busy_s=0.0)

    assert fewest_trials_near_best([sched(many, 100.0), sched(one, 101.9)]).makespan_s == 101.9
    assert fewest_trials_near_best([sched(many, 100.0), sched(one, 102.1)]).makespan_s == 100.0
    assert fewest_trials_near_best([sched(one, 50.0), sched(one, 49.5)]).makespan_s == 49.5


def test_elastic_asked_runs_direct_where_a_model_copy_does_not_pay():
    # one short dataset: the elastic plan copies the model (10 s) and then loads it from shm (1 s); direct loads once
    one = suite([ds("a", 10, 0.1, metric=0.05)], remote=10.0, shm=1.0)
    ran = plan_elastic_or_direct(one, 1, 1)
    assert ran.kind == "direct" and ran.makespan_s < plan_elastic(one, 1, 1).makespan_s
    assert [(t.load, t.metrics_on) for t in ran.trials] == [("remote", "cpu")]
    assert ran.makespan_s == pytest.approx(plan_naive(one, 1, 1).makespan_s)  # one dataset: naive's time
    # many datasets on one slot: one copy amortised over them wins, the elastic plan runs
    many = suite([ds(f"d{i}", 10, 0.1) for i in range(8)], remote=10.0, shm=1.0)
    assert plan_elastic_or_direct(many, 1, 1).kind == "elastic"
