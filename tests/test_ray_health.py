"""Ray's failure paths that need no Ray cluster: the ledger following Ray's node states, connecting to an address
where nothing listens (the real CLI, with its exit status and message), Ray Client refused with the install line, and
an inventory of nodes started without a `frenzy_node:` resource."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.has import GpuRequest
from cluster.inventory import Cluster, InventoryError, Node
from cluster.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]


def _ledger(tmp: Path) -> Ledger:
    led = Ledger(str(tmp / "l.db"))
    led.sync(Cluster(name="r", nodes=[Node(name=n, gpu="A100-40GB", count=1) for n in ("head", "w1", "w2")]))
    return led


def test_dead_nodes_go_down_receive_nothing_and_come_back_when_alive(tmp_path):
    led = _ledger(tmp_path)
    led.cordon("w2", "operator")
    assert led.set_liveness({"w1": False, "w2": False, "gone": False}, "dead in Ray") == ["w1"]
    state = {n.name: (n.state, n.reason) for n in led.nodes()}
    assert state == {"head": ("up", ""), "w1": ("down", "dead in Ray"), "w2": ("cordoned", "operator")}
    a = led.allocate("j", [GpuRequest(gpus=1, min_mem_gib=30)])
    assert [n.node for n in a.nodes] == ["head"] and led.allocate("k", [GpuRequest(gpus=1, min_mem_gib=30)]) is None
    assert led.set_liveness({"w1": True, "w2": True}, "") == ["w1"]  # a cordon is a person's call: it stays
    assert {n.name: n.state for n in led.nodes()} == {"head": "up", "w1": "up", "w2": "cordoned"}
    assert [e.kind for e in led.events() if e.subject == "w1"][-2:] == ["down", "up"]


def _frenzy(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_an_address_where_nothing_listens_fails_at_once_naming_the_fix(tmp_path):
    r = _frenzy("cluster", "init", "--cluster", "ray", "--ledger", str(tmp_path / "l.db"), "--json",
                env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["kind"] == "error"  # the one document: the error
    assert "127.0.0.1:1" in r.stderr and "ray start --head" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("ray") is None or importlib.util.find_spec("grpc") is not None,
                    reason="needs ray without Ray Client")
def test_a_ray_client_address_without_ray_client_names_the_install_line(tmp_path):
    r = _frenzy("cluster", "init", "--cluster", "ray://127.0.0.1:10001", "--ledger", str(tmp_path / "l.db"),
                env={})
    assert r.returncode == 2 and "pip install 'ray[client]'" in r.stderr


class _FakeRay:
    """What `ray.nodes()` returns (its documented fields), for the inventory's naming rules."""

    def __init__(self, nodes: list[dict]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[dict]:
        return self._nodes


def _info(node_id: str, resources: dict, alive: bool = True) -> dict:
    return {"NodeID": node_id * 8, "Alive": alive, "NodeManagerAddress": "10.0.0.1", "Resources": resources}


def test_nodes_without_a_frenzy_name_are_left_out_and_none_at_all_is_refused(monkeypatch):
    from cluster import inventory

    named = _info("a", {"CPU": 8, "GPU": 8, "frenzy_node:a100-0": 1, "frenzy_gpu:A100-40GB": 8})
    bare = _info("b", {"CPU": 8, "GPU": 8, "accelerator_type:A100": 1})
    dead = _info("c", {"CPU": 8, "frenzy_node:gone": 1}, alive=False)
    monkeypatch.setattr(inventory, "connect", lambda address=None: _FakeRay([named, bare, dead]))
    inv = inventory.ray_inventory()
    assert [(n.name, n.gpu, n.count) for n in inv.nodes] == [("a100-0", "A100-40GB", 8)]
    monkeypatch.setattr(inventory, "connect", lambda address=None: _FakeRay([bare, dead]))
    with pytest.raises(InventoryError, match="frenzy_node:NAME") as err:
        inventory.ray_inventory()
    assert "1 alive without" in str(err.value) and "bbbbbbbb" in str(err.value)


def test_a_queue_timeout_exits_2_with_its_message_and_no_traceback(capsys):
    import argparse

    from cli.output import run
    from cluster.ledger import QueueTimeout

    def waited(args: argparse.Namespace) -> int:  # what flows/place.py raises after --max-wait
        raise QueueTimeout("j: no plan fitted within 1 s (queue position 1); free GPUs, uncordon nodes or raise the "
                           "timeout")

    assert run(argparse.Namespace(fn=waited, json=True, command="submit")) == 2
    out = capsys.readouterr()
    assert "frenzy submit: error: j: no plan fitted" in out.err and "Traceback" not in out.err
    assert json.loads(out.out)["error"]["message"].startswith("j: no plan fitted")  # and the one --json document


def test_a_node_found_dead_before_ray_noticed_stays_down_until_it_rejoins(tmp_path, monkeypatch):
    from cluster import ray_health

    led = _ledger(tmp_path)
    led.set_liveness({"w1": False}, "dead at 12:00: lost during training (port; Ray node aaaaaaaa)")
    head = _info("h", {"frenzy_node:head": 1})
    old_w1 = _info("a", {"frenzy_node:w1": 1})  # Ray's health check has not caught up: still listed alive
    monkeypatch.setattr(ray_health, "connect", lambda address=None: _FakeRay([head, old_w1]))
    assert ray_health.sync_ledger(led) == ["w2"]  # w2 is not in Ray at all: down
    assert {n.name: n.state for n in led.nodes()} == {"head": "up", "w1": "down", "w2": "down"}
    new_w1 = _info("b", {"frenzy_node:w1": 1})  # the node rejoined: a new Ray node id
    monkeypatch.setattr(ray_health, "connect", lambda address=None: _FakeRay([head, new_w1]))
    assert ray_health.sync_ledger(led) == ["w1"]
    assert {n.name: n.state for n in led.nodes()} == {"head": "up", "w1": "up", "w2": "down"}


def test_a_node_sees_the_submitting_sides_directory_only_by_its_mark_and_token(tmp_path):
    from cluster.ray_exec import sees_marks

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / ".frenzy-shared-a").write_text("tok")
    assert sees_marks([(str(shared), ".frenzy-shared-a", "tok")]) == []
    assert list(shared.iterdir()) == [shared / ".frenzy-shared-a"]  # the write probe is gone again
    other = sees_marks([(str(shared), ".frenzy-shared-a", "another")])  # same name, another node's directory
    assert len(other) == 1 and "another directory of that name" in other[0]
    missing = sees_marks([(str(tmp_path / "elsewhere"), ".frenzy-shared-a", "tok")])
    assert len(missing) == 1 and "mark file is not there" in missing[0]
