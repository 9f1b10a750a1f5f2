"""HAS (Algorithm 1) made precise: plan order, gang semantics, best fit, tie-breaks."""

import pytest

from cluster.catalog import default_catalog
from cluster.has import FreePool, GpuRequest, NodeInfo, decide, place, requests_from_plans
from cluster.inventory import load_cluster
from tasks.jobspec import parse_job
from tasks.planning.plans import plan_resources


def pool(*nodes, free=None):
    return FreePool([NodeInfo(*n) for n in nodes], free)


def n40(name, cap, link=24.0):
    return (name, "A100-40GB-PCIE", 40.0, link, cap)


def test_least_leftover_is_chosen_when_no_node_fits_exactly():
    # the Blox regression: free (8, 6, 4), need 3 -> the 4-node (leftover 1), never a larger one
    p = pool(n40("a", 8), n40("b", 6), n40("c", 4))
    assert place(p, GpuRequest(3, 30)) == [("c", 3)]
    p = pool(n40("a", 8), n40("b", 6), n40("c", 4), free={"a": 8, "b": 6, "c": 2})
    assert place(p, GpuRequest(5, 30)) == [("b", 5)]


def test_exact_fit_beats_a_larger_node_and_greedy_then_best_fit():
    p = pool(n40("a", 8), n40("b", 6), n40("c", 4))
    assert place(p, GpuRequest(6, 30)) == [("b", 6)]
    # need 10 with free (8, 6, 4): the most idle node first, then the remainder by best fit (4-node, not 6-node)
    assert place(p, GpuRequest(10, 30)) == [("a", 8), ("c", 2)]


def test_gang_per_node_multiples_of_unit_not_aggregate_totals():
    # 4 GPUs in TP groups of 4: 3 + 3 free GPUs add up, but no node holds a whole group
    p = pool(n40("a", 4), n40("b", 4), free={"a": 3, "b": 3})
    assert not p.fits(GpuRequest(4, 30, unit=4))
    assert decide(p, [GpuRequest(4, 30, unit=4)]) is None
    assert place(p, GpuRequest(4, 30, unit=2)) == [("a", 2), ("b", 2)]


def test_plans_are_tried_in_order_and_memory_filters_gpus():
    p = pool(("big", "A100-80GB-PCIE", 80.0, 24.0, 2), ("small", "RTX-2080Ti", 11.0, 12.0, 8),
             free={"big": 1, "small": 8})
    reqs = [GpuRequest(2, 60), GpuRequest(1, 60), GpuRequest(4, 10)]
    d = decide(p, reqs)
    assert d is not None and d.plan_index == 1 and d.nodes == [("big", 1)]
    # no GPU below min memory is ever mixed in, even though the totals (9) suffice
    assert decide(p, [GpuRequest(3, 60)]) is None


def test_types_restrict_the_request():
    p = pool(("x", "A800-80GB", 80.0, 200.0, 4), ("y", "A100-80GB-PCIE", 80.0, 24.0, 2))
    assert place(p, GpuRequest(2, 10, types=frozenset({"A800-80GB"}))) == [("x", 2)]
    assert place(p, GpuRequest(2, 10)) == [("y", 2)]  # exact fit wins over the faster link


def test_ties_prefer_the_faster_link_then_smaller_memory_then_name():
    p = pool(("p", "A100-80GB-PCIE", 80.0, 24.0, 4), ("n", "A800-80GB", 80.0, 200.0, 4),
             ("m", "A100-40GB-SXM", 40.0, 300.0, 4), ("l", "A100-40GB-SXM", 40.0, 300.0, 4))
    assert place(p, GpuRequest(4, 30)) == [("l", 4)]
    assert place(p, GpuRequest(4, 60)) == [("n", 4)]


def test_take_and_give_keep_the_index_consistent():
    p = pool(n40("a", 8), n40("b", 4))
    p.take([("a", 5)])
    assert p.free == {"a": 3, "b": 4} and p.usable(GpuRequest(2, 30, unit=2)) == 2 + 4
    with pytest.raises(ValueError):
        p.take([("b", 5)])
    p.give([("a", 5)])
    assert p.usable(GpuRequest(1, 30)) == 12
    with pytest.raises(ValueError):
        p.give([("b", 1)])


def test_the_per_memory_table_agrees_with_usable_through_takes_and_gives():
    import bisect
    import random

    rng = random.Random(3)
    types = [("A100-80GB-SXM", 80.0), ("A100-40GB-PCIE", 40.0), ("V100-32GB", 32.0), ("RTX-2080Ti", 11.0)]
    nodes = [NodeInfo(f"n{i}", *types[i % 4], 24.0, rng.choice([4, 8])) for i in range(12)]
    p = FreePool(nodes)
    for _ in range(60):
        name = rng.choice(nodes).name
        k = rng.randint(0, p.free[name])
        p.take([(name, k)]) if rng.random() < 0.6 else p.give([(name, min(k, p.info[name].capacity - p.free[name]))])
        for ts in (None, frozenset({"V100-32GB"}), frozenset({"A100-80GB-SXM", "RTX-2080Ti"})):
            for unit in (1, 2, 4, 3):
                tab = p.usable_by_memory(ts, unit)
                for mem in (0.0, 11.0, 24.0, 32.0, 40.0, 64.0, 80.0, 96.0):
                    req = GpuRequest(unit, mem, unit, ts)
                    if tab is None:
                        assert unit == 3  # units not kept per class: the caller falls back to usable
                    else:
                        assert tab[1][bisect.bisect_left(tab[0], mem)] == p.usable(req), (ts, unit, mem)


def test_requests_from_marp_plans_only_admit_types_at_least_as_fast():
    job = parse_job({"name": "x", "model": {"preset": "gpt2-350m"}, "training": {"global_batch": 32,
                                                                              "precision": "fp16-mixed"}})
    plans = plan_resources(job, load_cluster("phoebe"))
    reqs, idx = requests_from_plans(plans, default_catalog(), "fp16-mixed")
    assert len(reqs) == len(idx) and len(set(reqs)) == len(reqs)
    for r, i in zip(reqs, idx, strict=False):
        p = plans[i]
        assert r.gpus == p.gpus and r.unit == p.layout.tp and p.gpu_type in r.types
        if p.gpu_type == "A100-40GB-SXM":
            assert "RTX-2080Ti" not in r.types and "Quadro-RTX-6000" not in r.types
