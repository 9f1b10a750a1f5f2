"""Inference attention on CUDA avoids cuDNN's kernel (a plan per new length: benchmarks/results/decode_gpu_first.md)."""

from __future__ import annotations

import torch

from tasks.training.model import attention_backends


def test_on_cuda_inference_attention_may_use_every_kernel_but_cudnns_and_restores_the_flags():
    before = (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    assert before[0], "torch's default allows cuDNN attention; the check below would prove nothing"
    with attention_backends(torch.device("cuda", 0)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before


def test_on_the_cpu_torchs_own_choice_stands():
    with attention_backends(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()
