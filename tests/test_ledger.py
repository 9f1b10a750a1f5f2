"""The durable ledger under concurrency, kills and crashes: real processes, on a real SQLite file and on a real
PostgreSQL server on loopback."""

import json
import multiprocessing as mp
import os
import random
import signal
import time

import pytest
from sqlalchemy import select

from cluster.has import GpuRequest
from cluster.inventory import Cluster, Node, load_cluster
from cluster.ledger import LeaseKeeper, Ledger, LedgerError, RunRecord, allocations_t

SMALL = Cluster(name="t", nodes=[Node(name="n0", gpu="A100-40GB-PCIE", count=4),
                                 Node(name="n1", gpu="A100-40GB-PCIE", count=4),
                                 Node(name="n2", gpu="A100-80GB-PCIE", count=2)])


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    if request.param == "sqlite":
        u = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        from tests.pg_server import fresh_database

        u = fresh_database(request.getfixturevalue("postgres_admin"))
    Ledger(u).sync(SMALL)
    return u


def _worker(url: str, wid: int, rounds: int, out: str) -> None:
    led = Ledger(url)
    rng = random.Random(wid)
    held = []
    for r in range(rounds):
        reqs = [GpuRequest(rng.choice([1, 2, 3, 4, 6]), rng.choice([10, 50]))]
        a = led.allocate(f"w{wid}-{r}", reqs, lease_s=60)
        if a is None:
            time.sleep(0.002)
            continue
        t0 = time.time()  # after commit
        time.sleep(rng.uniform(0, 0.01))
        t1 = time.time()  # before release
        led.release(a.id)
        held.append({"t0": t0, "t1": t1, "gpus": [[n.node, g] for n in a.nodes for g in n.gpu_indices]})
    with open(out, "w") as f:
        json.dump(held, f)


def test_concurrent_processes_never_hold_the_same_gpu(url, tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(url, w, 40, str(tmp_path / f"w{w}.json"))) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    spans = {}
    total = 0
    for w in range(4):
        for h in json.load(open(tmp_path / f"w{w}.json")):
            total += 1
            for g in h["gpus"]:
                spans.setdefault(tuple(g), []).append((h["t0"], h["t1"]))
    assert total > 40  # the workers really allocated
    for g, s in spans.items():
        s.sort()
        for (a0, a1), (b0, b1) in zip(s, s[1:], strict=False):
            assert b0 >= a1, f"GPU {g} held twice: {a0}-{a1} and {b0}-{b1}"
    led = Ledger(url)
    assert led.allocations() == [] and sum(len(n.free_indices) for n in led.nodes()) == 10


def _hold_forever(url: str, ready) -> None:
    led = Ledger(url)
    a = led.allocate("victim", [GpuRequest(4, 10)], lease_s=1.5)
    with LeaseKeeper(led, a.id, 1.5):
        ready.set()
        time.sleep(600)


def test_gpus_of_a_killed_process_come_back_when_its_lease_expires(url):
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_forever, args=(url, ready))
    p.start()
    assert ready.wait(60)
    led = Ledger(url)
    first = _expiry(led, "victim")
    deadline = time.monotonic() + 60
    while _expiry(led, "victim") <= first:  # the heartbeat renews the lease (observed, not waited out)
        assert time.monotonic() < deadline, "the lease was never renewed"
        time.sleep(0.05)
    assert [a.job for a in led.allocations()] == ["victim"]
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert led.allocate("big", [GpuRequest(10, 10)]) is None  # still held right after the kill
    expiry = _expiry(led, "victim")
    before = Ledger(url, clock=lambda: expiry - 0.01)  # a clock just before the lease runs out: still held
    assert before.allocate("big", [GpuRequest(10, 10)]) is None
    after = Ledger(url, clock=lambda: expiry + 0.01)  # just after: nobody renewed it, its GPUs come back
    a = after.allocate("big", [GpuRequest(10, 10)])
    assert a is not None and a.gpus == 10
    assert any(e.kind == "lease-expired" and e.subject == "victim" for e in led.events())


def _expiry(led: Ledger, job: str) -> float:
    with led.engine.connect() as conn:
        return conn.execute(select(allocations_t.c.lease_expiry).where(allocations_t.c.job == job,
                                                                      allocations_t.c.state == "active")).scalar_one()


def test_a_failed_multi_node_allocation_leaves_nothing(url):
    led = Ledger(url)
    with pytest.raises(RuntimeError):
        led.allocate("gang", [GpuRequest(8, 10)], _fail_after_first_node=True)
    assert led.allocations() == [] and sum(len(n.free_indices) for n in led.nodes()) == 10
    a = led.allocate("gang", [GpuRequest(8, 10)])
    assert a is not None and len(a.nodes) == 2


def _allocate_then_die(url: str) -> None:
    a = Ledger(url).allocate("durable", [GpuRequest(2, 50)], lease_s=3600)
    assert a is not None
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_committed_allocation_survives_a_crash(url):
    p = mp.get_context("spawn").Process(target=_allocate_then_die, args=(url,))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    allocs = Ledger(url).allocations()
    assert [(a.job, a.nodes[0].node) for a in allocs] == [("durable", "n2")]


def test_queue_backfills_on_release_and_strict_blocks(url):
    led = Ledger(url)
    a = led.allocate("first", [GpuRequest(8, 10)])
    led.submit("wide", [GpuRequest(6, 10)])
    led.submit("narrow", [GpuRequest(2, 10)])
    placed = led.schedule("strict")
    assert placed == []  # wide does not fit and blocks narrow
    placed = led.schedule("backfill")
    assert [p.job for p in placed] == ["narrow"]  # backfilled past wide
    assert led.queue_status("wide").position == 1
    placed = led.release(a.id)  # every release retries the queue
    assert [p.job for p in placed] == ["wide"]
    assert led.queue_status("wide").state == "placed"


def test_cordoned_nodes_get_no_new_work_and_errors_name_the_fix(url):
    led = Ledger(url)
    led.cordon("n2", "ECC errors")
    assert led.allocate("x", [GpuRequest(1, 50)]) is None
    led.uncordon("n2")
    assert led.allocate("x", [GpuRequest(1, 50)]) is not None
    with pytest.raises(LedgerError, match="nodes: n0, n1, n2"):
        led.cordon("nope")
    with pytest.raises(LedgerError, match="plan the job first"):
        led.allocate("y", [])


def test_renew_reports_a_lost_lease(url):
    led = Ledger(url)
    a = led.allocate("x", [GpuRequest(1, 10)], lease_s=60)
    Ledger(url, clock=lambda: time.time() + 61).schedule()  # any writer reclaims expired leases
    assert led.renew(a.id) is False
    b = led.allocate("y", [GpuRequest(1, 10)], lease_s=60)
    assert led.renew(b.id) is True


def test_a_waiter_whose_lease_lapsed_is_not_listed_in_the_queue_before_any_write(url):
    """Red team 41r: a submit killed while it waited in the queue stayed listed by `frenzy cluster show` until the next
    placement (a read reclaims nothing); `queue()` lists only waiters under a live lease, as `allocations()` does."""
    led = Ledger(url)
    led.allocate("x", [GpuRequest(4, 10)], lease_s=600)  # every GPU of n0: the next job waits
    led.submit("dead", [GpuRequest(4, 10)], lease_s=30)
    led.submit("alive", [GpuRequest(4, 10)], lease_s=300)
    assert [q.job for q in led.queue()] == ["dead", "alive"]
    later = Ledger(url, clock=lambda: time.time() + 31)  # its process renewed nothing: its lease lapsed
    assert [q.job for q in later.queue()] == ["alive"]


def test_sync_refuses_to_shrink_a_node_under_allocation(url):
    led = Ledger(url)
    led.allocate("x", [GpuRequest(4, 10)])
    small = SMALL.model_copy(update={"nodes": [Node(name="n0", gpu="A100-40GB-PCIE", count=2)]})
    with pytest.raises(LedgerError, match="cannot shrink"):
        led.sync(small)
    led.sync(load_cluster("frenzy-testbed"))
    assert len(led.nodes()) == 3 + 5


def test_ledger_takes_a_path_and_names_the_fix_for_a_bad_url(tmp_path):
    led = Ledger(str(tmp_path / "sub" / "l.db"))
    assert led.url.startswith("sqlite:///") and (tmp_path / "sub" / "l.db").exists()
    with pytest.raises(LedgerError, match="driver is installed"):
        Ledger("postgresql+nosuchdriver://u@127.0.0.1:1/x")


def _open_and_allocate(url: str, wid: int, out) -> None:
    led = Ledger(url)
    led.sync(SMALL)
    a = led.allocate(f"opener-{wid}", [GpuRequest(1, 10)], lease_s=60)
    out.put(None if a is None else [a.nodes[0].node, a.nodes[0].gpu_indices[0]])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_fresh_ledger_opened_by_several_processes_at_once(backend, request, tmp_path):
    if backend == "sqlite":
        u = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        from tests.pg_server import fresh_database

        u = fresh_database(request.getfixturevalue("postgres_admin"))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_open_and_allocate, args=(u, w, out)) for w in range(4)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert None not in got and len({tuple(g) for g in got}) == 4  # four distinct GPUs
    assert len(Ledger(u).allocations()) == 4


def test_shortest_order_places_the_shortest_predicted_job_first(url, monkeypatch):
    now = [1_000.0]  # the queue's priority is waited / predicted ** 0.75: a clock the test moves, not the machine's
    clock = lambda: now[0]  # noqa: E731
    led = Ledger(url, clock=clock)
    a = led.allocate("hog", [GpuRequest(10, 10)])
    for t, (job, pred) in enumerate((("long", 3600), ("unknown", None), ("short", 60), ("mid", 600))):
        now[0] = 1_000.0 + t
        led.submit(job, [GpuRequest(4, 10)], predicted_s=pred)  # "unknown": no prediction, last
    assert [q.predicted_s for q in led.queue()] == [3600, None, 60, 600]
    now[0] = 1_010.0
    placed = led.release(a.id, order="shortest")  # 10 GPUs free: two 4-GPU jobs fit (n0, n1)
    assert [p.job for p in placed] == ["short", "mid"]
    now[0] = 1_011.0
    led.submit("quick", [GpuRequest(8, 10)], predicted_s=5)  # waiting now: long, unknown, quick
    now[0] = 1_020.0
    assert led.queue_status("quick").position == 1  # the ledger's default order is shortest-first
    monkeypatch.setenv("FRENZY_QUEUE_ORDER", "backfill")
    assert Ledger(url, clock=clock).queue_status("quick").position == 3  # arrival order on request
    monkeypatch.setenv("FRENZY_QUEUE_ORDER", "shortest")
    led2 = Ledger(url, clock=clock)
    assert led2.order == "shortest" and led2.queue_status("quick").position == 1
    assert led2.queue_status("unknown").position == 3  # no prediction: last
    led2.cancel("quick")
    led2.release(placed[0].id)  # the ledger's own order
    assert led2.queue_status("long").state == "placed" and led2.queue_status("unknown").state == "waiting"
    monkeypatch.setenv("FRENZY_QUEUE_ORDER", "sjf")
    with pytest.raises(LedgerError, match="shortest, backfill, strict"):
        Ledger(url)


def test_a_ledger_from_before_predicted_s_is_migrated(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE queue (seq INTEGER PRIMARY KEY, job VARCHAR(255) NOT NULL UNIQUE, owner VARCHAR(255) "
                "NOT NULL, requests TEXT NOT NULL, submitted_at FLOAT NOT NULL, lease_s FLOAT NOT NULL, "
                "lease_expiry FLOAT NOT NULL, state VARCHAR(16) NOT NULL, allocation_id VARCHAR(32))")
    con.execute("INSERT INTO queue (job, owner, requests, submitted_at, lease_s, lease_expiry, state) "
                "VALUES ('old', 'me', '[]', 0, 1e12, 1e12, 'waiting')")
    con.commit()
    con.close()
    led = Ledger(str(path))
    led.sync(SMALL)
    assert [(q.job, q.predicted_s) for q in led.queue()] == [("old", None)]
    led.submit("new", [GpuRequest(1, 10)], predicted_s=5.0)
    assert [q.predicted_s for q in led.queue()] == [None, 5.0]


def _rec(job: str, root: str, stage: str = "reported") -> RunRecord:
    return RunRecord(job=job, stage=stage, checkpoint_root=root, run_dir=root.removeprefix("file://") + "/run",
                     history_dir=root.removeprefix("file://") + "/evals", suite="quick", steps=20)


def test_two_users_runs_of_one_job_name_are_two_runs(url):
    led = Ledger(url)
    led.record_run(_rec("exp", "file:///home/alice/runs/exp/ckpt"))
    led.record_run(_rec("exp", "file:///home/bob/runs/exp/ckpt", stage="training"))
    led.record_run(_rec("exp", "file:///home/alice/runs/exp/ckpt", stage="failed"))  # Alice's again: updated
    assert sorted((r.checkpoint_root, r.stage) for r in led.runs()) == [
        ("file:///home/alice/runs/exp/ckpt", "failed"), ("file:///home/bob/runs/exp/ckpt", "training")]
    assert led.run("exp", "file:///home/bob/runs/exp/ckpt").stage == "training"
    assert led.run("exp").checkpoint_root == "file:///home/alice/runs/exp/ckpt"  # by name: the newest
    assert led.run("exp", "file:///elsewhere") is None
    assert len(led.runs("exp")) == 2 and led.runs("other") == []
    for who in ("alice", "bob"):
        led.note_checkpoints("exp", f"file:///home/{who}/runs/exp/ckpt", "quick")
    assert sorted(led.checkpoint_roots()) == ["file:///home/alice/runs/exp/ckpt", "file:///home/bob/runs/exp/ckpt"]
    assert {r.job for r in led.checkpoint_roots().values()} == {"exp"}


def test_a_ledger_with_runs_by_job_name_is_migrated_to_runs_by_root(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (job VARCHAR(255) PRIMARY KEY, owner VARCHAR(255) NOT NULL, stage VARCHAR(16) "
                "NOT NULL, record TEXT NOT NULL, updated_at FLOAT NOT NULL)")
    rec = _rec("old", "file:///data/old/ckpt").model_copy(update={"owner": "h:1", "updated_at": 5.0})
    con.execute("INSERT INTO runs VALUES ('old', 'h:1', 'reported', ?, 5.0)", (rec.model_dump_json(),))
    con.commit()
    con.close()
    led = Ledger(str(path))
    assert led.run("old", "file:///data/old/ckpt") == rec
    led.record_run(_rec("new", "file:///data/new/ckpt"))
    assert [r.job for r in Ledger(str(path)).runs()] == ["new", "old"]  # opened again: not copied twice


def test_a_sqlite_ledger_file_deleted_or_replaced_is_seen_by_the_ledger_that_opened_it(tmp_path):
    """Red team 41g S13: the ledger file deleted while a job held GPUs in it went unnoticed (the open connection kept
    reading the deleted file). `vanished` compares the file at the path with the one opened."""
    path = tmp_path / "l.db"
    led = Ledger(str(path))
    assert led.vanished() is None  # the control: the same file
    path.unlink()
    assert led.vanished() == (f"the ledger file {path} was deleted while this process used it: its allocations, "
                              "queue and run records are gone from that path")


def test_a_hand_release_under_a_running_trainer_holds_its_gpus_until_the_trainer_stops(url):
    """Red team 41p S12a: `Ledger.release(id)` by hand while the trainer ran placed the next queued job on the same
    GPUs at once, while the trainer stepped ~2 s more. Now an allocation a trainer renews (`renew(holder=)`) is only
    marked `releasing`: its GPUs stay held, the trainer's next renewal fails (it stops, commits, exits), and its own
    release (`by_holder`) frees them and places the queue; one with no trainer is freed at once, as before."""
    from tasks.training.allocation import lost_cause, release_at_end, released_by_hand
    from tasks.training.request import AllocationHold

    led = Ledger(url)
    a = led.allocate("alice", [GpuRequest(10, 10)], lease_s=60)  # every GPU of SMALL
    assert led.renew(a.id, 60, holder="trainer pid 1 on h") is True
    led.submit("bob", [GpuRequest(1, 10)])
    assert led.release(a.id) == []  # by hand: nothing placed on GPUs the trainer still uses
    assert led.allocation(a.id).state == "releasing" and led.queue_status("bob").state == "waiting"
    assert [(x.id, x.state) for x in led.allocations()] == [(a.id, "releasing")]  # shown: it holds the GPUs
    assert led.allocate("carol", [GpuRequest(1, 10)]) is None
    assert led.renew(a.id, 60, holder="trainer pid 1 on h") is False  # the trainer stops at its next step
    cause = lost_cause(led, url, a.id, 60, "this trainer")
    assert f"allocation {a.id} in the ledger {url} was released by hand while its trainer ran" in cause, cause
    hold = AllocationHold(ledger=url, allocation_id=a.id, lease_s=60, release_at_end=True)
    assert release_at_end(hold) == ["bob"]  # the trainer stopped and gave them back itself: now bob
    assert led.allocation(a.id).state == "released" and released_by_hand(a.id)
    assert lost_cause(led, url, a.id, 60, "this trainer") == cause  # what the submitter says after that
    kinds = [e.kind for e in led.events(20) if e.detail.get("allocation") == a.id]
    assert "release-requested" in kinds and "released" in kinds, kinds
    # no trainer renews it: a release by hand frees it at once
    b = led.allocation(next(p.id for p in led.allocations() if p.job == "bob"))
    assert led.release(b.id) == [] and led.allocation(b.id).state == "released"


def test_a_hand_released_allocation_whose_trainer_never_stops_is_freed_when_its_lease_lapses(url):
    """The bounded wait of a release by hand: the trainer renews no more (its renewals fail), so its lease lapses at
    most `lease_s` after its last renewal, and then the GPUs come back (a trainer that died never acknowledges)."""
    led = Ledger(url)
    a = led.allocate("alice", [GpuRequest(10, 10)], lease_s=60)
    led.renew(a.id, 60, holder="trainer pid 1 on h")
    led.submit("bob", [GpuRequest(1, 10)], lease_s=600)  # bob still waits when alice's lease lapses
    led.release(a.id)
    expiry = led.allocation(a.id).lease_expiry
    assert Ledger(url, clock=lambda: expiry - 0.01).schedule() == []  # still inside its lease: still held
    placed = Ledger(url, clock=lambda: expiry + 0.01).schedule()  # lapsed: given back, bob placed
    assert [p.job for p in placed] == ["bob"] and led.allocation(a.id).state == "released"
