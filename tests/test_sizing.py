"""Work conservation and load-adaptive sizing (cluster/sizing.py), in the simulator and the live ledger."""

import csv
import json
import math
import random

import pytest

from cluster.has import FreePool, GpuRequest, NodeInfo
from cluster.inventory import Cluster, Node, load_cluster
from cluster.ledger import Ledger
from cluster.queue import Running, reserve
from cluster.simulator import SimConfig, simulate
from cluster.sizing import Backlog, choose, goodput_penalty, idle_violations
from cluster.synth_traces import mixed, parse_synthetic, production
from cluster.traces import BATCH_PER_GPU, TraceError, TraceJob, model_for_gpu_hours

FAST, SLOW = frozenset({"A100-40GB-SXM"}), frozenset({"RTX-2080Ti"})


def _pool(free_fast: int, free_slow: int) -> FreePool:
    nodes = [NodeInfo("a0", "A100-40GB-SXM", 40, 300, 8), NodeInfo("t0", "RTX-2080Ti", 11, 16, 8)]
    return FreePool(nodes, {"a0": free_fast, "t0": free_slow})


def _reqs(run_fast: float = 1000.0, slowdown: float = 5.0) -> list[GpuRequest]:
    return [GpuRequest(1, 8, 1, FAST, run_s=run_fast), GpuRequest(2, 8, 1, FAST, run_s=run_fast * 0.75),
            GpuRequest(1, 8, 1, SLOW, run_s=run_fast * slowdown)]


@pytest.mark.parametrize("wait_s, starts_now", [(500.0, False), (10_000.0, True)])
def test_a_slower_plan_beats_waiting_only_when_the_wait_is_longer_than_the_slowdown(wait_s, starts_now):
    pool = _pool(0, 8)  # every A100 busy until `wait_s`; the 2080Tis are idle; the 2080Ti plan runs 4000 s longer
    backlog = Backlog(pool, [Running(end_s=wait_s, nodes=(("a0", 8),))], now_s=0.0)
    ch = choose(pool, _reqs(), backlog, spare=0, behind=10)
    first = ch.candidates[0]
    assert (first.nodes is not None) == starts_now
    assert first.request.types == (SLOW if starts_now else FAST)
    assert first.finish_s == pytest.approx(5000.0 if starts_now else wait_s + 1000.0)
    record = ch.record(first if starts_now else None, 0.0)
    assert ("runs now rather than wait" in record) == starts_now and ("waits for" in record) != starts_now


def _a100s_held(allocations: int, end_s: float) -> tuple[FreePool, Backlog]:
    """16 A100s on one node, all held until `end_s` by `allocations` allocations; 4 of 8 2080Tis busy until 50,000 s."""
    nodes = [NodeInfo("a0", "A100-40GB-SXM", 40, 300, 16), NodeInfo("t0", "RTX-2080Ti", 11, 16, 8)]
    pool = FreePool(nodes, {"a0": 0, "t0": 4})
    per = [16 // allocations + (k < 16 % allocations) for k in range(allocations)]
    running = [Running(end_s=end_s, nodes=(("a0", n),)) for n in per] + [Running(end_s=50_000.0, nodes=(("t0", 4),))]
    return pool, Backlog(pool, running, now_s=0.0)


@pytest.mark.parametrize("wait_s, starts_now", [(3000.0, False), (4500.0, False), (6000.0, True)])
def test_a_job_never_waits_for_a_plan_that_starts_after_a_plan_it_can_start_now_would_finish(wait_s, starts_now):
    """Round 14: half the 2080Tis are busy and 10 jobs wait behind, so the 2080Ti plan (run 5000 s) costs the queue
    10 x 4000 extra GPU-s x 0.5 / 8 = 2500 s. An A100 freed at 6000 s (finish 7000 s) costs less (7000 against 7500),
    but the 2080Ti plan would be done before it starts: the job runs now. Negative controls: an A100 freed at 3000 s
    (finish 4000 s) wins outright; one freed at 4500 s (finish 5500 s, later for the job) still wins on cost, since
    the 2080Ti plan would hold its GPUs past 4500 s."""
    pool, backlog = _a100s_held(16, wait_s)  # the start rests on 16 releases: trusted (round 15)
    ch = choose(pool, _reqs(), backlog, spare=0, behind=10)
    first = ch.candidates[0]
    assert (first.nodes is not None) == starts_now
    assert first.request.types == (SLOW if starts_now else FAST)
    if starts_now:
        assert first.penalty == pytest.approx(2500.0) and first.finish_s == pytest.approx(5000.0)
        waited = next(c for c in ch.candidates if c.nodes is None)
        assert waited.cost < first.cost and waited.start_s == pytest.approx(6000.0)  # cheaper, but starts later
        assert "runs now rather than wait 6000 s for A100-40GB-SXM" in ch.record(first, 0.0)
    else:
        assert first.finish_s == pytest.approx(wait_s + 1000.0)


@pytest.mark.parametrize("allocations, starts_now", [(1, False), (9, False), (16, True)])
def test_a_job_runs_now_ahead_of_a_wait_only_where_the_predicted_start_rests_on_enough_releases(allocations,
                                                                                                 starts_now):
    """Round 15: 16 A100s on one node, all busy until 6000 s, held by 1, 9 or 16 allocations; half the 2080Tis are
    busy and 10 jobs wait behind, so the 2080Ti plan (run 5000 s, cost 7500 s) would be done before the A100 plan
    starts (cost 7000 s). The start at 6000 s rests on as many predicted releases as allocations: the 2080Ti plan
    runs now only with 16 (TRUSTED_RELEASES is 10); with 1 or 9 the job waits, as it did before round 14."""
    pool, backlog = _a100s_held(allocations, 6000.0)
    assert backlog.releases_by(_reqs()[0], 6000.0) == allocations
    ch = choose(pool, _reqs(), backlog, spare=0, behind=10)
    first = ch.candidates[0]
    assert (first.nodes is not None) == starts_now
    assert first.request.types == (SLOW if starts_now else FAST)
    assert first.finish_s == pytest.approx(5000.0 if starts_now else 7000.0)
    waited = next(c for c in ch.candidates if c.nodes is None)
    assert waited.start_s == pytest.approx(6000.0) and waited.cost < next(c for c in ch.candidates if c.nodes).cost


@pytest.mark.parametrize("claim_ahead, starts_slow", [(True, True), (False, False)])
def test_a_release_overdue_is_predicted_now_not_in_the_past(claim_ahead, starts_slow):
    """The A100s' allocation was predicted to end at 2000 s; it is 3000 s and it still runs. Its release is predicted
    now, never in the past: behind a job that waits 1000 s for all eight, the next one is predicted to start at 4000 s
    (finish 5000 s), so the 2080Tis (finish 4500 s) win; predicting the release at 2000 s had the claim done by now and
    the job waiting for a finish at 4000 s. Negative control: with no claim ahead the job still waits for the overdue
    release (predicted start now, finish 4000 s): the clamp does not drop waits for overdue GPUs."""
    now = 3000.0
    pool = _pool(0, 8)
    backlog = Backlog(pool, [Running(end_s=2000.0, nodes=(("a0", 8),))], now_s=now)
    assert backlog.start_s(GpuRequest(8, 8, 1, FAST, run_s=1000.0)) == now
    if claim_ahead:
        backlog.claim(GpuRequest(8, 8, 1, FAST, run_s=1000.0))
    assert backlog.start_s(GpuRequest(1, 8, 1, FAST, run_s=1000.0)) == now + (1000.0 if claim_ahead else 0.0)
    first = choose(pool, _reqs(run_fast=1000.0, slowdown=1.5), backlog, spare=0, behind=10).candidates[0]
    assert (first.nodes is not None) == starts_slow
    assert first.request.types == (SLOW if starts_slow else FAST)


def test_widening_only_into_spare_gpus_and_only_where_it_pays():
    pool = _pool(8, 0)
    backlog = Backlog(pool, [], now_s=0.0)
    busy = choose(pool, _reqs(), backlog, spare=0, behind=10)  # 10 jobs behind: the fewest GPU-seconds
    assert busy.mode == "pack" and busy.candidates[0].request.gpus == 1
    # one job behind, no spare GPUs: the second GPU is one a waiting job could use, so it is not a candidate
    short = choose(pool, _reqs(), backlog, spare=0, behind=1)
    assert short.mode == "pack" and short.candidates[0].request.gpus == 1
    idle = choose(pool, _reqs(), backlog, spare=8)  # nobody behind, no arrivals: the 2-GPU plan is faster
    assert idle.mode == "widen" and idle.candidates[0].request.gpus == 2
    # half the A100s busy: the 2-GPU plan saves 250 s and its 500 extra GPU-s cost each job that waits on the 8 A100s
    # while it runs 500 x 0.5 (busy) / 8 s; it pays while fewer than 250 / (750 x 31.25) = 0.0107 jobs arrive per
    # second (38 an hour)
    half = _pool(4, 0)
    hb = Backlog(half, [], now_s=0.0)
    assert choose(half, _reqs(), hb, spare=4, arrivals_per_s=0.008).candidates[0].request.gpus == 2
    busy_stream = choose(half, _reqs(), hb, spare=4, arrivals_per_s=0.014)
    first = busy_stream.candidates[0]
    assert first.request.gpus == 1 and "50.4 arrivals/h" in busy_stream.record(first, 0.0)
    pen = goodput_penalty(_reqs(), hb, 0, 0.014)
    assert pen(0) == 0.0 and pen(1) == pytest.approx(0.014 * 750 * 500 * 0.5 / 8)
    # GPUs nobody uses cost nothing to take: on an idle node the same stream does not stop the widening
    assert choose(pool, _reqs(), backlog, spare=8, arrivals_per_s=0.014).candidates[0].request.gpus == 2


def test_the_vectorised_fits_and_costs_agree_with_their_definitions():
    from cluster.sizing import _Free, _profile

    rng = random.Random(5)
    kinds = [("A100-40GB-SXM", 40.0), ("RTX-2080Ti", 11.0), ("V100-32GB", 32.0)]
    nodes = [NodeInfo(f"n{i}", *kinds[i % 3], 24.0, 8) for i in range(9)]
    for trial in range(40):
        pool = FreePool(nodes, {n.name: rng.randint(0, 8) for n in nodes})
        reqs = [GpuRequest(g * u, rng.choice([8.0, 11.0, 24.0, 40.0]), u,
                           rng.choice([None, frozenset({t for t, _ in rng.sample(kinds, rng.randint(1, 2))})]),
                           run_s=rng.uniform(100, 10_000)) for u in (1, 2) for g in range(1, 6)]
        backlog = Backlog(pool, [], now_s=0.0)
        assert _Free(pool).fit_all(reqs, _profile(reqs)) == [pool.fits(r) for r in reqs]
        behind, rate = rng.randint(0, 20), rng.uniform(0, 0.01)
        pen = goodput_penalty(reqs, backlog, behind, rate)
        best = min(r.gpus * r.run_s for r in reqs)
        for k, r in enumerate(reqs):
            shared = GpuRequest(r.unit, 0.0 if r.types else r.min_mem_gib, r.unit, r.types)
            cap = max(backlog.capacity(shared), 1)
            busy = (1.0 - min(pool.usable(shared), cap) / cap) / cap
            want = (behind + rate * r.run_s) * (r.gpus * r.run_s - best) * busy if r.gpus * r.run_s > best else 0.0
            assert pen(k) == pytest.approx(want, rel=1e-12, abs=1e-12), (trial, k)


def test_arrival_rate_is_over_the_recent_arrivals():
    from cluster.sizing import arrival_rate

    assert arrival_rate([], 10.0) == 0.0 and arrival_rate([5.0], 10.0) == 0.0
    assert arrival_rate([0.0, 100.0, 200.0], 200.0) == pytest.approx(2 / 200)
    assert arrival_rate([0.0, 100.0, 200.0], 400.0) == pytest.approx(2 / 400)  # a pause since lowers it
    assert arrival_rate([float(t) for t in range(100)], 99.0, window=10) == pytest.approx(9 / 9)
    assert arrival_rate([0.0, 50.0, 500.0], 100.0) == pytest.approx(1 / 100)  # a later submission is not yet seen


def test_claims_of_jobs_ahead_lengthen_the_predicted_wait():
    pool = _pool(0, 8)
    backlog = Backlog(pool, [Running(end_s=100.0, nodes=(("a0", 8),))], now_s=0.0)
    req = GpuRequest(4, 8, 1, FAST, run_s=1000.0)
    assert backlog.start_s(req) == 100.0
    backlog.claim(GpuRequest(8, 8, 1, FAST, run_s=1000.0))  # a job ahead waits for all eight A100s
    assert backlog.start_s(req) == pytest.approx(100.0 + 8 * 1000.0 / 8)
    assert backlog.start_s(GpuRequest(1, 8, 1, SLOW, run_s=1.0)) == 0.0  # other GPUs are not claimed


def test_a_wide_job_ahead_that_does_not_fit_holds_no_gpus_the_jobs_behind_backfill():
    pool = _pool(0, 8)  # one A100 frees at t=100, the other seven at t=10,000
    running = [Running(end_s=100.0, nodes=(("a0", 1),)), Running(end_s=10_000.0, nodes=(("a0", 7),))]
    backlog = Backlog(pool, running, now_s=0.0)
    req = GpuRequest(1, 8, 1, FAST, run_s=50.0)
    backlog.claim(GpuRequest(4, 8, 1, FAST, run_s=30_000.0))  # a wide job ahead: four A100s only at t=10,000
    assert backlog.start_s(req) == 100.0  # the walk starts it on the A100 freed at t=100 (was 10,000: held idle)
    backlog.claim(GpuRequest(1, 8, 1, FAST, run_s=500.0))  # a 1-GPU job ahead takes that A100 first
    assert backlog.start_s(req) == 600.0
    assert backlog.start_s(GpuRequest(4, 8, 1, FAST, run_s=1.0)) == 10_000.0  # beside the wide one: 8 free then
    assert backlog.start_s(GpuRequest(5, 8, 1, FAST, run_s=1.0)) == 40_000.0  # five only once the wide one ends


@pytest.mark.parametrize("release_s, waits", [(100.0, True), (10_000.0, False)])
def test_a_job_waits_for_a_wider_plan_of_the_same_type_when_that_finishes_sooner(release_s, waits):
    pool = _pool(1, 0)  # one A100 free now, the other seven free at `release_s`; no spare GPUs to widen into now
    backlog = Backlog(pool, [Running(end_s=release_s, nodes=(("a0", 7),))], now_s=0.0)
    reqs = [GpuRequest(1, 8, 1, FAST, run_s=8000.0), GpuRequest(8, 8, 1, FAST, run_s=1100.0)]
    ch = choose(pool, reqs, backlog, spare=0)
    first = ch.candidates[0]
    assert (first.nodes is None) == waits  # 8 GPUs at t=100 finish at 1,200 < 8,000; at t=10,000 they do not
    assert first.request.gpus == (8 if waits else 1)
    if waits:
        assert first.finish_s == pytest.approx(release_s + 1100.0)
        assert "waits for 8 GPU(s) of A100-40GB-SXM" in ch.record(None, 0.0)


def test_the_checker_counts_a_job_left_waiting_beside_idle_gpus():
    pool = _pool(0, 4)
    slow = [GpuRequest(1, 8, 1, SLOW, run_s=100.0)]
    assert idle_violations(pool, [(slow, math.inf)], None, 0.0) == 1  # it fits the idle 2080Tis and waits: violation
    fast = GpuRequest(1, 8, 1, FAST, run_s=40.0)  # the A100s are all busy; one frees up at t=10
    assert idle_violations(pool, [([*slow, fast], 50.0)], None, 0.0) == 0  # it waits for a plan that finishes sooner
    # with no faster plan, no predicted wait excuses it (the sizer's bookkeeping is not trusted)
    assert idle_violations(pool, [(slow, 50.0)], None, 0.0) == 1
    head = GpuRequest(8, 8, 1, SLOW, run_s=100.0)  # the head needs all eight 2080Tis when four free up at t=10
    res = reserve("head", pool, [Running(end_s=10.0, nodes=(("t0", 4),))], 0.0, lambda at: at.fits(head))
    assert res is not None and idle_violations(pool, [(slow, math.inf)], res, 0.0) == 0


def _random_cluster(rng: random.Random) -> Cluster:
    types = rng.sample(["RTX-2080Ti", "Quadro-RTX-6000", "V100-32GB", "A100-40GB-SXM"], rng.randint(1, 4))
    nodes = [Node(name=f"{t}-{k}", gpu=t, count=rng.choice((4, 8))) for t in types for k in range(rng.randint(1, 2))]
    return Cluster(name="random", nodes=nodes)


def _random_trace(rng: random.Random, cluster: Cluster, load: float) -> list[TraceJob]:
    n = rng.randint(20, 40)
    equal = rng.random() < 0.3
    jobs = []
    for _ in range(n):
        g = rng.choice((4, 8)) if rng.random() < 0.08 else 1
        d = 3600.0 if equal else min(86400.0, 300.0 * rng.paretovariate(1.2))
        jobs.append((g, d))
    gpus = sum(x.count for x in cluster.nodes)
    span = sum(g * d for g, d in jobs) / (load * gpus)
    times = sorted(rng.uniform(0, span) for _ in jobs)
    return [TraceJob(name=f"j{k}", submit_s=t, duration_s=d, num_gpus=g, model=model_for_gpu_hours(g * d / 3600),
                     global_batch=BATCH_PER_GPU * g) for k, (t, (g, d)) in enumerate(zip(times, jobs, strict=True))]


def test_no_job_waits_beside_idle_gpus_over_random_traces():
    """The invariant over seeded random cases: many 1-GPU jobs, a few wide; equal or heavy-tailed run times;
    1-4 GPU types; offered loads 0.3-1.2."""
    rng = random.Random(26)
    cases = 0
    for _ in range(40):
        cluster = _random_cluster(rng)
        load = rng.uniform(0.3, 1.2)
        res = simulate(cluster, _random_trace(rng, cluster, load), "has")
        s = res.summary()
        assert s.idle_violations == 0, (cluster, load)
        assert s.completed + s.unschedulable == s.jobs
        assert all(j.decision for j in res.jobs if j.finish is not None)
        cases += 1
    assert cases == 40


def test_the_default_beats_fcfs_on_a_production_shaped_trace():
    """Issue 26's losing case (99% 1-GPU, long jobs, phoebe), on a seed the benchmark does not use, at low load: below fcfs."""
    c = load_cluster("phoebe")
    trace = production(120, seed=11, mean_interarrival_s=1800.0)
    has, fcfs = simulate(c, trace, "has").summary(), simulate(c, trace, "fcfs").summary()
    assert has.idle_violations == 0
    assert has.avg_jct_s < fcfs.avg_jct_s and has.p99_jct_s <= fcfs.p99_jct_s


def test_the_paper_policy_stays_available():
    c = load_cluster("frenzy-testbed")
    trace = mixed(15, seed=2, mean_interarrival_s=300.0)
    res = simulate(c, trace, "has", SimConfig(sizing=False))
    assert res.summary().completed >= 10 and not any(j.decision for j in res.jobs)


def test_synthetic_specs():
    assert parse_synthetic("production:5:3") == production(5, 3)
    assert len(parse_synthetic("mixed:7")) == 7
    with pytest.raises(TraceError, match="production:N"):
        parse_synthetic("production:x")


def test_the_ledger_queue_sizes_by_load_and_records_why(tmp_path):
    clock = [0.0]
    ledger = Ledger(str(tmp_path / "l.db"), clock=lambda: clock[0])
    ledger.sync(Cluster(name="c", nodes=[Node(name="a0", gpu="A100-40GB-SXM", count=8),
                                         Node(name="t0", gpu="RTX-2080Ti", count=8)]))
    for k in range(20):  # 20 jobs wait: each gets its most efficient plan (1 GPU); once the A100s are taken,
        # a 2080Ti (1.5x slower) finishes sooner than waiting 1000 s for an A100
        ledger.submit(f"j{k}", _reqs(run_fast=1000.0, slowdown=1.5), predicted_s=1000.0)
    placed = ledger.schedule("backfill")
    assert len(placed) == 16 and all(a.gpus == 1 for a in placed)
    assert sorted(a.nodes[0].gpu_type for a in placed) == ["A100-40GB-SXM"] * 8 + ["RTX-2080Ti"] * 8
    assert all(a.decision.startswith("pack:") for a in placed)
    assert "load: 19 jobs wait behind it" in placed[0].decision  # the record names the load that chose the mode
    spilled = [a for a in placed if a.nodes[0].gpu_type == "RTX-2080Ti"]
    assert all("runs now rather than wait 1000 s" in a.decision for a in spilled)
    assert {a.id: a.decision for a in ledger.allocations()} == {a.id: a.decision for a in placed}
    assert len(ledger.queue()) == 4


def test_cli_shows_the_decision_record(capsys, tmp_path):
    from cli.main import main

    out_csv = tmp_path / "jobs.csv"
    code = main(["simulate", "--trace", "production:12:4", "--policy", "has", "--policy", "fcfs",
                 "--jobs-csv", str(out_csv), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["jobs_csv"]["rows"] == 24 and doc["policies"]["has"]["idle_violations"] == 0
    rows = list(csv.DictReader(out_csv.open()))
    has = [r for r in rows if r["policy"] == "has"]
    assert len(has) == 12 and all(r["decision"].split(":")[0] in ("pack", "widen") for r in has)
    led = str(tmp_path / "l.db")
    ledger = Ledger(led)
    ledger.sync(load_cluster("phoebe"))
    ledger.submit("a", _reqs(), predicted_s=1000.0)
    assert len(ledger.schedule()) == 1
    code = main(["cluster", "show", "--ledger", led])
    text = capsys.readouterr().out
    assert code == 0 and "a: widen: 2 GPU(s) of A100-40GB-SXM" in text
    assert "load: 44 free GPUs left after the smallest plans of the 0 jobs behind it" in text  # phoebe: 44 GPUs, none busy
    code = main(["cluster", "show", "--ledger", led, "--json"])
    assert json.loads(capsys.readouterr().out)["allocations"][0]["decision"].startswith("widen: 2 GPU(s)")


def _reference_start(now: float, have: int, releases: list[tuple[float, int]], claims: list[tuple[int, float]],
                     gpus: int) -> float:
    """The predicted start as the Backlog's docstring states it, stepped event by event with no caching or jumps: at
    each event every claim ahead that fits starts in walk order; the plan starts at the first event with `gpus` free."""
    free, t, pending, rel, ends = have, now, list(claims), sorted(releases), []
    while True:
        still = []
        for g, run in pending:
            if g <= free:
                free -= g
                ends.append((t + run, g))
            else:
                still.append((g, run))
        pending = still
        if free >= gpus:
            return t
        t = min([e for e, _ in rel] + [e for e, _ in ends], default=math.inf)
        if math.isinf(t):
            return math.inf
        free += sum(k for e, k in rel + ends if e <= t)
        rel, ends = [x for x in rel if x[0] > t], [x for x in ends if x[0] > t]


def _random_pass(rng: random.Random) -> int:
    """One random pass of claims, starts and predicted starts on a random cluster of several GPU types; every
    prediction is checked against `_reference_start`. Returns the predictions checked."""
    types = ["A100", "V100", "T4"][: rng.randint(1, 3)]
    nodes = [NodeInfo(f"n{i}", rng.choice(types), rng.choice([16.0, 32.0, 80.0]), 100, rng.choice([2, 4, 8]))
             for i in range(rng.randint(1, 6))]
    runs = [0.0, 50.0, 100.0, 100.0, 250.0, 1000.0, math.inf]  # repeats: ties between ends and releases
    busy = {n.name: rng.randint(0, n.capacity) for n in nodes}
    pool = FreePool(nodes, {n.name: n.capacity - busy[n.name] for n in nodes})
    now = 100.0
    running = [Running(end_s=rng.choice([50.0, 100.0, 200.0, 200.0, 700.0, math.inf]), nodes=((n, k),))
               for n, k in busy.items() if k]  # 50: overdue, predicted to end now
    backlog = Backlog(pool, running, now_s=now)
    started: list[tuple[float, str, int]] = []
    claims: list[tuple[GpuRequest, int, float]] = []

    def req() -> GpuRequest:
        ts = frozenset(rng.sample(types, rng.randint(1, len(types)))) if rng.random() < 0.9 else None
        run = rng.choice(runs + [None])
        return GpuRequest(rng.choice([1, 1, 2, 3, 4, 8]), rng.choice([8.0, 20.0, 40.0]), 1, ts,
                          run_s=None if run is None or math.isinf(run) else run)

    def admitted(r: GpuRequest) -> set[str]:
        return {n.name for n in nodes if r.admits(n.mem_gib, n.gpu_type)}
    checked = 0
    for _ in range(rng.randint(5, 40)):
        r, op = req(), rng.random()
        if op < 0.4:
            backlog.claim(r)
            claims.append((r, r.gpus, math.inf if r.run_s is None else r.run_s))
        elif op < 0.55:
            free = [n for n, k in pool.free.items() if k]
            if free:
                took = [(n, rng.randint(1, pool.free[n])) for n in rng.sample(free, rng.randint(1, len(free)))]
                run = rng.choice(runs[:-1] + [None])
                backlog.started(took, run)
                pool.take(took)
                started += [(now + run, n, k) for n, k in took if run is not None]
        else:
            mine = admitted(r)
            rel = [(max(x.end_s, now), k) for x in running for n, k in x.nodes if n in mine and not math.isinf(x.end_s)]
            rel += [(e, k) for e, n, k in started if n in mine]
            ahead = [(g, run) for c, g, run in claims if admitted(c) & mine]
            want = _reference_start(now, pool.usable(r), rel, ahead, r.gpus)
            assert backlog.start_s(r) == want, (r, ahead, rel)
            checked += 1
    return checked


def test_the_predicted_start_replayed_once_per_pass_matches_the_step_by_step_walk():
    """The replay shared by the plans of a pass (`Backlog`) predicts the same start as stepping through the walk for
    each plan: 400 random passes (several GPU types and memories, rigid and elastic-sized requests, claims that never
    fit, claims with no or zero predicted run, ties between releases and ends, releases overdue)."""
    rng = random.Random(11)
    assert sum(_random_pass(rng) for _ in range(400)) > 2000
