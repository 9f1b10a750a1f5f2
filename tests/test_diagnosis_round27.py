"""Issue 45, round 27: the families set 25 showed (benchmarks/results/diagnosis_round27.md).

A. A batch script's own command failing before the job's program ran (bash's `line N: ...: No such file or
   directory` for a file it could not source or a directory it could not enter, `command not found`): the shell ran
   the script's next line, and the failure that follows ended the job.
B. Two ranks' Python 3.11 tracebacks written into each other, the location markers (`^^^^`) run into a copy of the
   source or the exception's name: garbled copies, which yield to the clean exception line of the same failure.
C. A disk quota reported in lower case (TensorFlow's ResourceExhaustedError while writing a checkpoint): a full
   disk, the infrastructure's, not a memory OOM.
D. Slurm's report of a step cancelled at the time limit, printed before its report of the job: the job's line.
E. A C++/CUDA extension installed without its CUDA kernels (`Not compiled with GPU support`): the user's install,
   the script's, as `Torch not compiled with CUDA enabled`.

Each case is a short synthetic log written here (none is a log of set 25).
"""

from __future__ import annotations

import pytest

from tests.diagnosis_kit import assert_case, assert_diagnosed

HEAD = "epoch 1 | step 100 | loss 3.02 | lr 2e-4\nepoch 1 | step 110 | loss 2.97 | lr 2e-4\n"

_SITE = "/opt/conda/lib/python3.11/site-packages"
_JOB = "/var/spool/slurmd/job81234/slurm_script"

# (what the case shows, the log after HEAD, type, category, a piece of the root line, restartable)
CASES = [
    (
        "a module file bash could not source, then the program's own error",
        f"{_JOB}: line 9: /etc/profile.d/modules.sh: No such file or directory\n"
        f"{_JOB}: line 11: module: command not found\n"
        "Traceback (most recent call last):\n"
        '  File "/home/u/proj/train.py", line 22, in <module>\n'
        "    cfg = load(args.config)\n"
        "KeyError: 'optimizer'\n",
        "KeyError",
        "script",
        "KeyError: 'optimizer'",
        False,
    ),
    (
        "a directory bash could not enter, then python not finding the script",
        f"{_JOB}: line 14: cd: /scratch/u/runs/exp3: No such file or directory\n"
        "python3: can't open file '/home/u/train_ddp.py': [Errno 2] No such file or directory\n",
        "FileNotFoundError",
        "script",
        "can't open file '/home/u/train_ddp.py'",
        False,
    ),
    (
        "two ranks' 3.11 tracebacks run into each other, a clean copy last",
        "Traceback (most recent call last):\nTraceback (most recent call last):\n"
        '  File "/home/u/lm/run.py", line 88, in <module>\n'
        '  File "/home/u/lm/run.py", line 88, in <module>\n'
        "    tok = build_tokenizer(cfg)    \ntok = build_tokenizer(cfg)\n"
        "          ^^^^^^^^^^^^^^^^^^^^    ^^^raise ValueError(^^^^^\n"
        "^^^^^^ValueError\n"
        ": unknown tokenizer 'sp32k'\n"
        "    raise ValueError(\n"
        "ValueError: unknown tokenizer 'sp32k'\n",
        "ValueError",
        "script",
        "ValueError: unknown tokenizer 'sp32k'",
        False,
    ),
    (
        "a disk quota in lower case while TensorFlow merges a checkpoint",
        "Traceback (most recent call last):\n"
        '  File "/home/u/tf/train.py", line 140, in <module>\n'
        "    manager.save()\n"
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: /scratch/u/ckpt/ckpt-12_temp/part-00000-of-"
        "00001.data-00000-of-00001.tempstate8812; disk quota exceeded [Op:MergeV2Checkpoints]\n",
        "DiskFull",
        "infrastructure",
        "disk quota exceeded [Op:MergeV2Checkpoints]",
        False,
    ),
    (
        "Slurm's step line before its job line at the time limit",
        "slurmstepd: error: *** STEP 902211.0 ON gpu017 CANCELLED AT 2025-02-11T08:00:14 DUE TO TIME LIMIT ***\n"
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
        "slurmstepd: error: *** JOB 902211 ON gpu017 CANCELLED AT 2025-02-11T08:00:14 DUE TO TIME LIMIT ***\n",
        "TimeLimit",
        "infrastructure",
        "*** JOB 902211 ON gpu017",
        True,
    ),
    (
        "a CPU-only build of a detection library's ops called on GPU tensors",
        "Traceback (most recent call last):\n"
        '  File "/home/u/det/tools/train_net.py", line 70, in <module>\n'
        "    outputs = model(batch)\n"
        f'  File "{_SITE}/detectron2/layers/nms.py", line 21, in batched_nms\n'
        "    return box_ops.batched_nms(boxes.float(), scores, idxs, iou_threshold)\n"
        "RuntimeError: Not compiled with GPU support\n",
        "ExtensionBuildError",
        "script",
        "Not compiled with GPU support",
        False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_failure_named_and_line_chosen(case: tuple[str, str, str, str, str, bool]) -> None:
    assert_case(HEAD, case)


def test_a_shell_error_with_nothing_after_it_stays_the_answer() -> None:
    assert_diagnosed(
        HEAD + f"{_JOB}: line 12: /home/u/venv/bin/activate: No such file or directory\n",
        "FileNotFoundError",
        "script",
        "venv/bin/activate: No such file or directory",
    )


def test_bashs_report_of_a_killed_child_is_not_a_line_the_job_went_on_after() -> None:
    d = assert_diagnosed(
        HEAD + f"{_JOB}: line 30: 51234 Killed                  python train.py --bs 64\n"
        "slurmstepd: error: Detected 1 oom_kill event in StepId=81234.batch. Some of the step tasks have been "
        "OOM Killed.\n",
        "HostOOM",
        "framework",
    )
    assert d.line_no is not None


def test_a_step_line_alone_stays_the_time_limit() -> None:
    assert_diagnosed(
        HEAD + "slurmstepd: error: *** STEP 77.0 ON n3 CANCELLED AT 2025-01-02T10:00:00 DUE TO TIME LIMIT ***\n",
        "TimeLimit",
        "infrastructure",
        "*** STEP 77.0 ON n3",
    )


def test_a_tensorflow_memory_oom_stays_an_oom() -> None:
    assert_diagnosed(
        HEAD + "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[64,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n",
        "OutOfMemoryError",
        "framework",
        "OOM when allocating tensor",
    )
