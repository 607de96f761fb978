"""The degree-2 symmetric tensor features of polynomial attention, one pass per row forward and backward, and the
attention's core on them blocked in cache (the compiled kernel `polynomial_features.cpp`; its header says why and
what it computes)."""

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


class DegreeTwoAttention(torch.autograd.Function):
    """`φ(xq) (wᵀ φ(xk))ᵀ`, `[..., n, C]`, for `xq, xk [..., n, D]` and `w [..., n, C]` (polynomial attention's
    `[V | 1]`, padded keys zeroed), with no `[..., n, F]` tensor made: the compiled `summary`, `apply` and
    `backward_through` lift 64 rows at a time in cache (the kernel's header says why); φ is recomputed in the
    backward, so only the inputs and the `[C, F]` summary are kept for it."""

    @staticmethod
    def forward(ctx: Any, xq: torch.Tensor, xk: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        queries, keys, values = kernels.groups(xq, xk, w)
        summary = built().summary(keys, values)  # [G, C, F]
        ctx.save_for_backward(queries, keys, values, summary)
        ctx.shapes = xq.shape, xk.shape, w.shape
        return built().apply(queries, summary).view(*xq.shape[:-1], w.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        queries, keys, values, summary = ctx.saved_tensors
        (grad,) = kernels.groups(grad)
        grad_summary = built().summary(queries, grad)  # Gᵀ φ(Q)
        grad_q = built().backward_through(queries, grad, summary)  # φ's gradient G S, folded
        grad_k = built().backward_through(keys, values, grad_summary)  # φ's gradient W dS, folded
        grad_w = built().apply(keys, grad_summary)  # φ(K) dSᵀ
        q_shape, k_shape, w_shape = ctx.shapes
        return grad_q.view(q_shape), grad_k.view(k_shape), grad_w.view(w_shape)
