"""The outlier-spectral mixer's masked tanh affinity, `tanh(dots / T) · valid · mask`, forward and backward in one
pass over the `[B, H, n, s]` columns each (the compiled kernel `tanh_affinity.cpp`; its header says what it computes
and why): the values of `models.attention.spectral`'s eager columns at fp32 rounding."""

from __future__ import annotations

from typing import Any

import torch

from models import kernels


def applies(dots: torch.Tensor) -> bool:
    """Whether the kernel computes the columns of `dots`: a CPU tensor of fp32 or fp64 where the kernel is built."""
    return kernels.applies("tanh_affinity", dots)


class MaskedTanh(torch.autograd.Function):
    """`tanh(dots / temperature) * valid[..., None, :] * mask[:, None, :, None]` for `dots [B, H, n, s]`, `valid
    [B, H, s]` and `mask [B, n]` (bool, or None: every token real), with the gradient of `dots`."""

    @staticmethod
    def forward(
        ctx: Any, dots: torch.Tensor, temperature: float, valid: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        factors = valid.to(dots.dtype).contiguous(), None if mask is None else mask.to(dots.dtype).contiguous()
        cols, tanh = kernels.built("tanh_affinity").forward(dots.contiguous(), temperature, *factors)
        ctx.save_for_backward(tanh, *(f for f in factors if f is not None))
        ctx.temperature = temperature
        return cols

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        tanh, valid, *mask = ctx.saved_tensors
        grad_dots = kernels.built("tanh_affinity").backward(
            grad.contiguous(), tanh, ctx.temperature, valid, mask[0] if mask else None
        )
        return grad_dots, None, None, None


def masked_tanh(dots: torch.Tensor, temperature: float, valid: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The masked columns through the kernel (the caller checked `applies`); see `MaskedTanh`."""
    out: torch.Tensor = MaskedTanh.apply(dots, temperature, valid, mask)
    return out
