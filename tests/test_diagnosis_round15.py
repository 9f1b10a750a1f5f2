"""Issue 45, round 15: the category decision, as families (benchmarks/results/diagnosis_round15.md).

1. An op's own check of its input's shape (conv's channel and rank checks, old torch's `size mismatch, m1:`, a
   normalisation layer fed the wrong number of features or a batch of one) raised from the library's frame: the
   calling code's (TensorMismatch, script), not the framework's RuntimeError.
2. A collective timeout right where the run left its training loop (training ended, an evaluation began): ranks
   that ran different code there, the script's, not a network fault.
3. A kernel stopped by the GPU's run-time limit (`the launch timed out and was terminated`,
   CUDA_ERROR_LAUNCH_TIMEOUT: only where a display watchdog is on): the machine's set-up, not a GPU fault.
4. A summary of the best step after non-finite losses (`Best model at step 0:` over its finite loss): the run's
   minimum, not a recovery; the loss diverged.

Each case is a short synthetic log written here in the format the software prints; the guards keep the shapes that
must not move (a timeout mid-training, one long after an evaluation line, other CUDA faults, a per-step line that
prints a best metric, a library RuntimeError with no shape check).
"""

from __future__ import annotations

import pytest

from tasks.diagnosis.diagnose import diagnose
from tests.diagnosis_kit import assert_diagnosed

SITE = "/usr/lib/python3/dist-packages"
TIMEOUT = ("[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600041 "
           "milliseconds before timing out.\n")

FAMILIES = {
    "conv-channels": (
        "Traceback (most recent call last):\n"
        '  File "fit.py", line 40, in <module>\n'
        "    y = net(batch)\n"
        f'  File "{SITE}/torch/nn/modules/conv.py", line 456, in _conv_forward\n'
        "    return F.conv2d(input, weight, bias, self.stride,\n"
        "RuntimeError: Given groups=1, weight of size [32, 3, 3, 3], expected input[8, 1, 64, 64] to have 3 channels, "
        "but got 1 channels instead\n",
        "TensorMismatch", "script", "to have 3 channels, but got 1 channels"),
    "conv-rank": (
        f'  File "{SITE}/torch/nn/modules/conv.py", line 443, in _conv_forward\n'
        "RuntimeError: Expected 4-dimensional input for 4-dimensional weight [16, 3, 5, 5], but got 3-dimensional "
        "input of size [3, 128, 128] instead\n",
        "TensorMismatch", "script", "Expected 4-dimensional input"),
    "old-linear-size": (
        f'  File "{SITE}/torch/nn/functional.py", line 1370, in linear\n'
        "    ret = torch.addmm(bias, input, weight.t())\n"
        "RuntimeError: size mismatch, m1: [16 x 2048], m2: [512 x 10] at /pytorch/aten/src/THC/generic/THCTensorMathBlas"
        ".cu:290\n",
        "TensorMismatch", "script", "size mismatch, m1: [16 x 2048]"),
    "batchnorm-features": (
        f'  File "{SITE}/torch/nn/functional.py", line 2450, in batch_norm\n'
        "RuntimeError: running_mean should contain 64 elements not 128\n",
        "TensorMismatch", "script", "running_mean should contain 64 elements not 128"),
    "batchnorm-batch-of-one": (
        f'  File "{SITE}/torch/nn/functional.py", line 2448, in batch_norm\n'
        "ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 256])\n",
        "TensorMismatch", "script", "Expected more than 1 value per channel"),
    "timeout-after-fit": (
        "Epoch 9: 100%|##########| 250/250 [01:12<00:00, 3.45it/s, loss=0.213]\n"
        "Trainer.fit stopped: max_epochs=10 reached.\n" + TIMEOUT.format(seq=9001),
        "NCCLTimeoutError", "script", "Watchdog caught collective operation timeout"),
    "timeout-in-evaluation": (
        "[2024-05-02 11:03:12] epoch 30 loss 0.0412\n"
        "Evaluating on the test split...\n" + TIMEOUT.format(seq=5120),
        "NCCLTimeoutError", "script", "Watchdog caught collective operation timeout"),
    "cuda-launch-timeout-torch": (
        "steps:   1%|          | 12/2000 [04:01<11:07:00, 20.1s/it, loss=0.09]\n"
        "RuntimeError: CUDA error: the launch timed out and was terminated\n"
        "CUDA kernel errors might be asynchronously reported at some other API call.\n",
        "CUDAError", "script", "the launch timed out and was terminated"),
    "cuda-launch-timeout-tf": (
        "2019-02-01 10:00:01.000001: E tensorflow/stream_executor/cuda/cuda_event.cc:48] Error polling for event "
        "status: failed to query event: CUDA_ERROR_LAUNCH_TIMEOUT: the launch timed out and was terminated\n"
        "2019-02-01 10:00:01.000002: F tensorflow/core/common_runtime/gpu/gpu_event_mgr.cc:274] Unexpected Event "
        "status: 1\n",
        "CUDAError", "script", "CUDA_ERROR_LAUNCH_TIMEOUT"),
    "best-summary-after-nan": (
        "Step      Train loss    Test loss\n"
        "0         [2.10e+01]    [2.30e+01]\n"
        "500       [3.12e+00]    [3.40e+00]\n"
        "1000      [nan]         [nan]\n"
        "1500      [nan]         [nan]\n"
        "\n"
        "Best model at step 500:\n"
        "  train loss: 3.12e+00\n"
        "  test loss: 3.40e+00\n",
        "NumericalError", "framework", "1000      [nan]"),
    "best-loss-line-after-nan": (
        "epoch 7 loss 0.512\n"
        "epoch 8 loss nan\n"
        "epoch 9 loss nan\n"
        "training done; best_val_loss: 0.498\n",
        "NumericalError", "framework", "epoch 8 loss nan"),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_decides_its_category(name: str) -> None:
    assert_diagnosed(*FAMILIES[name])


def test_the_scripts_families_are_not_restarted() -> None:
    for name in ("timeout-after-fit", "cuda-launch-timeout-torch", "conv-channels"):
        d = diagnose(FAMILIES[name][0].encode(), use_fallback=False)
        assert not d.restartable, name
    assert "every rank" in diagnose(FAMILIES["timeout-in-evaluation"][0].encode(), use_fallback=False).mitigation


GUARDS = {
    "timeout-mid-training": (  # a timeout between ordinary steps: a rank hung or died, infrastructure as before
        "[2024-05-02 11:03:12] epoch 3 iter 1200 loss 0.412\n"
        "[2024-05-02 11:03:40] epoch 3 iter 1210 loss 0.409\n" + TIMEOUT.format(seq=1211),
        "NCCLTimeoutError", "infrastructure"),
    "evaluation-long-before-timeout": (  # the phase change is far above the timeout: it says nothing about it
        "Evaluating on the validation split...\n"
        "val acc 0.71\n"
        "epoch 4 iter 10 loss 0.39\n"
        "epoch 4 iter 20 loss 0.38\n"
        "epoch 4 iter 30 loss 0.37\n"
        "epoch 4 iter 40 loss 0.36\n" + TIMEOUT.format(seq=4040),
        "NCCLTimeoutError", "infrastructure"),
    "illegal-address-stays-the-gpus": (
        "RuntimeError: CUDA error: an illegal memory access was encountered\n", "CUDAError", "infrastructure"),
    "other-cuda-driver-error-stays": (
        "E tensorflow/stream_executor/cuda/cuda_driver.cc:1000] CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory "
        "access was encountered\n", "CUDAError", "infrastructure"),
    "library-runtime-error-without-shape-check": (
        f'  File "{SITE}/torch/serialization.py", line 600, in load\n'
        "RuntimeError: unexpected internal state in the allocator\n", "RuntimeError", "framework"),
}


@pytest.mark.parametrize("name", sorted(GUARDS))
def test_guards_keep_their_category(name: str) -> None:
    assert_diagnosed(*GUARDS[name])


@pytest.mark.parametrize("best", ["best_acc", "best_loss"])
def test_a_best_value_on_each_step_line_is_still_a_recovery(best: str) -> None:
    """A per-step line that prints a best value beside its loss prints the step's loss: two NaN prints followed
    by finite steps stay a recovered NaN (no divergence), as before."""
    text = (f"epoch 1 loss 0.80 {best} 0.80\n"
            f"epoch 2 loss nan {best} 0.80\n"
            f"epoch 3 loss nan {best} 0.80\n"
            f"epoch 4 loss 0.61 {best} 0.61\n"
            f"epoch 5 loss 0.55 {best} 0.55\n")
    assert diagnose(text.encode(), use_fallback=False).type != "NumericalError"
