"""Skyformer's Gaussian kernel from its logits, `exp(min(s, 0))`, forward and backward in one pass over the kernel each
(the compiled kernel `clamped_exp.cpp`; its header says what it computes and why): the values of
`torch.exp(s.clamp_max(0))` at fp32 rounding, without its subnormals."""

from __future__ import annotations

from typing import Any

import torch

from models import kernels


def applies(logits: torch.Tensor) -> bool:
    """Whether the kernel computes `exp(min(logits, 0))`: a CPU tensor of fp32 or fp64 where the kernel is built."""
    return kernels.applies("clamped_exp", logits)


class ClampedExp(torch.autograd.Function):
    """`exp(min(s, 0))`, with the gradient of `s` (0 where s > 0, as torch's clamp)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.contiguous()
        ctx.save_for_backward(logits)
        out: torch.Tensor = kernels.built("clamped_exp").forward(logits)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (logits,) = ctx.saved_tensors
        grad_logits: torch.Tensor = kernels.built("clamped_exp").backward(grad.contiguous(), logits)
        return grad_logits


def clamped_exp(logits: torch.Tensor) -> torch.Tensor:
    """`exp(min(logits, 0))` through the kernel (the caller checked `applies`); see `ClampedExp`."""
    out: torch.Tensor = ClampedExp.apply(logits)
    return out
