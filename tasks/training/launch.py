"""Launch the trainer as its own process tree (torchrun for several ranks) and follow its progress.

The CLI and the Prefect task both call `launch()`: it writes the job to the run directory, starts
`python -m tasks.training.launch` (one rank) or `torch.distributed.run` (several), tails
`progress.jsonl` and hands every record to a callback while the ranks run, and returns `result.json`.
The child's stdout is sent to stderr so a `--json` caller's stdout stays one JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.errors import FrenzyError
from tasks.jobspec import JobSpec, parse_job, tp_misfit
from tasks.paths import resolve_job
from tasks.training.progress import ProgressRecord, progress_record
from tasks.training.writer import ORPHAN_GRACE_S

if TYPE_CHECKING:
    from tasks.training.request import AllocationHold, TrainerResult

_ERROR_MARK = "frenzy-train-error: "


class TrainFailed(FrenzyError, RuntimeError):
    """The trainer exited with an error; carries the exit code and the tail of its log."""

    def __init__(self, msg: str, returncode: int, log_tail: str) -> None:
        super().__init__(msg)
        self.returncode, self.log_tail = returncode, log_tail


STOP_FILE = "stop"
"""A file of this name in the run directory asks the trainer to commit its current step and exit (how a flow stops
training cleanly, e.g. on a lost lease or a cancellation); the loop checks for it every step."""


def default_threads(nproc: int) -> int:
    """torch threads per rank: the cores this process may use, less one left for the checkpoint persist, the
    data loader and the launcher (on a busy host, ranks that take every core make their own steps erratic)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, (cores - 1) // nproc) if cores > 1 else 1


def default_run_dir(job: JobSpec) -> Path:
    return Path("runs") / job.name


KILL_FILE = "kill"
"""A file of this name asks `launch()` to kill the trainer tree at once (a hang: it cannot commit); its text is the
reason, written to the log as a `frenzy-hang:` line for the diagnosis."""


def request_kill(run_dir: Path, reason: str) -> None:
    """Kill a hung trainer: `launch()` on `run_dir` kills its tree, logs `frenzy-hang: REASON` and fails."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / KILL_FILE).write_text(reason)


def request_stop(run_dir: Path) -> None:
    """Ask a running trainer on `run_dir` to stop: every rank sees the file at its next step boundary, commits that
    step and exits 0 (no signal: one that lands while a finished trainer shuts down would kill it, and the stop
    would read as a failure)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STOP_FILE).write_text(str(time.time()))


def _libc() -> object | None:
    """libc, loaded in the parent: loading a library in a child forked from a threaded process can deadlock."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _die_with(libc: object | None, parent: int) -> Callable[[], None]:
    def child() -> None:
        """In the child before exec: get SIGTERM when the thread that launched us dies (Linux), so a killed
        `frenzy train` or flow process does not leave its trainers running and writing checkpoints."""
        if libc is not None:
            with contextlib.suppress(Exception):
                libc.prctl(1, signal.SIGTERM)  # type: ignore[attr-defined]  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)
        os.setsid()  # its own session too: on cancellation the whole tree (torchrun and every rank) is stopped

    return child


def launch(job: JobSpec, run_dir: Path | None = None, nproc: int = 1, resume: bool = False, from_scratch: bool = False,
           device: str = "auto", threads: int | None = None, stop_after_steps: int | None = None, tp: int = 1,
           on_record: Callable[[ProgressRecord], None] | None = None, poll_s: float = 0.5,
           gpu_indices: list[int] | None = None, discard_checkpoints: bool = False,
           allocation: AllocationHold | None = None) -> TrainerResult:
    """Train `job` on this machine with `nproc` ranks; returns the result record of rank 0 (its result.json).

    `gpu_indices` (an allocation's GPUs on this node) become `CUDA_VISIBLE_DEVICES`, one rank per GPU; rank 0
    renews `allocation`'s lease while it trains (tasks/training/allocation.py)."""
    nproc = check_launch(job, run_dir, nproc, tp, device, gpu_indices)
    run_dir = (run_dir or default_run_dir(job)).absolute()
    job = resolve_job(job, Path.cwd(), run_dir)  # what the caller left relative is relative to here (idempotent)
    run_dir.mkdir(parents=True, exist_ok=True)
    job_path = run_dir / "job.json"
    job_path.write_text(job.model_dump_json(indent=1))
    for stale in ("result.json", STOP_FILE, KILL_FILE):
        (run_dir / stale).unlink(missing_ok=True)
    progress = run_dir / "progress.jsonl"
    offset = progress.stat().st_size if progress.exists() else 0
    args = ["--job", str(job_path), "--run-dir", str(run_dir), "--device", device, "--tp", str(tp)]
    args += [flag for flag, on in (("--resume", resume), ("--from-scratch", from_scratch),
                                   ("--discard-checkpoints", discard_checkpoints)) if on]
    if threads:
        args += ["--threads", str(threads)]
    if stop_after_steps is not None:
        args += ["--stop-after-steps", str(stop_after_steps)]
    rank_cmd = ["-m", "tasks.training.launch", *args]
    cmd = [sys.executable, *(["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
                             if nproc > 1 else []), *rank_cmd]
    log_path = run_dir / "train.log"
    with open(log_path, "ab") as logf:
        log_start = logf.tell()  # this launch's part of the log: an earlier run's error is not this one's
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=_rank_env(nproc, threads, gpu_indices, allocation),
                                preexec_fn=_die_with(_libc(), os.getpid()))  # noqa: PLW1509
        try:
            _follow(proc, run_dir, offset, on_record, poll_s)
        except BaseException:
            _stop_tree(proc)
            raise
    if proc.returncode != 0:
        raise _failure(proc.returncode, log_path, log_start)
    from tasks.training.request import TrainerResult  # it imports torch (the checkpoint record): not before training

    return TrainerResult.model_validate(json.loads((run_dir / "result.json").read_text()))


def check_launch(job: JobSpec, run_dir: Path | None, nproc: int, tp: int, device: str, gpu_indices: list[int] | None) -> int:
    """The launch's arguments, checked before anything starts; returns the rank count (one per GPU given)."""
    if gpu_indices:
        if nproc not in (1, len(gpu_indices)):
            raise FrenzyError(f"nproc={nproc} but the allocation holds {len(gpu_indices)} GPUs; one rank per GPU")
        nproc = len(gpu_indices)
    run_dir = (run_dir or default_run_dir(job)).absolute()
    if run_dir.exists() and not run_dir.is_dir():
        raise FrenzyError(f"run directory {run_dir} is a file; give a directory (--run-dir)")
    if nproc < 1 or tp < 1 or nproc % tp:
        raise FrenzyError(f"nproc={nproc} and tp={tp}: both must be >= 1 and tp must divide nproc")
    from tasks.training.storage import check_scheme

    if job.training.checkpoint.uri:
        check_scheme(job.training.checkpoint.uri)
    misfit = tp_misfit(job, tp)
    if misfit:  # before any rank starts: a rank would find it after seconds of start-up
        raise FrenzyError(misfit)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise FrenzyError("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False); "
                             "use --device cpu, or auto to take a GPU when there is one")
    return nproc


def _rank_env(nproc: int, threads: int | None, gpu_indices: list[int] | None,
              allocation: AllocationHold | None = None) -> dict[str, str]:
    # the ranks also watch their parent (a second guard beside PDEATHSIG): reparented means orphaned, so stop
    # FRENZY_LAUNCHER_PID: the writer lease records it, so a --resume can tell an orphan of this launcher
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FRENZY_WATCH_PARENT": "1", "FRENZY_LAUNCHER_PID": str(os.getpid())}
    env.pop("FRENZY_ALLOCATION", None)  # only the allocation this launch was given
    if allocation is not None:
        env["FRENZY_ALLOCATION"] = allocation.model_dump_json()
    if gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_indices)
    env.setdefault("OMP_NUM_THREADS", str(threads or default_threads(nproc)))
    return env


def _follow(proc: subprocess.Popen, run_dir: Path, offset: int, on_record: Callable[[ProgressRecord], None] | None,
            poll_s: float) -> None:
    """Hand every progress record to `on_record` until the trainer exits; a kill file (a hang) kills it."""
    progress, log_path = run_dir / "progress.jsonl", run_dir / "train.log"
    while True:
        done = proc.poll() is not None
        offset = _tail(progress, offset, on_record)
        if done:
            return
        if (run_dir / KILL_FILE).exists():
            reason = (run_dir / KILL_FILE).read_text(errors="replace").strip()
            _stop_tree(proc, grace_s=5.0)
            with open(log_path, "a") as lf:
                lf.write(f"frenzy-hang: {reason}\n")
            raise TrainFailed(f"trainer killed: {reason}; log: {log_path}", proc.returncode or -9,
                              log_path.read_text(errors="replace")[-4000:])
        time.sleep(poll_s)


def _failure(returncode: int, log_path: Path, log_start: int = 0) -> TrainFailed:
    """The error of a trainer that exited non-zero: its marked one-line message when it printed one in this
    launch's part of the log (from byte `log_start`)."""
    if returncode < 0:  # killed by a signal: say so in the log, where the diagnosis reads it
        with open(log_path, "a") as lf:
            lf.write(f"frenzy: trainer exited with signal {-returncode} ({signal.Signals(-returncode).name})\n")
    with open(log_path, "rb") as f:
        f.seek(log_start)
        text = f.read().decode(errors="replace")
    marked = [ln[len(_ERROR_MARK):] for ln in text.splitlines() if ln.startswith(_ERROR_MARK)]
    if marked:  # a rank's user error (its exit 2), which torchrun reports as its own exit 1
        return TrainFailed(marked[-1], 2 if returncode > 0 else returncode, text[-4000:])
    from tasks.errors import NO_MEMORY, memory_problem

    starved = next((ln for ln in reversed(text.splitlines()[-20:])  # where an abort's last words are
                    if any(w in ln.lower() for w in NO_MEMORY) and "cuda" not in ln.lower()), None)
    if starved is not None:  # a rank refused memory before Python could say so (glibc or OpenBLAS aborting)
        return TrainFailed(str(memory_problem(MemoryError(starved.strip()))), 2, text[-4000:])
    tail = text[-4000:]
    return TrainFailed(f"trainer exited with code {returncode}; log: {log_path}\n{tail[-1500:]}", returncode, tail)


def _stop_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the trainer's process group, SIGKILL it after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, offset: int, on_record: Callable[[ProgressRecord], None] | None) -> int:
    if not path.exists():
        return offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if line.strip() and on_record is not None:
            on_record(progress_record(json.loads(line)))
    return offset + end




def _watch_parent(grace_s: float) -> threading.Thread:
    """A second guard beside PDEATHSIG, from the rank's first line to its last: when the launcher (or torchrun)
    dies, SIGTERM ourselves (the loop commits its step and exits; before the loop that is the default action,
    an immediate exit) and, should that not finish within `grace_s` (a rank stuck in I/O or a collective),
    exit hard. Checkpoints commit atomically, so a hard exit loses at most the step in flight."""
    parent = os.getppid()

    def parent_gone() -> None:
        try:  # an event (the parent's pidfd becomes readable when it exits), not a poll, where Linux has it
            import select

            fd = os.pidfd_open(parent)
            if os.getppid() == parent:
                select.select([fd], [], [])
            os.close(fd)
        except (AttributeError, OSError):
            while os.getppid() == parent:
                time.sleep(0.5)

    def run() -> None:
        parent_gone()
        print(f"frenzy: launcher {parent} died; committing this step and exiting (hard exit in {grace_s:.0f} s)",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        print(f"frenzy: still running {grace_s:.0f} s after the launcher died; exiting now", file=sys.stderr,
              flush=True)
        os._exit(3)

    th = threading.Thread(target=run, name="frenzy-parent-watch", daemon=True)
    th.start()
    return th


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank (run by `launch()` directly or under torchrun)."""
    ap = argparse.ArgumentParser(prog="python -m tasks.training.launch")
    ap.add_argument("--job", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--from-scratch", action="store_true")
    ap.add_argument("--discard-checkpoints", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--stop-after-steps", type=int)
    ap.add_argument("--tp", type=int, default=1)
    a = ap.parse_args(argv)
    if os.environ.get("FRENZY_WATCH_PARENT") == "1":
        _watch_parent(float(os.environ.get("FRENZY_ORPHAN_GRACE_S", ORPHAN_GRACE_S)))
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    from tasks.errors import user_message

    try:  # the imports too: torch refused by a memory limit is the environment's to fix (red team 41i N10)
        from tasks.training.loop import TrainOptions, train

        job = parse_job(json.loads(Path(a.job).read_text()), a.job)
        train(TrainOptions(job=job, run_dir=Path(a.run_dir), resume=a.resume, from_scratch=a.from_scratch,
                           discard_checkpoints=a.discard_checkpoints,
                           device=a.device, threads=a.threads,
                           stop_after_steps=a.stop_after_steps, tp=a.tp))
    except Exception as err:
        msg = user_message(err)  # a problem the user can fix: one line, no traceback, recognised by launch()
        if msg is None:
            raise  # a bug: its traceback in train.log
        print(f"{_ERROR_MARK}{msg}".replace("\n", " "), file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    from tasks.quickexit import exit_now

    exit_now(main())
