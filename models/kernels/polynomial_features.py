"""The degree-2 symmetric tensor features of polynomial attention, one pass per row forward and backward (the
compiled kernel `polynomial_features.cpp`; its header says why and what it computes)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from models import kernels
from models.kernels import load


def kernel() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    return load("polynomial_features")


def built() -> ModuleType:
    """The compiled module, for a caller that checked `kernel()` first."""
    return kernels.built("polynomial_features")


class DegreeTwoFeatures(torch.autograd.Function):
    """`[..., D]` → `[x_a² (a < D), √2·x_a·x_b (a < b)]`, `[..., D(D+1)/2]`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        ctx.save_for_backward(rows)
        ctx.shape = x.shape
        phi = built().forward(rows)
        return phi.view(*x.shape[:-1], phi.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (rows,) = ctx.saved_tensors
        return built().backward(grad.reshape(rows.shape[0], -1).contiguous(), rows).view(ctx.shape)
