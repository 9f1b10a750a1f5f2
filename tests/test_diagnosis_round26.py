"""Issue 45, round 26: the families set 24 showed (benchmarks/results/diagnosis_round26.md).

A. A CUDA driver older than the toolkit that built the PTX (`the provided PTX was compiled with an unsupported
   toolchain`, cudaErrorUnsupportedPtxVersion): the environment, the script's, as the driver-too-old wordings.
B. Ray's raylet reporting a worker's death, with a list of possible causes that names the OOM killer among them:
   the worker's death (infrastructure, the raylet's line), not a host OOM; the driver's ActorDiedError or
   ActorUnavailableError is the same death seen from the other side.
C. A library's assert rejecting what the caller gave it (`Unsupported ...`, `only supports X but Y was given`),
   with or without the library's frame shown: the caller's code, the script's.
D. conda's `CommandNotFoundError: Your shell has not been properly configured to use 'conda activate'` in a batch
   job that then ran into the scheduler's time limit: the shell went on past conda's report; the time limit ended
   the job.
E. A headerless progress row (step, percentage, time, then the loss, no name printed) whose loss column turned
   non-finite where the row above printed a number: the divergence.

Each case is a short synthetic log written here (none is a log of set 24).
"""

from __future__ import annotations

import pytest

from tests.diagnosis_kit import assert_case

HEAD = "epoch 1 | step 200 | loss 2.41 | lr 1e-4\nepoch 1 | step 210 | loss 2.39 | lr 1e-4\n"

_SITE = "/opt/conda/lib/python3.11/site-packages"

# (what the case shows, the log after HEAD, type, category, a piece of the root line, restartable)
CASES = [
    (
        "PTX from a newer toolkit than the driver, in CUDA's runtime words",
        'Traceback (most recent call last):\n  File "/home/u/det/train.py", line 40, in <module>\n'
        "    model.cuda()\n"
        "RuntimeError: CUDA error: the provided PTX was compiled with an unsupported toolchain.\n"
        "CUDA kernel errors might be asynchronously reported at some other API call.\n",
        "DriverError",
        "script",
        "PTX was compiled with an unsupported toolchain",
        False,
    ),
    (
        "the same in the driver API's enum (numba's linker)",
        "numba.cuda.cudadrv.driver.LinkerError: [222] Call to cuLinkAddData results in CUDA_ERROR_UNSUPPORTED_PTX_VERSION\n",
        "DriverError",
        "script",
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        False,
    ),
    (
        "the raylet's report of a dead worker, its possible causes listing the OOM killer",
        "(WorkerDict pid=51822) step 12 done\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
        "(raylet) A worker died or was killed while executing a task by an unexpected system error. Worker exit "
        "type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. Some "
        "common causes include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray "
        "stop --force was called, or (3) the worker crashed unexpectedly due to SIGSEGV.\n",
        "RayError",
        "infrastructure",
        "(raylet) A worker died or was killed",
        True,
    ),
    (
        "a library's assert naming what it supports and what it was given, its frame shown",
        'Traceback (most recent call last):\n  File "/home/u/rl/run.py", line 30, in <module>\n'
        "    agent = SAC(policy, env)\n"
        f'  File "{_SITE}/rlkit/common/base.py", line 118, in __init__\n'
        "    assert isinstance(space, self.supported), msg\n"
        "AssertionError: The agent only supports Box observations but Tuple(Discrete(3), Box(4,)) was given\n",
        "AssertionError",
        "script",
        "AssertionError: The agent only supports Box observations",
        False,
    ),
    (
        "a library's assert rejecting the caller's type, no frame shown",
        "AssertionError: Unsupported observation space: <class 'gymnasium.spaces.graph.Graph'>\n",
        "AssertionError",
        "script",
        "AssertionError: Unsupported observation space",
        False,
    ),
    (
        "conda's activate error in a PBS job that then hit the walltime",
        "\nCommandNotFoundError: Your shell has not been properly configured to use 'conda activate'.\n"
        "To initialize your shell, run\n\n    $ conda init <SHELL_NAME>\n\n"
        "=>> PBS: job killed: walltime 172830 exceeded limit 172800\n",
        "TimeLimit",
        "infrastructure",
        "PBS: job killed: walltime 172830 exceeded limit 172800",
        True,
    ),
    (
        "a headerless progress row whose loss column turned NaN",
        "1200 12.0% 00:41 4.1873 0.5120\n1300 13.0% 00:45 3.9901 0.5233\n1400 14.0% 00:49 nan 0.4980\n"
        "1500 15.0% 00:53 nan 0.4990\n1600 16.0% 00:57 nan 0.5002\n",
        "NumericalError",
        "framework",
        "1400 14.0% 00:49 nan 0.4980",
        False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_failure_named_and_line_chosen(case: tuple[str, str, str, str, str, bool]) -> None:
    assert_case(HEAD, case)


def test_an_oom_kill_stated_outright_stays_a_host_oom() -> None:
    """Guard: a line that says the OOM killer killed a process (no list of possible causes) is the host OOM."""
    assert_case(
        HEAD,
        (
            "the OOM killer named as what happened",
            "ERROR: worker 3 (pid 88121) was killed by the OOM killer\n",
            "HostOOM",
            "framework",
            "was killed by the OOM killer",
            False,
        ),
    )


def test_a_library_assert_that_checks_nothing_of_its_caller_stays_the_frameworks() -> None:
    """Guard: an assert in a library's frame whose message is the library's own invariant keeps the framework's."""
    assert_case(
        HEAD,
        (
            "a library's own invariant",
            'Traceback (most recent call last):\n  File "/home/u/proj/train.py", line 51, in <module>\n'
            "    trainer.step()\n"
            f'  File "{_SITE}/fastsched/queue.py", line 77, in pop\n    assert self._head <= self._tail\n'
            "AssertionError: queue head past its tail\n",
            "AssertionError",
            "framework",
            "AssertionError: queue head past its tail",
            False,
        ),
    )


def test_condas_activate_error_alone_stays_the_answer() -> None:
    """Guard: with no failure after it, conda's activate error is what the log shows."""
    assert_case(
        HEAD,
        (
            "conda's error and nothing after it",
            "CommandNotFoundError: Your shell has not been properly configured to use 'conda activate'.\n",
            "UncaughtException",
            "script",
            "properly configured to use 'conda activate'",
            False,
        ),
    )


def test_a_nan_under_a_word_column_is_no_divergence() -> None:
    """Guard: a row whose cell above the `nan` is a word, not a number, names no loss (a name `Nan` in a table of
    names), so nothing is diagnosed from it."""
    from tasks.diagnosis.diagnose import diagnose

    d = diagnose(b"7 3.2 Ito\n8 3.1 Nan\n9 3.0 Li\n")
    assert d.type != "NumericalError"
