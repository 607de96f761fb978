"""The row log-sum-exp of attention scores, `lse_i = log Σ_j exp(q_i·kⱼ + bias_j)`, forward and backward without
the n × n matrix (the compiled kernel `row_logsumexp.cpp`; its header says what it computes and why): the normaliser
residual-pivoted attention divides its exact columns by."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from models import kernels
from models.kernels import load
from models.kernels.flash_attention import bias_per_head, per_head


def kernel() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    return load("row_logsumexp")


class RowLogSumExp(torch.autograd.Function):
    """`lse_i = log Σ_j exp(q_i·kⱼ + bias_j)` for `q, k: [B, H, N, D]` (as scaled as the scores should be),
    `bias: [B, N]`; a row without an attended key gets −inf and no gradient."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor):
        b, h, n, _ = q.shape
        flat_q, flat_k, bias_bh = per_head(q), per_head(k), bias_per_head(bias, h, q.dtype)
        lse = kernels.built("row_logsumexp").forward(flat_q, flat_k, bias_bh)
        ctx.save_for_backward(flat_q, flat_k, bias_bh, lse)
        ctx.shape = (b, h)
        return lse.view(b, h, n)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        q, k, bias_bh, lse = ctx.saved_tensors
        b, h = ctx.shape
        finite = torch.isfinite(lse)
        grad = torch.where(finite, grad.reshape(lse.shape), 0.0).contiguous()
        lse = torch.where(finite, lse, 0.0).contiguous()
        dq, dk = kernels.built("row_logsumexp").backward(grad, q, k, bias_bh, lse)
        return dq.view(b, h, *dq.shape[1:]), dk.view(b, h, *dk.shape[1:]), None
