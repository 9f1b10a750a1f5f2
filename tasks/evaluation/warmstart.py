"""Processes an evaluation starts before its own imports (no torch here, so it is cheap to import first).

`frenzy evaluate` spends its first seconds importing (torch, the pipeline's modules, lm-eval) on one core while the
other is idle. `start_precursor` starts the first node's precursor process at once, as a warm trial process
(`python -m tasks.evaluation.trial --warm`): it imports torch beside the command's own imports and then waits for its
spec. The runner adopts it (`take_precursor`) for node 0's precursor, so the model copy, and the trial processes
started after it, are ready sooner. An early process nobody adopts is killed when the command exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tasks.procs import PARENT_ENV


@dataclass
class Warm:
    """A started trial process waiting for its spec's path on stdin, and the file its stderr goes to so far."""

    proc: subprocess.Popen
    log: IO
    log_path: Path

    def hand(self, spec_path: Path, log_path: Path, relog: bool) -> None:
        """Give it its spec. With `relog`, its log so far is copied to `log_path` and the process moves its stderr
        there itself (its first log was outside the evaluation's directory); else its log file is renamed there."""
        if relog:
            shutil.copyfile(self.log_path, log_path)
            self.proc.stdin.write(f"{spec_path}\t{log_path}\n")
        else:
            os.replace(self.log_path, log_path)
            self.proc.stdin.write(f"{spec_path}\n")
        self.proc.stdin.close()
        if relog:
            self.log_path.unlink(missing_ok=True)

    def retire(self) -> None:
        kill_group(self.proc)
        self.proc.wait()
        self.log.close()
        self.log_path.unlink(missing_ok=True)


def _trial_env(device: str, gpu: int) -> dict:
    """The environment of a trial or precursor process on GPU slot `gpu`: one OpenMP thread (a trial sets its own
    torch threads), that GPU only, and this checkout first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    env["OMP_NUM_THREADS"] = "1"
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def popen_trial(arg: str, device: str, gpu: int, log: IO) -> subprocess.Popen:
    """`python -m tasks.evaluation.trial ARG` on slot `gpu` (ARG: a spec's path, `--warm`: then it reads the path on
    stdin, or `--metrics`: metric jobs on stdin), its stdout a pipe of events, its stderr to `log`. In a session
    (process group) of its own, so a dataset that signals its own group ends only its trial (red team 41k B6); it dies
    with this process (`tasks.procs.die_with_parent`), and this process's Ctrl-C or end stops it (the runner's
    `close`)."""
    env = _trial_env(device, gpu) | {PARENT_ENV: str(os.getpid())}
    return subprocess.Popen([sys.executable, "-m", "tasks.evaluation.trial", arg], stdout=subprocess.PIPE,
                            stderr=log, stdin=subprocess.PIPE if arg in ("--warm", "--metrics") else None, text=True,
                            env=env, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a trial process and its process group (what it started), unless it has been waited for already."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def spawn_warm(device: str, gpu: int, log_path: Path) -> Warm:
    """A warm trial process for slot `gpu`, its stderr to `log_path`."""
    log = open(log_path, "w")  # noqa: SIM115 - closed when the process is handed on or retired
    return Warm(popen_trial("--warm", device, gpu, log), log, log_path)


_EARLY: list[Warm] = []
_TRIAL: list[Warm] = []
_LOCK = threading.Lock()
_AT_EXIT: list[bool] = []


def _start_early(into: list[Warm], device: str, what: str) -> None:
    with _LOCK:
        if into:
            return
        fd, name = tempfile.mkstemp(prefix=f"frenzy-{what}-", suffix=".stderr")
        os.close(fd)
        into.append(spawn_warm(device, 0, Path(name)))
        if not _AT_EXIT:
            _AT_EXIT.append(True)
            atexit.register(discard_precursor)


def start_precursor(device: str) -> None:
    """Start node 0's precursor process now (once per process), before the caller's heavy imports."""
    _start_early(_EARLY, device, "precursor")


def start_trial(device: str) -> None:
    """Start a process for node 0's first trial slot now (once, until an evaluation takes it): the in-flow evaluator
    starts one, with a precursor, while the evaluation before the next one finishes, so that the next evaluation's
    processes do not begin with torch's import."""
    _start_early(_TRIAL, device, "trial")


def take_precursor() -> Warm | None:
    """The early precursor process, once (None when none was started, or it was taken)."""
    with _LOCK:
        return _EARLY.pop() if _EARLY else None


def take_trial() -> Warm | None:
    """The early trial process, once (None when none was started, or it was taken)."""
    with _LOCK:
        return _TRIAL.pop() if _TRIAL else None


def discard_precursor() -> None:
    """Kill the early precursor and trial processes if nobody took them (the evaluation failed before, or was not
    needed)."""
    while (w := take_precursor() or take_trial()) is not None:
        w.retire()


def start_next(device: str) -> None:
    """Start the next evaluation's node-0 precursor and first trial process now (each unless one waits already)."""
    start_precursor(device)
    start_trial(device)

