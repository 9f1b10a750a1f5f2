"""Issue 45, round 18: the misses left on every seen set, as families (benchmarks/results/diagnosis_round18.md).

1. Failures a person recognises by shape, where no rule knows the words (tasks/diagnosis/named.py): an exception
   of a class no rule knows that ends a traceback, a C++ exception or a native fatal check, a process ended by a
   signal or with an error status as a launcher or an IDE reports it, an ERROR/CRITICAL/FATAL log line: answered
   with the category its source gives and a lower confidence instead of `unknown`.
2. A shell's signal report in zsh's words or as a job report (`[1]    14957 segmentation fault (core dumped)
   python train.py`, `zsh: killed     python train.py`): read as bash's report on its own line is.
3. The store-based barrier's timeout (the store was reached, the other ranks never joined): the launch, script.
4. The root-cause line quotes the log as written: its indentation kept.

Each case is a short synthetic log written here.
"""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import TRUNCATED_CONFIDENCE, diagnose
from tasks.diagnosis.named import NAMED_CONFIDENCE
from tests.diagnosis_kit import assert_diagnosed

HEAD = "loading shards 4/4\nbuilding model\nepoch 3 step 120 loss 0.412\n"
SITE = "/opt/conda/lib/python3.10/site-packages"


def _tb(frames: list[tuple[str, str]], last: str, marks: bool = False) -> str:
    lines = ["Traceback (most recent call last):"]
    for where, code in frames:
        lines += [f'  File "{where}", line 88, in run', f"    {code}"]
    return HEAD + "\n".join(lines) + ("\n            ^^^^^^^^" if marks else "") + f"\n{last}\n"


NAMED = {  # log -> (type, category, restartable, root line)
    "exception-no-rule-knows-from-a-library": (
        _tb([("/home/kim/proj/train.py", "model = torch.compile(model)"), (f"{SITE}/torch/_dynamo/eval_frame.py",
                                                                         "return fn(*args)")],
            "torch._dynamo.exc.Unsupported: call_function UserDefinedClassVariable() [] {}"),
        "UncaughtException", "framework", False, "torch._dynamo.exc.Unsupported: call_function"),
    "exception-no-rule-knows-from-the-script-under-marks": (
        _tb([("/home/kim/proj/train.py", "main()"), ("/home/kim/proj/data.py", "batch = next(it)")], "StopIteration",
            marks=True), "UncaughtException", "script", False, "StopIteration"),
    "system-exit-with-a-status": (
        _tb([("/home/kim/proj/train.py", "sys.exit(run(cfg))")], "SystemExit: 2"),
        "UncaughtException", "script", False, "SystemExit: 2"),
    "cxx-exception": (
        HEAD + "terminate called after throwing an instance of 'c10::Error'\n  what():  invalid device pointer: 0x7f\n",
        "UncaughtException", "framework", False, "what():  invalid device pointer"),
    "glog-fatal-check": (
        HEAD + "F1127 10:01:02.123456 12345 gpu_executor.cc:88] Check failed: stream->ok()\n",
        "FatalError", "framework", False, "Check failed: stream->ok()"),
    "c10-fatal-bracketed": (HEAD + "[F1127 10:01:02.123456789 TensorImpl.cpp:312] Check failed: n == size\n",
                            "FatalError", "framework", False, "Check failed: n == size"),
    "c10-error-bracketed": (HEAD + "[rank0]:[E1127 10:01:02.123456789 engine.cpp:88] step 1200: gradient hook raised\n",
                            "LoggedError", "script", False, "gradient hook raised"),
    "c-library-assertion": (
        HEAD + "python: ../nptl/pthread_mutex_lock.c:81: __pthread_mutex_lock: Assertion `mutex->__data.__owner == 0' "
               "failed.\n", "FatalError", "framework", False, "Assertion `mutex"),
    "ide-sigabrt": (HEAD + "\nProcess finished with exit code 134 (interrupted by signal 6: SIGABRT)\n",
                    "SegFault", "framework", True, "interrupted by signal 6"),
    "ide-sigterm": (HEAD + "\nProcess finished with exit code 143 (interrupted by signal 15: SIGTERM)\n",
                    "Terminated", "infrastructure", True, "signal 15"),
    # mpirun's `exited on signal 9 (Killed)` was read here by its shape; round 19 made it a rule (a kill), tested in
    # tests/test_diagnosis_round19.py
    "subprocess-sigterm": (HEAD + "worker died with <Signals.SIGTERM: 15>.\n", "Terminated", "infrastructure", True,
                           "<Signals.SIGTERM: 15>"),
    "child-bus-error-signal": (HEAD + "Child process 1234 terminated by signal 7\n", "SegFault", "framework", True,
                               "terminated by signal 7"),
    "srun-exit-status": (HEAD + "srun: error: gpu-07: task 0: Exited with exit code 1\n", "ChildFailed", "framework",
                         True, "Exited with exit code 1"),
    "mpirun-non-zero": (HEAD + "Primary job  terminated normally, but 1 process returned\na non-zero exit code. Per "
                               "user-direction, the job has been aborted.\n", "ChildFailed", "framework", True,
                        "a non-zero exit code"),
    "logged-error-main": (HEAD + "ERROR:__main__:training crashed at step 1200\n", "LoggedError", "script", False,
                          "ERROR:__main__:training crashed"),
    "logged-critical-root": (HEAD + "CRITICAL:root:budget spent, stopping\n", "LoggedError", "script", False,
                             "CRITICAL:root:budget spent"),
    "logged-error-library": (HEAD + "2026-11-27 10:00:00,123 - deepspeed.runtime - ERROR - step 1200 aborted\n",
                             "LoggedError", "framework", False, "deepspeed.runtime - ERROR"),
    "rust-panic": (HEAD + "thread '<unnamed>' panicked at 'no entry found for key', src/models/bpe/model.rs:41:9\n",
                   "FatalError", "framework", False, "panicked at 'no entry found for key'"),
    "make-error-status": (HEAD + "make: *** [Makefile:14: train] Error 2\n", "ChildFailed", "framework", True,
                          "[Makefile:14: train] Error 2"),
    "error-at-line-start": (HEAD + "Error: the dataset index lists 0 shards\n", "LoggedError", "script", False,
                            "Error: the dataset index lists 0 shards"),
    "logged-fatal-bracket": (HEAD + "[FATAL] train loop failed: gradient buffer was not allocated\n", "LoggedError",
                             "script", False, "[FATAL] train loop failed"),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_a_failure_named_by_its_shape_is_answered_at_lower_confidence(name: str) -> None:
    text, type_, category, restartable, root = NAMED[name]
    d = assert_diagnosed(text, type_, category, root)
    assert (d.via, d.confidence, d.restartable) == ("named", NAMED_CONFIDENCE, restartable)


def test_the_strongest_shape_wins_the_earliest_among_equals() -> None:
    log = (HEAD + "ERROR:__main__:step 1200 failed\n"
           + _tb([("/home/kim/proj/train.py", "main()")], "StopIteration")
           + "srun: error: gpu-07: task 0: Exited with exit code 1\n")
    d = assert_diagnosed(log, "UncaughtException", "script", "StopIteration")
    assert d.via == "named"


@pytest.mark.parametrize("text", [
    _tb([("/home/kim/proj/train.py", "main()")], "KeyboardInterrupt"),  # a person stopped it
    _tb([("/home/kim/proj/train.py", "sys.exit(main())")], "SystemExit: 0"),  # a clean exit
    HEAD + "Process finished with exit code 0\n",
    HEAD + "Done\n",  # a capitalised word that ends no traceback
    HEAD + "errors so far: 0 (ERROR budget 5)\n",  # the word, not a logged level
])
def test_no_failure_shape_stays_unknown(text: str) -> None:
    assert diagnose(text.encode(), use_fallback=False).type == "Unknown"


def test_a_line_a_rule_names_wins_over_every_shape() -> None:
    log = HEAD + "ERROR:__main__:step 1200 failed\ntorch.cuda.OutOfMemoryError: CUDA out of memory.\n"
    d = assert_diagnosed(log, "OutOfMemoryError", "framework", "CUDA out of memory")
    assert (d.via, d.confidence) == ("line", None)


def test_the_command_says_lower_confidence_for_a_shape(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    log = tmp_path / "train.log"
    log.write_text(NAMED["glog-fatal-check"][0])
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "cli", "diagnose", str(log)], capture_output=True, text=True,
                         cwd=root, check=False)
    assert "FatalError" in out.stdout and "lower confidence" in out.stdout, out.stdout + out.stderr


SHELL = {  # the shell's report in zsh's words or as a job report: (line, type, category)
    "zsh-segfault-job-and-pid": ("[1]    14957 segmentation fault (core dumped)  python train.py --epochs 3",
                                 "SegFault", "script"),
    "zsh-segfault-pid-only": ("14957 segmentation fault (core dumped)  python train.py --data_root d",
                              "SegFault", "script"),
    "bash-job-segfault": ("[1]+  Segmentation fault      (core dumped) python train.py", "SegFault", "script"),
    "zsh-killed": ("zsh: killed     python train.py --bs 64", "Killed", "framework"),
    "zsh-job-killed": ("[2]  + 2231 killed     python train.py --bs 64", "Killed", "framework"),
    "zsh-bus-error": ("zsh: bus error  python train.py", "SharedMemoryError", "script"),
    "zsh-illegal-hardware-instruction": ("zsh: illegal hardware instruction  python train.py", "IllegalInstruction",
                                         "script"),
    "zsh-floating-point": ("[1]    812 floating point exception  python train.py", "SegFault", "script"),
    "zsh-abort": ("zsh: abort (core dumped)  python train.py", "SegFault", "framework"),
}


@pytest.mark.parametrize("name", sorted(SHELL))
def test_a_shells_signal_report_in_zsh_words_or_as_a_job_report(name: str) -> None:
    line, type_, category = SHELL[name]
    d = assert_diagnosed(HEAD + line + "\n", type_, category, line)
    assert d.via == "line"


@pytest.mark.parametrize("text", ["12 killed  workers were restarted", "[1]    2231 killed by the user's request"])
def test_prose_with_a_report_word_is_no_shell_report(text: str) -> None:
    d = diagnose((HEAD + text + "\n").encode(), use_fallback=False)
    assert d.type not in ("Killed", "SegFault"), d.root_cause_line


@pytest.mark.parametrize("line", [
    "RuntimeError: Timed out initializing process group in store based barrier on rank: 1, for key: "
    "store_based_barrier_key:1 (world_size=2, worker_count=1, timeout=0:30:00)",
    "[rank3]: timed out initializing process group in store based barrier on rank 3",
])
def test_a_store_barrier_the_other_ranks_never_joined_is_the_launch(line: str) -> None:
    d = assert_diagnosed(HEAD + line + "\n", "RendezvousError", "script", "store based barrier")
    assert not d.restartable and "world size" in d.mitigation


def test_a_store_barrier_yields_to_the_rank_that_died_first() -> None:
    log = (HEAD + "[rank1]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
           "[rank0]: RuntimeError: Timed out initializing process group in store based barrier on rank: 0\n")
    assert_diagnosed(log, "OutOfMemoryError", "framework", "CUDA out of memory")


def test_the_root_line_keeps_its_indentation() -> None:
    log = (HEAD + "tensorflow.python.framework.errors_impl.ResourceExhaustedError: 2 root error(s) found.\n"
           "  (0) Resource exhausted: OOM when allocating tensor with shape[16,64,112,112]\n"
           "\t [[node conv1/Conv2D]]\n")
    d = assert_diagnosed(log, "OutOfMemoryError", "framework")
    assert d.root_cause_line == "  (0) Resource exhausted: OOM when allocating tensor with shape[16,64,112,112]"


def test_a_truncated_tracebacks_code_line_keeps_its_indentation() -> None:
    d = diagnose(_tb([("/home/kim/proj/cfg.py", "raise KeyError(f'{k} is not a valid key')")], "").rstrip().encode()
                 + b"\n", use_fallback=False)
    assert (d.via, d.confidence) == ("truncated", TRUNCATED_CONFIDENCE)
    assert d.root_cause_line == "    raise KeyError(f'{k} is not a valid key')"
