"""The two-round pairwise node check (cluster/nodecheck.py): real gloo collectives between local processes."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from cluster.inventory import Cluster, Node
from cluster.ledger import Ledger
from cluster.nodecheck import GroupRun, _pairs, check_nodes, local_probe


def test_pairs_and_an_odd_count_makes_one_world_of_three():
    assert _pairs(["a", "b", "c", "d"]) == [["a", "b"], ["c", "d"]]
    assert _pairs(["a", "b", "c", "d", "e"]) == [["a", "b"], ["c", "d", "e"]]
    assert _pairs(["a", "b", "c"]) == [["a", "b", "c"]]


def _fake(bad: set[str], slow: dict[str, float] | None = None):
    calls = []

    def probe(group):
        calls.append(list(group))
        ok = not set(group) & bad
        return GroupRun(nodes=list(group), ok=ok, seconds=max((slow or {}).get(n, 1.0) for n in group) if ok else 30)

    return probe, calls


def test_round_two_tells_the_faulty_node_from_its_partner():
    probe, calls = _fake({"n5"})
    r = check_nodes([f"n{i}" for i in range(16)], probe=probe)
    assert r.faulty == ["n5"] and r.slow == [] and len(r.rounds) == 2
    assert len(calls) == 8 + 2  # 8 pairs, then each of the two suspects with a known-good node
    # round 2: each suspect (n4 and n5 failed together) with a node that passed round 1
    assert sorted(g[0] for g in calls[8:]) == ["n4", "n5"] and not {g[1] for g in calls[8:]} & {"n4", "n5"}


def test_slow_nodes_are_flagged_and_confirmed():
    probe, _ = _fake(set(), slow={"n3": 5.0})
    r = check_nodes([f"n{i}" for i in range(8)], probe=probe)
    assert r.slow == ["n3"] and r.faulty == []


def test_when_every_group_fails_nothing_is_called_faulty_without_evidence():
    probe, _ = _fake({"a", "c"})
    r = check_nodes(["a", "b", "c", "d"], probe=probe)
    assert r.faulty == [] and sorted(r.unverified) == ["a", "b", "c", "d"]


def test_a_real_check_finds_the_node_whose_collective_fails_and_cordons_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FRENZY_NODECHECK_FAIL", "n2")
    led = Ledger(str(tmp_path / "l.db"))
    led.sync(Cluster(name="c", nodes=[Node(name=f"n{i}", gpu="A100-80GB-PCIE", count=1) for i in range(4)]))
    assert main(["cluster", "check", "--ledger", str(tmp_path / "l.db"), "--cordon", "--timeout", "20",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["faulty"] == ["n2"] and doc["cordoned"] == ["n2"]
    state = {n.name: (n.state, n.reason) for n in led.nodes()}
    assert state["n2"][0] == "cordoned" and "node check" in state["n2"][1] and state["n3"][0] == "up"


def test_a_real_probe_of_a_healthy_pair_passes():
    r = local_probe(probe_mb=1, timeout_s=30)(["x", "y"])
    assert r.ok and 0 < r.seconds < 30


def test_the_check_needs_two_nodes():
    with pytest.raises(ValueError, match="at least 2 nodes"):
        check_nodes(["only"])
