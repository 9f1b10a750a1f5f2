"""Frenzy beyond one machine, on Ray: the inventory from a Ray cluster's nodes, an allocation's training ranks as Ray
actors in placement groups pinned to the allocated nodes, and the node check's probe run on the nodes themselves.

Nodes say who they are with two custom resources at `ray start`: `frenzy_node:NAME` (1) names the node (the name
HAS and the ledger use) and `frenzy_gpu:TYPE` (its GPU count) its catalog GPU type, e.g.

    ray start --head --num-gpus 8 --resources '{"frenzy_node:a100-0": 1, "frenzy_gpu:A100-40GB": 8}'

Without them a node is named after its host and node id, and its GPU type comes from Ray's `accelerator_type:`
resource (a node with no GPU is one `cpu` device, as in local discovery). The trainer inside each actor is the same
`tasks.training.loop.train` torchrun runs; ranks form one torch.distributed group (gloo on CPU, NCCL on GPUs) with
rank 0's node as the rendezvous. The run directory (progress, log, result) must be on a filesystem every node sees,
and checkpoints on shared storage (`s3://`, or a shared path).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.catalog import GPUType

# the inventory from Ray (re-exported: callers load `--cluster ray` through either) and the node naming live below
from cluster.inventory import ray_inventory
from cluster.ray_nodes import RayExecutorError, alive_nodes, connect, node_name
from cluster.ray_nodes import node_resource as _node_resource
from tasks.errors import FrenzyError
from tasks.paths import resolve_job

if TYPE_CHECKING:
    from tasks.training.progress import ProgressRecord
    from tasks.training.request import AllocationHold, TrainerResult


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------ training ranks

class _Rank:
    """One training rank: the trainer of tasks/training/loop.py in this actor's process, its output appended to the
    run's train.log (where the failure diagnosis reads it)."""

    def address(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    def pid(self) -> int:
        return os.getpid()

    def run(self, env: dict[str, str], job: dict, run_dir: str, resume: bool, from_scratch: bool, device: str,
            threads: int | None, tp: int) -> dict:
        import logging

        os.environ.update(env)
        log = open(Path(run_dir) / "train.log", "ab", buffering=0)  # noqa: SIM115 - lives as long as the rank
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                            format=f"%(asctime)s [rank {env['RANK']}] %(levelname)s %(name)s: %(message)s")
        from tasks.errors import user_message
        from tasks.jobspec import parse_job
        from tasks.training.launch import _ERROR_MARK
        from tasks.training.loop import TrainOptions, train

        try:
            res = train(TrainOptions(job=parse_job(job), run_dir=Path(run_dir), resume=resume,
                                     from_scratch=from_scratch, device=device, threads=threads, tp=tp))
            return {"ok": True, "result": res}
        except Exception as err:  # noqa: BLE001 - a user's error is one line, a bug its traceback (below)
            msg = user_message(err)
            if msg is None:
                traceback.print_exc()
                return {"ok": False, "error": f"{type(err).__name__}: {err}", "user_error": False}
            print(f"{_ERROR_MARK}{msg}".replace("\n", " "), file=sys.stderr, flush=True)
            return {"ok": False, "error": msg, "user_error": True}
        except BaseException as err:  # noqa: BLE001 - printed where the diagnosis reads it, then reported
            traceback.print_exc()
            return {"ok": False, "error": f"{type(err).__name__}: {err}", "user_error": False}
        finally:
            with contextlib.suppress(Exception):
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()


@dataclass
class _Ranks:
    """A launch in progress: the placement groups, the rank actors [(actor, node, rank, local rank, node's ranks)]
    and the running trainers {ref: (actor, node, rank)}."""

    pgs: list[Any] = field(default_factory=list)
    actors: list[tuple[Any, str, int, int, int]] = field(default_factory=list)
    refs: dict[Any, tuple[Any, str, int]] = field(default_factory=dict)


def _fail(log_path: Path, msg: str, rc: int = 1, said: str | None = None) -> Exception:
    """TrainFailed (saying `said`, else `msg`) after writing `msg` to the run's log, where the diagnosis reads it."""
    from tasks.training.launch import TrainFailed

    with open(log_path, "a") as lf:
        lf.write(msg + "\n")
    return TrainFailed(f"{said or msg}; log: {log_path}", rc, log_path.read_text(errors="replace")[-4000:])


def _reserve(ray: Any, ranks: _Ranks, name: str, placement: Sequence[tuple[str, int]], gpus: bool, timeout_s: float,
             log_path: Path) -> None:
    """One STRICT_PACK placement group per node (a bundle per rank, pinned by the node's resource), all ready within
    `timeout_s`, else a node fault naming the nodes Ray could not reserve."""
    from ray.util.placement_group import placement_group

    for node, n in placement:
        bundle = {"CPU": 1.0, **_node_resource(node), **({"GPU": 1.0} if gpus else {})}
        ranks.pgs.append(placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK",
                                         name=f"frenzy-{name}-{node}"))
    waits = [pg.ready() for pg in ranks.pgs]  # one reference each: pg.ready() makes a new one on every call
    deadline, ready = time.monotonic() + timeout_s, []
    while len(ready) < len(waits) and time.monotonic() < deadline:
        ready, _ = ray.wait(waits, num_returns=len(waits), timeout=min(2.0, max(0.1, deadline - time.monotonic())))
        alive = set(alive_nodes())
        if gone := [node for node, _ in placement if node not in alive]:  # no use waiting for a node Ray saw die
            # "failed" makes it an error line to the diagnosis (tasks/diagnosis), like Ray's own death messages
            raise _fail(log_path, f"frenzy: node {', '.join(gone)} lost: not alive in Ray (failed to place its ranks)")
    if len(ready) < len(waits):
        missing = [node for (node, _), ref in zip(placement, waits, strict=True) if ref not in ready]
        raise _fail(log_path, f"frenzy: node {', '.join(missing)} unreachable: Ray could not reserve the allocation "
                              f"on {', '.join(missing)} within {timeout_s:.0f} s (the node is hung or busy; see "
                              "`ray status`)")


def _start(ray: Any, ranks: _Ranks, placement: Sequence[tuple[str, int]], gpus: bool, timeout_s: float,
           trainer_args: tuple, threads: int | None, log_path: Path, allocation: AllocationHold | None = None) -> None:
    """A rank actor in each bundle, rank 0's node the rendezvous, every trainer started; rank 0 is handed the
    allocation it renews."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from tasks.training.allocation import ENV as ALLOCATION_ENV

    rank_actor = ray.remote(max_restarts=0)(_Rank)
    for (node, n), pg in zip(placement, ranks.pgs, strict=True):
        for i in range(n):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
            a = rank_actor.options(num_cpus=1, num_gpus=1 if gpus else 0, scheduling_strategy=strategy).remote()
            ranks.actors.append((a, node, len(ranks.actors), i, n))
    try:
        master, port = ray.get(ranks.actors[0][0].address.remote(), timeout=timeout_s)
    except Exception as err:  # noqa: BLE001 - GetTimeoutError or the actor died: rank 0's node is the suspect
        raise _fail(log_path, f"frenzy: node {placement[0][0]} unreachable: rank 0 did not start within "
                              f"{timeout_s:.0f} s ({type(err).__name__})") from None
    world = len(ranks.actors)
    for a, node, r, local, n in ranks.actors:
        env = {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(n),
               "MASTER_ADDR": master, "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads or 1),
               "PYTHONUNBUFFERED": "1", "FRENZY_NODE": node}
        if allocation is not None and r == 0:
            env[ALLOCATION_ENV] = allocation.model_dump_json()
        ranks.refs[a.run.remote(env, *trainer_args)] = (a, node, r)


def _outcome(ray: Any, ranks: _Ranks, ref: Any, log_path: Path, loss_grace_s: float) -> TrainerResult:
    """A finished trainer's result, or the TrainFailed it stands for: a dead actor is its node lost (suspect at
    once), a collective error names the peer that died when there is one, a user error keeps exit status 2."""
    from tasks.training.launch import TrainFailed

    a, node, r = ranks.refs[ref]
    try:
        out = ray.get(ref)
    except Exception as err:  # noqa: BLE001 - RayActorError & co: the rank's process or node is gone
        raise _fail(log_path, f"frenzy: node {node} lost: rank {r}'s actor died ({type(err).__name__})") from None
    if not out["ok"] and not out["user_error"]:
        # a collective error is most often a peer that died: name its node, once Ray knows it is gone
        lost = _dead_peer(ray, [(x, n_, r_) for x, n_, r_ in ranks.refs.values() if r_ != r], loss_grace_s)
        if lost is not None:
            raise _fail(log_path, f"frenzy: node {lost[0]} lost: rank {lost[1]}'s actor died; rank {r} on {node} "
                                  f"saw {out['error'].splitlines()[0][:200]}")
    if not out["ok"]:
        text = log_path.read_text(errors="replace")
        raise TrainFailed(out["error"] if out["user_error"] else
                          f"rank {r} on {node} failed: {out['error']}; log: {log_path}", 2 if
                          out["user_error"] else 1, text[-4000:])
    return out["result"]


def _prepare(job: Any, run_dir: Path) -> tuple[Any, Path]:
    """The job with absolute paths, recorded in a fresh run directory (stale result, stop and kill files gone)."""
    from tasks.training.launch import KILL_FILE, STOP_FILE

    job = resolve_job(job, Path.cwd(), run_dir.absolute())  # ranks run in the Ray workers' directories
    run_dir = run_dir.absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("result.json", STOP_FILE, KILL_FILE):
        (run_dir / name).unlink(missing_ok=True)
    (run_dir / "job.json").write_text(job.model_dump_json(indent=1))
    return job, run_dir


def launch_ray(job: Any, placement: Sequence[tuple[str, int]], run_dir: Path, *, resume: bool = False,
               from_scratch: bool = False, device: str = "cpu", threads: int | None = None, tp: int = 1,
               on_record: Callable[[ProgressRecord], None] | None = None, poll_s: float = 0.5, address: str | None = None,
               gpus: bool = False, place_timeout_s: float = 120.0, loss_grace_s: float = 60.0,
               allocation: AllocationHold | None = None) -> TrainerResult:
    """Train `job` with `placement` [(node, ranks)] as Ray actors, one placement group (STRICT_PACK, one bundle per
    rank) pinned to each node; returns rank 0's result record like `launch()`. A rank that dies (its node lost)
    fails the whole group at once (every actor is killed, `frenzy: node X lost` goes to the log) with TrainFailed,
    so the recovery policy can diagnose, settle the node's fate (cluster/ray_health.py) and resume. A node that
    cannot be reserved is a node fault too (`frenzy: node X unreachable`). `request_stop(run_dir)` stops it as it
    stops `launch()`: the ranks see the stop file at the next step boundary, commit that step and return. Rank 0
    renews `allocation`'s lease while it trains, as `launch()`'s does (tasks/training/allocation.py)."""
    from tasks.training.launch import KILL_FILE, _tail

    world = sum(n for _, n in placement)
    if world < 1 or world % tp:
        raise FrenzyError(f"{world} ranks and tp={tp}: tp must divide the ranks")
    ray = connect(address)
    job, run_dir = _prepare(job, run_dir)
    progress, log_path = run_dir / "progress.jsonl", run_dir / "train.log"
    offset = progress.stat().st_size if progress.exists() else 0
    ranks = _Ranks()
    try:
        _reserve(ray, ranks, job.name, placement, gpus, place_timeout_s, log_path)
        _start(ray, ranks, placement, gpus, place_timeout_s,
               (job.model_dump(mode="json"), str(run_dir), resume, from_scratch, device, threads, tp), threads,
               log_path, allocation)
        results: dict[int, TrainerResult] = {}
        pending = list(ranks.refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=poll_s)
            offset = _tail(progress, offset, on_record)
            for ref in done:
                results[ranks.refs[ref][2]] = _outcome(ray, ranks, ref, log_path, loss_grace_s)
            if (run_dir / KILL_FILE).exists():
                reason = (run_dir / KILL_FILE).read_text(errors="replace").strip()
                raise _fail(log_path, f"frenzy-hang: {reason}", -9, f"trainer killed: {reason}")
        _tail(progress, offset, on_record)
        return results[0]
    finally:
        _teardown(ray, ranks)


def _teardown(ray: Any, ranks: _Ranks) -> None:
    from ray.util.placement_group import remove_placement_group

    for a, *_ in ranks.actors:
        with contextlib.suppress(Exception):
            ray.kill(a, no_restart=True)
    for pg in ranks.pgs:
        with contextlib.suppress(Exception):
            remove_placement_group(pg)


def _dead_peer(ray: Any, peers: list[tuple[Any, str, int]], grace_s: float) -> tuple[str, int] | None:
    """(node, rank) of a peer whose actor is dead, asking each for its pid for up to `grace_s` (the time Ray takes
    to declare a lost node dead); None when every peer answers."""
    refs = {a.pid.remote(): (node, r) for a, node, r in peers}
    pending, deadline = list(refs), time.monotonic() + grace_s
    while pending and time.monotonic() < deadline:
        done, pending = ray.wait(pending, num_returns=1, timeout=max(0.1, deadline - time.monotonic()))
        for ref in done:
            try:
                ray.get(ref)
            except Exception:  # noqa: BLE001 - RayActorError: the actor (its node) is gone
                return refs[ref]
    return None


# ------------------------------------------------------------------------------------------------ node check

def _probe_member(cfg: dict, env: dict[str, str], limit_s: float) -> dict:
    """One node's part of a node check group (a Ray task on that node): the collective worker as a process."""
    import subprocess

    from cluster.nodecheck import _WORKER

    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(cfg)], capture_output=True, text=True,
                           timeout=limit_s, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {cfg['timeout']:.0f} s", "hung": True}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(cfg["ready"])  # the worker's start mark (the local probe waits on it; here unused)
    if p.returncode:
        tail = p.stderr.strip().splitlines()
        return {"ok": False, "error": f"{cfg['node']}: exit {p.returncode}: {tail[-1] if tail else ''}"}
    return {"ok": True, "seconds": json.loads(p.stdout.strip().splitlines()[-1])["seconds"],
            "wall_s": time.monotonic() - t0}


def _group_results(ray: Any, refs: list, group: Sequence[str], deadline: float) -> dict:
    """The members' results as they finish; the first failure ends the wait (its peers would only wait for it until
    their timeout) and the members still running are cancelled."""
    pending, outs = list(refs), {}
    while pending and time.monotonic() < deadline:
        done, pending = ray.wait(pending, num_returns=1, timeout=max(0.1, deadline - time.monotonic()))
        for ref in done:
            try:
                outs[ref] = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - the node died under the task
                outs[ref] = {"ok": False, "error": f"{group[refs.index(ref)]}: {type(err).__name__}"}
            if not outs[ref]["ok"]:
                pending = []
                break
    for ref in refs:
        if ref not in outs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
    return outs


def ray_probe(probe_mb: int = 16, timeout_s: float = 30.0, startup_s: float = 120.0, backend: str = "gloo",
              address: str | None = None) -> Callable[[Sequence[str]], Any]:
    """The node check's probe (cluster/nodecheck.py) with one process on each named Ray node itself: a Ray task
    pinned to the node by its `frenzy_node:` resource runs the same collective worker; rank 0's node is the
    rendezvous. A member that fails fails its group at once."""
    import tempfile

    from cluster.nodecheck import GroupRun

    ray = connect(address)

    @ray.remote(num_cpus=0, max_retries=0)
    def where() -> tuple[str, int]:
        return ray.util.get_node_ip_address(), _free_port()

    member = ray.remote(num_cpus=0, max_retries=0)(_probe_member)
    fault_env = {k: v for k, v in os.environ.items() if k.startswith("FRENZY_NODECHECK_")}

    def run(group: Sequence[str]) -> GroupRun:
        try:
            master, port = ray.get(where.options(resources=_node_resource(group[0])).remote(), timeout=startup_s)
        except Exception as err:  # noqa: BLE001 - the node is gone or cannot run a task
            return GroupRun(nodes=list(group), ok=False, seconds=timeout_s, error=f"{group[0]}: {type(err).__name__}")
        marks = tempfile.gettempdir()
        refs = [member.options(resources=_node_resource(n)).remote(
            {"node": n, "rank": i, "world": len(group), "port": port, "master": master, "probe_mb": probe_mb,
             "timeout": timeout_s, "backend": backend, "ready": os.path.join(marks, f"frenzy-nc-{n}-{port}.ready")},
            fault_env, startup_s + timeout_s) for i, n in enumerate(group)]
        outs = _group_results(ray, refs, group, time.monotonic() + startup_s + timeout_s + 10)
        bad = [o for o in outs.values() if not o["ok"]]
        if bad or len(outs) < len(refs):
            err = bad[0]["error"] if bad else f"timed out after {timeout_s:.0f} s"
            return GroupRun(nodes=list(group), ok=False, seconds=timeout_s, error=err)
        return GroupRun(nodes=list(group), ok=True, seconds=max(o["seconds"] for o in outs.values()))

    return run




# ------------------------------------------------------------------------------------------------ node processes

def _on_alive(node: str, address: str | None) -> Any:
    """Ray, once `node` is known alive: a task pinned to a node that is not there would wait for ever."""
    ray = connect(address)
    if node not in (alive := alive_nodes(address)):
        raise RayExecutorError(f"Ray node {node!r} is not alive in the cluster (alive: {', '.join(alive) or 'none'}); "
                               "pick another with --ray-nodes, or start it with --resources "
                               f"'{{\"frenzy_node:{node}\": 1}}'")
    return ray


def node_process(node: str, module: str, spec: dict, env: dict[str, str], address: str | None = None
                 ) -> tuple[Any, Callable[[], None]]:
    """Run `python -m module SPEC.json` on the Ray node `node` (a streaming Ray task pinned by its `frenzy_node:`
    resource): returns (an iterator of its stdout lines, then one final `{"rc", "stderr"}` dict; a cancel function).
    The spec travels with the task, so the node needs no shared directory for it. Evaluation trials, precursors and
    their preloads run this way, so each node's shared memory is its own."""
    ray = _on_alive(node, address)

    def run(module: str, spec: dict, env: dict[str, str]):  # noqa: ANN202 - a Ray streaming generator
        import subprocess
        import tempfile

        with tempfile.TemporaryDirectory(prefix="frenzy-node-") as d:
            path = Path(d) / "spec.json"
            path.write_text(json.dumps(spec))
            p = subprocess.Popen([sys.executable, "-m", module, str(path)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
            err: list[str] = []
            th = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
            th.start()
            try:
                for line in p.stdout:  # noqa: UP028 - not `yield from`: Ray drives the generator with send()
                    yield line
                rc = p.wait()
            finally:
                if p.poll() is None:
                    p.kill()
            th.join(timeout=5)
            yield {"rc": rc, "stderr": "".join(err)[-4000:]}

    task = ray.remote(num_returns="streaming", num_cpus=0, max_retries=0)(run)
    gen = task.options(resources=_node_resource(node)).remote(module, spec, env)

    def lines():  # noqa: ANN202
        for ref in gen:
            yield ray.get(ref)

    def cancel() -> None:
        with contextlib.suppress(Exception):
            ray.cancel(gen, force=True)

    return lines(), cancel


def node_call(node: str, fn: Callable[..., Any], *args: Any, address: str | None = None, num_cpus: float = 1.0
              ) -> Any:
    """`fn(*args)` as a Ray task on `node` taking `num_cpus` of its CPUs (an evaluation's metric job)."""
    ray = _on_alive(node, address)
    return ray.get(ray.remote(num_cpus=num_cpus, max_retries=0)(fn).options(resources=_node_resource(node))
                   .remote(*args))


# ------------------------------------------------------------------------------------------------ shared paths

SHARED_MARK = ".frenzy-shared-"


def sees_marks(marks: list[tuple[str, str, str]]) -> list[str]:
    """On a node: for each (directory, mark file name, token) whether this node sees the submitting side's mark with
    its token (the same directory, not a node-local one of the same name) and can create a file there; the problems,
    one per directory."""
    import uuid as _uuid

    problems = []
    for folder, name, token in marks:
        mark = Path(folder) / name
        try:
            if mark.read_text() != token:
                problems.append(f"{folder}: another directory of that name (the mark file holds another token)")
                continue
            probe = Path(folder) / f"{SHARED_MARK}{_uuid.uuid4().hex}.probe"
            probe.write_text("x")
            probe.unlink()
        except FileNotFoundError:
            problems.append(f"{folder}: not the submitting side's directory (its mark file is not there)")
        except OSError as err:
            problems.append(f"{folder}: {err.strerror or err}")
    return problems


def check_shared_paths(nodes: Sequence[str], folders: Sequence[str | Path], address: str | None = None,
                       timeout_s: float = 60.0) -> None:
    """Every node of a Ray run must read and write the same run and history directories as the submitting side:
    each directory gets a mark file with a fresh token, and a task pinned to each node checks it sees that token
    and can write beside it. Raises RayExecutorError naming every node and directory that fails, and the fix."""
    import uuid as _uuid

    marks = []
    for folder in dict.fromkeys(str(Path(f).absolute()) for f in folders):
        Path(folder).mkdir(parents=True, exist_ok=True)
        name, token = f"{SHARED_MARK}{_uuid.uuid4().hex}", _uuid.uuid4().hex
        (Path(folder) / name).write_text(token)
        marks.append((folder, name, token))
    try:
        ray = connect(address)
        alive = alive_nodes(address)
        task = ray.remote(num_cpus=0, max_retries=0)(sees_marks)
        refs = {n: task.options(resources=_node_resource(n)).remote(marks) for n in nodes if n in alive}
        bad = []
        for n, ref in refs.items():
            try:
                bad += [f"{n} cannot use {p}" for p in ray.get(ref, timeout=timeout_s)]
            except Exception as err:  # noqa: BLE001 - a node that cannot answer cannot be trusted with the run
                bad.append(f"{n} did not answer the check within {timeout_s:.0f} s ({type(err).__name__})")
    finally:
        for folder, name, _ in marks:
            (Path(folder) / name).unlink(missing_ok=True)
    if bad:
        raise RayExecutorError("the nodes of this run do not share its directories: " + "; ".join(bad) + ". Put "
                               "--run-dir and --history-dir on storage every node mounts at the same path (NFS), "
                               "and checkpoint to s3:// or such a path")


__all__ = ["GPUType", "RayExecutorError", "alive_nodes", "check_shared_paths", "connect", "launch_ray", "node_call", "node_name",
           "node_process", "ray_inventory", "ray_probe"]
