"""`Echo`, the evaluation tests' dataset plugin (`tests.evalplugin:Echo`), in a module of its own.

Each trial and metric process of an evaluation that names it imports this module: here that costs the datasets module
alone (no torch, pytest nor the runner), where a test file as the plugin's home made every metric process import
torch and the evaluation stack first (about 4 s of CPU per process on this 2-core machine; benchmarks/results/
test_suite.md). Its options make a trial or metric job fail the ways the isolation tests need."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tasks.evaluation.datasets import EvalDataset, register_dataset


@register_dataset("echo")
class Echo(EvalDataset):  # a user dataset registered by decorator
    name, mode = "echo", "gen"

    def __len__(self):
        return 4

    def example(self, i):
        if self.options.get("no_id"):  # red team 41p S3: `id` is optional
            return {"prompt": f"x{i}"}
        if odd := self.options.get("odd_id"):  # red team 41q X8: ids that JSON cannot write, or writes loosely, or twice
            return {"id": {"bytes": f"q{i}".encode(), "set": {i}, "nan": float("nan"), "same": "same"}[odd],
                    "prompt": f"x{i}"}
        return {"id": i, "prompt": f"x{i}"}

    def infer(self, lm, ex):
        if self.options.get("explode"):
            raise RuntimeError("inference exploded")
        if self.options.get("oom_killed"):  # as the kernel's out-of-memory killer ends a process
            os.kill(os.getpid(), signal.SIGKILL)
        if self.options.get("kill_group"):  # red team 41k B6: a plugin that kills its own process group
            os.killpg(os.getpgid(0), signal.SIGKILL)
        if self.options.get("hang_in"):  # a trial that runs until it is stopped, with a child process of its own
            hang(self.options["hang_in"])
        return {"text": lm.generate(ex["prompt"], 4)}

    def score(self, ex, prediction):
        if self.options.get("score_kills_group"):  # red team 41l: a metric job that kills its own process group
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return {"length": float(len(prediction["text"]))}


def hang(announce: str) -> None:
    """Start a child that waits for a signal, say `TRIAL_PID CHILD_PID` in the file `announce`, then wait for one."""
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    tmp = f"{announce}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(tmp, announce)
    while True:
        signal.pause()
