"""Issue 45, round 16: the category and `unknown` families still open after round 15
(benchmarks/results/diagnosis_round16.md).

1. Divergence named with NaN/inf before what holds it (`NaN detected in loss function`, `Inf found in the
   gradients`), a loss said to hold one or not to be finite, TensorFlow's numeric checks (`Tensor had NaN values`,
   `Nan in summary histogram`), the fp16 scaler at its floor in other words: framework, not `unknown`.
2. An HTTP client's own exception for a connect that never succeeded (urllib3's `ConnectTimeoutError` and
   `NewConnectionError`, httpx's `ConnectError`, aiohttp's `ClientConnectorError`), where the log holds it and not
   requests' `Max retries exceeded` summary: the machine's network access (script), as round 13 reads the summary.
3. TensorFlow's `N root error(s) found.`: the first error it lists, `(0) Kind: message`, is the cause.
4. Clear causes the rules did not know, which ended in `unknown`: a native crash in the C library's, Python's or
   Windows' words (heap corruption, stack smashing, SIGFPE, access violation, stack overflow), host memory in
   numpy's, PBS's and LSF's words and `killed by the OOM killer`, a preempted TPU or node, srun's node failure and
   killed task, PBS's and LSF's wall-time limits, a compiler's or pip's refusal in a build or install, a file that is
   not a zip, numpy 2 refusing a numpy-1 extension, the thread limit, DeepSpeed's launcher reporting a rank's exit.

Each case is a short synthetic log written here in the format the software prints; the guards keep shapes that must
not move (a NaN the run trained past, Keras's `improved from inf`, a read timeout, a name that does not resolve,
DeepSpeed's launcher line for a SIGKILLed rank).
"""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import diagnose
from tests.diagnosis_kit import assert_diagnosed

SITE = "/usr/local/lib/python3.10/site-packages"
STEPS = "".join(f"epoch 1 step {s} loss {0.9 - s / 1000:.3f}\n" for s in range(100, 400, 100))

DIVERGENCE = {
    "nan-detected-in-loss": ('{"simapp_exception": {"function": "training_worker", "message": "NaN detected in loss '
                             'function, aborting training. Job failed!"}}\n', "NaN detected in loss function"),
    "detected-nan-in-the-loss": ("Detected NaN in the loss at step 400, stopping.\n", "Detected NaN in the loss"),
    "inf-found-in-gradients": ("ERROR: Inf found in the gradients of layer fc2, aborting\n", "Inf found in the"),
    "loss-contains-nan": ("Error: loss contains NaN values at iteration 400\n", "loss contains NaN"),
    "loss-not-finite": ("Loss is not finite. Stopping training at step 400\n", "Loss is not finite"),
    "tf-check-numerics": (
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: loss/total : Tensor had NaN values\n"
        "\t [[{{node CheckNumerics}}]]\n", "Tensor had NaN values"),
    "tf-summary-histogram": (
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: Nan in summary histogram for: conv1/kernel_0\n",
        "Nan in summary histogram"),
    "scaler-floor": ("OverflowError: Loss scale reached minimum, cannot decrease it further\n", "Loss scale reached"),
}


@pytest.mark.parametrize("name", sorted(DIVERGENCE))
def test_divergence_said_with_nan_first_or_in_tensorflow_s_words(name: str) -> None:
    text, root = DIVERGENCE[name]
    d = assert_diagnosed(STEPS + text, "NumericalError", "framework", root)
    assert not d.restartable and "learning rate" in d.mitigation


def test_a_nan_the_run_trained_past_is_not_the_cause() -> None:
    log = (STEPS + "WARNING: NaN detected in loss at step 350, skipping batch\n" + STEPS.replace("epoch 1", "epoch 2")
           + "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n")  # ranks below a divergence
    assert_diagnosed(log, "DataloaderKilled", "framework", "is killed by signal")


def test_keras_improved_from_inf_is_no_divergence() -> None:
    log = "Epoch 1/10\nEpoch 00001: val_loss improved from inf to 0.69315, saving model to best.h5\n"
    d = diagnose(log.encode(), use_fallback=False)
    assert d.type != "NumericalError", d.root_cause_line


NEVER_CONNECTED = {
    "urllib3-connect-timeout": (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/urllib3/connection.py", line 174, in _new_conn\n'
        "    raise ConnectTimeoutError(\n"
        "urllib3.exceptions.ConnectTimeoutError: (<urllib3.connection.HTTPSConnection object at 0x7f2b>, 'Connection "
        "to models.example.org timed out. (connect timeout=10)')\n\nDuring handling of the above exception, another "
        "exception occurred:\n\nTraceback (most recent call last):\n"
        f'  File "{SITE}/urllib3/util/retry.py", line 592, in increment\n'
        "    raise MaxRetryError(_pool, url, error or ResponseError(cause))\n", "ConnectTimeoutError"),
    "urllib3-refused": (
        "urllib3.exceptions.NewConnectionError: <urllib3.connection.HTTPSConnection object at 0x7f2b>: Failed to "
        "establish a new connection: [Errno 111] Connection refused\n", "Failed to establish a new connection"),
    "httpx": ("httpx.ConnectError: [Errno 101] Network is unreachable\n", "httpx.ConnectError"),
    "aiohttp": ("aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host datasets.example.org:443 "
                "ssl:default [Connect call failed ('10.0.0.5', 443)]\n", "Cannot connect to host"),
}


@pytest.mark.parametrize("name", sorted(NEVER_CONNECTED))
def test_a_client_s_own_connect_failure_is_the_machine_s_network_access(name: str) -> None:
    text, root = NEVER_CONNECTED[name]
    d = assert_diagnosed(text, "ServiceUnreachable", "script", root)
    assert not d.restartable and "fails the same way" in d.mitigation


@pytest.mark.parametrize("text, type_, category", [
    ("requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='hub.example.org', port=443): Read timed out. "
     "(read timeout=10)\n", "NetworkError", "infrastructure"),
    ("urllib3.exceptions.NewConnectionError: <urllib3.connection.HTTPSConnection object at 0x7f2b>: Failed to "
     "establish a new connection: [Errno -2] Name or service not known\n", "NameResolutionError", "script"),
])
def test_guards_a_read_timeout_and_a_name_that_does_not_resolve_keep_their_rules(text, type_, category) -> None:
    assert_diagnosed(text, type_, category)


def test_tensorflow_s_root_errors_count_yields_to_the_first_error_it_lists() -> None:
    log = ("-> 1429         run_metadata)\n\nResourceExhaustedError: 2 root error(s) found.\n"
           "  (0) Resource exhausted: OOM when allocating tensor with shape[32,64,224,224] and type float on "
           "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n"
           "\t [[{{node resnet/conv1/Conv2D}}]]\n"
           "  (1) Resource exhausted: OOM when allocating tensor with shape[32,64,224,224] and type float\n"
           "0 successful operations.\n")
    d = assert_diagnosed(log, "OutOfMemoryError", "framework", "(0) Resource exhausted: OOM")
    assert d.via == "chain" and "root error(s)" not in (d.root_cause_line or "")


CLEAR_CAUSES = {  # (type, category): lines that each ended in `unknown` before this round
    ("SegFault", "script"): [
        "double free or corruption (!prev)", "free(): invalid pointer", "*** stack smashing detected ***: terminated",
        "run.sh: line 12: 48213 Floating point exception (core dumped) python train.py",
        "Process finished with exit code -1073741819 (0xC0000005)", "Windows fatal exception: access violation",
        "Fatal Python error: Cannot recover from stack overflow."],
    ("HostOOM", "framework"): [
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 31.4 GiB for an array with shape (65536, 128, "
        "1024) and data type float32", "=>> PBS: job killed: mem 67108864kb exceeded limit 62914560kb",
        "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.", "Worker 3 was killed by the OOM killer"],
    ("Preempted", "infrastructure"): [
        "E1102 03:04:05 Your TPU was preempted; the job will be rescheduled",
        "ERROR: Job was terminated because the node was preempted", "Instance i-0abc123 is being terminated by EC2 spot"],
    ("NodeFailure", "infrastructure"): ["srun: error: Node failure on gpu-node-12"],
    ("Killed", "framework"): ["srun: error: gpu-node-12: task 3: Killed"],
    ("TimeLimit", "infrastructure"): ["=>> PBS: job killed: walltime 172830 exceeded limit 172800",
                                      "TERM_RUNLIMIT: job killed after reaching LSF run time limit."],
    ("BuildError", "script"): ["nvcc fatal   : Unsupported gpu architecture 'compute_90'",
                               "error: command '/usr/bin/gcc' failed with exit code 1"],
    ("InstallError", "script"): ["ERROR: Could not find a version that satisfies the requirement torch==1.4.0 (from "
                                 "versions: 2.0.0)"],
    ("DataError", "script"): ["zipfile.BadZipFile: File is not a zip file"],
    ("ImportError", "script"): ["A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.0 as it may "
                                "crash."],
    ("ResourceLimitError", "script"): ["RuntimeError: can't start new thread",
                                       "F1102 resource.cc:31] Check failed: ret == 0 (11 vs. 0)Thread creation via "
                                       "pthread_create() failed."],
    ("ChildFailed", "framework"): ["[2024-05-01 10:00:00,123] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python"
                                   "', '-u', 'train.py', '--local_rank=1'] exits with return code = 1"],
}
CASES = [(line, type_, category) for (type_, category), lines in CLEAR_CAUSES.items() for line in lines]


@pytest.mark.parametrize("line, type_, category", CASES, ids=[f"{t}-{i}" for i, (_, t, _c) in enumerate(CASES)])
def test_a_clear_cause_in_words_the_rules_did_not_know(line: str, type_: str, category: str) -> None:
    assert_diagnosed(STEPS + line + "\n", type_, category, line[-25:])


def test_deepspeed_s_launcher_line_for_a_sigkilled_rank_stays_killed() -> None:
    line = ("[2024-05-01 10:00:00,123] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', 'train.py'] exits "
            "with return code = -9\n")
    assert_diagnosed(STEPS + line, "Killed", "framework", "return code = -9")
