"""Simulator, traces and lower bounds."""

from pathlib import Path

import pytest

from cluster.inventory import Cluster, Node, load_cluster
from cluster.simulator import SimConfig, lower_bounds, simulate
from cluster.traces import TraceError, TraceJob, load_trace, new_workload, read_sia, write_generic

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"
SIA = TRACES / "sia-workloads" / "philly" / "workload-1.csv"
PHILLY = TRACES / "philly.csv"


def test_newworkload_is_deterministic_and_plannable():
    a, b = new_workload(30, seed=3), new_workload(30, seed=3)
    assert a == b and len(a) == 30 and all(j.submit_s == 0 for j in a)
    assert {j.model for j in a} <= {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "bert-base", "bert-large"}
    poisson = new_workload(10, seed=3, mean_interarrival_s=60)
    assert [j.submit_s for j in poisson] == sorted(j.submit_s for j in poisson) and poisson[-1].submit_s > 0


@pytest.mark.parametrize("policy", ["has", "fcfs", "fifo", "ilp"])
def test_every_policy_completes_the_queue_within_the_lower_bounds(policy):
    c = load_cluster("frenzy-testbed")
    jobs = new_workload(12, seed=1)
    res = simulate(c, jobs, policy)
    s = res.summary()
    assert s.completed + s.unschedulable == 12 and s.completed >= 9
    done = [j for j in res.jobs if j.finish is not None]
    lb = lower_bounds(c, [j.trace for j in done])  # a bound for any schedule of the jobs that completed
    assert s.makespan_s >= lb.makespan_s * 0.999
    assert s.avg_jct_s >= lb.avg_jct_s * 0.999
    assert s.decisions > 0 and s.decision_p99_ms >= s.decision_p50_ms >= 0
    # no GPU is ever used twice: replay the start/finish intervals per node
    cap = {n.name: n.count for n in c.nodes}
    events = sorted([(j.start, k) for j in done for k in j.nodes] + [(j.finish, (n, -k)) for j in done for n, k in j.nodes]
                    , key=lambda e: (e[0], e[1][1]))
    used = dict.fromkeys(cap, 0)
    for _, (n, k) in events:
        used[n] += k
        assert 0 <= used[n] <= cap[n]


def test_fcfs_ooms_are_counted_and_resubmitted_has_never_ooms():
    # one 11 GB GPU node first in compute order? no: the big model asks for 1 GPU and lands on the fastest node
    c = Cluster(name="t", nodes=[Node(name="small", gpu="RTX-2080Ti", count=4),
                                 Node(name="big", gpu="A100-80GB-PCIE", count=2)])
    jobs = [TraceJob("a", 0, 600, 1, "gpt2-124m", 64), TraceJob("b", 0, 600, 2, "gpt2-1.5b", 32),
            TraceJob("c", 10, 600, 4, "gpt2-774m", 64)]
    f = simulate(c, jobs, "fcfs").summary()
    h = simulate(c, jobs, "has").summary()
    assert f.oom_failures >= 1 and h.oom_failures == 0
    assert h.completed == 3


def test_strict_fifo_blocks_where_fcfs_backfills():
    c = Cluster(name="t", nodes=[Node(name="n", gpu="A100-80GB-PCIE", count=4)])
    jobs = [TraceJob("long", 0, 1000, 3, "gpt2-124m", 48), TraceJob("wide", 1, 100, 4, "gpt2-124m", 64),
            TraceJob("small", 2, 100, 1, "gpt2-124m", 16)]
    fifo = {j.trace.name: j.start for j in simulate(c, jobs, "fifo").jobs}
    fcfs = {j.trace.name: j.start for j in simulate(c, jobs, "fcfs").jobs}
    assert fcfs["small"] == 2 and fifo["small"] > fifo["wide"] >= 1000


def test_a_job_wider_than_the_cluster_is_unschedulable_and_blocks_no_one():
    """fcfs and fifo run the user's GPU count: a job asking for more GPUs than the cluster has can never start, so it
    counts as unschedulable (not as a finished job of JCT 0) and fifo does not hold the queue behind it."""
    from cluster.report import summary_rows

    c = Cluster(name="t", nodes=[Node(name="n", gpu="A100-80GB-PCIE", count=4)])
    jobs = [TraceJob("huge", 0, 3600, 100, "gpt2-124m", 1600), TraceJob("small", 10, 600, 1, "gpt2-124m", 16)]
    for pol in ("fcfs", "fifo"):
        res = simulate(c, jobs, pol)
        s = res.summary()
        assert (s.completed, s.unschedulable) == (1, 1), pol
        by = {j.trace.name: j for j in res.jobs}
        assert by["huge"].unschedulable == "asks for 100 GPUs; the cluster has 4" and by["huge"].finish is None
        assert by["small"].start == 10  # fifo does not block on a job that can never start
        assert summary_rows({pol: s})[0]["done"] == "1/2 (1 never fit)"
    assert simulate(c, jobs, "ilp").summary().unschedulable == 0  # the ILP sizes jobs itself: it runs on 4 GPUs
    none = simulate(c, jobs[:1], "fifo").summary()
    row = summary_rows({"fifo": none})[0]
    assert none.completed == 0 and row["avg JCT s"] == row["p99 JCT s"] == "-"  # not a perfect 0


def test_at_load_rescales_arrivals_to_the_offered_load():
    from cluster.traces import at_load, offered_load

    trace = new_workload(20, seed=3, mean_interarrival_s=300.0)
    for load in (0.5, 1.1):
        scaled = at_load(trace, 44, load)
        assert offered_load(scaled, 44) == pytest.approx(load)
        assert [j.name for j in scaled] == [j.name for j in trace] and scaled[0].submit_s == 0.0
        assert [j.duration_s for j in scaled] == [j.duration_s for j in trace]
    with pytest.raises(TraceError, match="drop --load"):
        at_load(new_workload(5, seed=0), 44, 0.5)  # every job at t=0: no gaps to rescale
    assert offered_load([], 44) == 0.0


def test_sia_reader_attaches_models_and_durations():
    jobs = read_sia(SIA)
    assert len(jobs) == 160 and jobs[0].model == "gpt2-124m" and jobs[0].num_gpus == 6
    assert all(j.duration_s > 0 and j.global_batch == 16 * j.num_gpus for j in jobs)


def test_philly_reader_window_and_generic_roundtrip(tmp_path):
    jobs = load_trace(PHILLY, max_jobs=50)
    assert len(jobs) == 50 and jobs[0].submit_s == 0 and all(j.duration_s >= 60 for j in jobs)
    path = tmp_path / "t.csv"
    write_generic(jobs, path)
    again = load_trace(path)
    assert sorted(again, key=lambda j: j.name) == sorted(jobs, key=lambda j: j.name)


def test_bad_traces_name_the_problem(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("submit_time,duration\n0,10\n")
    with pytest.raises(TraceError, match="missing columns"):
        load_trace(p, "generic")
    p.write_text("submit_time,duration,num_gpus,model\n0,10,1,gpt9\n")
    with pytest.raises(TraceError, match="unknown model preset"):
        load_trace(p)
    p.write_text("submit_time,duration,num_gpus\n0,10,1\n5,abc,1\n")
    with pytest.raises(TraceError, match=r"bad.csv:3: column duration must be a number, got 'abc'"):
        load_trace(p)
    p.write_text("submit_time,duration,num_gpus\n0,10,1.5\n")
    with pytest.raises(TraceError, match=r"column num_gpus must be a whole number, got '1.5'"):
        load_trace(p)


def test_shortest_queue_order_and_config_are_honoured():
    c = load_cluster("frenzy-testbed")
    jobs = new_workload(20, seed=2)
    a = simulate(c, jobs, "has", SimConfig(queue_order="shortest")).summary()
    b = simulate(c, jobs, "has", SimConfig(queue_order="backfill")).summary()
    assert a.completed == b.completed == 20 and a.avg_jct_s != b.avg_jct_s
    sjf = simulate(c, jobs, "has-sjf")  # the old name of the default policy
    assert sjf.policy == "has-sjf" and sjf.summary().avg_jct_s == a.avg_jct_s
    assert simulate(c, jobs, "has").summary().avg_jct_s == a.avg_jct_s  # shortest-first is the default
    assert simulate(c, jobs, "has-arrival").summary().avg_jct_s == b.avg_jct_s


def test_an_oom_user_first_halves_the_micro_batch_then_asks_for_more_memory():
    # gpt2-1.5b with a 32-sequence micro-batch does not fit an 80 GB GPU; at micro-batch 4 it does
    c = Cluster(name="t", nodes=[Node(name="big", gpu="A100-80GB-PCIE", count=2)])
    jobs = [TraceJob("b", 0, 600, 1, "gpt2-1.5b", 32)]
    res = simulate(c, jobs, "fcfs")
    j = res.jobs[0]
    assert j.finish is not None and j.ooms >= 1 and j.user_mb is not None and j.user_mb < 32
    assert j.layout.endswith(f"mb={j.user_mb}") and j.num_gpus == 1  # fixed by accumulation, not by more GPUs
    old = simulate(c, jobs, "fcfs", SimConfig(user_lowers_micro_batch=False)).jobs[0]
    assert old.user_mb is None and (old.finish is None or old.num_gpus > 1)


def test_baseline_shortest_order_is_an_oracle_on_trace_durations():
    c = Cluster(name="t", nodes=[Node(name="n", gpu="A100-80GB-PCIE", count=1)])
    jobs = [TraceJob("long", 0, 1000, 1, "gpt2-124m", 16), TraceJob("short", 0, 10, 1, "gpt2-124m", 16),
            TraceJob("mid", 0, 100, 1, "gpt2-124m", 16)]
    arrival = {j.trace.name: j.start for j in simulate(c, jobs, "fcfs").jobs}
    sjf = {j.trace.name: j.start for j in simulate(c, jobs, "fcfs", SimConfig(baseline_order="shortest")).jobs}
    assert arrival["long"] == 0 < arrival["short"] < arrival["mid"]
    assert sjf["short"] == 0 < sjf["mid"] < sjf["long"]


def _split_or_wait(hold_s: float, arrive_s: float) -> dict[str, object]:
    """Two 8-GPU A100 nodes, 5 GPUs of each held for `hold_s`; a rigid 6-GPU job arrives at `arrive_s`: 3 + 3 free GPUs
    hold it now only across the two nodes, where its all-reduce crosses the inter-node link."""
    c = Cluster(name="t", nodes=[Node(name="n0", gpu="A100-40GB-SXM", count=8, interconnect="nvlink"),
                                 Node(name="n1", gpu="A100-40GB-SXM", count=8, interconnect="nvlink")])
    kw = {"gpu_type": "A100-40GB-SXM", "elastic": False, "traced": True}
    jobs = [TraceJob("a", 0, hold_s, 5, "gpt2-774m", 40, **kw), TraceJob("b", 0, hold_s, 5, "gpt2-774m", 40, **kw),
            TraceJob("c", arrive_s, 20000, 6, "gpt2-774m", 48, **kw)]
    return {pol: next(j for j in simulate(c, jobs, pol).jobs if j.trace.name == "c") for pol in ("has", "fcfs")}


def test_has_weighs_a_gang_spread_over_nodes_against_waiting_for_one_node():
    """A rigid job that one node can hold runs slower spread over nodes; `has` predicts that run (the decision record
    says it) and waits for a node where the wait is shorter than the slowdown, else runs spread at once."""
    short = _split_or_wait(600, 1)
    assert len(short["fcfs"].nodes) == 2 and short["fcfs"].run_s > 2 * 20000  # fcfs spreads it: 2.3x slower
    assert short["has"].nodes == [("n0", 6)] and short["has"].start == 600 and short["has"].run_s == pytest.approx(20000)
    long = _split_or_wait(300_000, 5000)  # a node frees only after 300,000 s: spread now is sooner
    h = long["has"]
    assert h.start == 5000 and len(h.nodes) == 2 and h.run_s == pytest.approx(long["fcfs"].run_s)
    assert f"predicted run {h.run_s:.0f} s" in h.decision  # the prediction is the spread run, not the one-node one
