"""Performer's FAVOR+ core blocked in cache, forward and backward (the compiled kernel `performer_core.cpp`; its header
says what it computes and why): the values of `PerformerAttention`'s eager chain at fp32 rounding, with no `[B, H, N,
M]` projection or feature tensor made."""

from __future__ import annotations

from typing import Any

import torch

from models import kernels


def applies(x: torch.Tensor) -> bool:
    """Whether the kernel computes the core on `x`: a CPU tensor of fp32 or fp64 where the kernel is built."""
    return kernels.applies("performer_core", x)


class BlockedFavor(torch.autograd.Function):
    """`φ(Q) (φ(K)ᵀ [V | 1])`, `[B, H, N, E]`, from the scaled `qf, kf [B, H, N, D]`, `[V | 1] [B, H, N, E]` and the
    projection `w` (`[H, M, D]`, or one `[M, D]` shared by the heads; a constant: no gradient), with `valid [B, N]`
    (1 keeps a key) where pad keys are dropped and `eps` the features' ε; gradients to `qf`, `kf` and `[V | 1]`. Only
    the inputs, `Sᵀ [B·H, E, M]` and the per-row offsets are kept for the backward, which recomputes each block's
    features."""

    @staticmethod
    def forward(
        ctx: Any,
        qf: torch.Tensor,
        kf: torch.Tensor,
        values: torch.Tensor,
        w: torch.Tensor,
        valid: torch.Tensor | None,
        eps: float,
    ) -> torch.Tensor:
        heads = qf.shape[1]
        queries, keys, vals = kernels.groups(qf, kf, values)
        proj = (w if w.dim() == 3 else w.unsqueeze(0)).to(qf.dtype).contiguous()
        valid = None if valid is None else valid.to(qf.dtype).contiguous()
        core = kernels.built("performer_core")
        summary_t, shift = core.summary(keys, proj, vals, valid, heads, eps)
        both, offsets = core.apply(queries, proj, summary_t, heads, eps)
        ctx.save_for_backward(queries, keys, vals, proj, summary_t, shift, offsets, *([] if valid is None else [valid]))
        ctx.heads, ctx.eps, ctx.shapes = heads, eps, (qf.shape, kf.shape, values.shape)
        return both.view(*qf.shape[:-1], values.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        queries, keys, vals, proj, summary_t, shift, offsets, *valid = ctx.saved_tensors
        core = kernels.built("performer_core")
        (grad_both,) = kernels.groups(grad)
        grad_q, grad_summary_t = core.backward_queries(queries, proj, offsets, grad_both, summary_t, ctx.heads, ctx.eps)
        grad_k, grad_values = core.backward_keys(
            keys, proj, vals, valid[0] if valid else None, shift, grad_summary_t, ctx.heads, ctx.eps
        )
        q_shape, k_shape, v_shape = ctx.shapes
        return grad_q.view(q_shape), grad_k.view(k_shape), grad_values.view(v_shape), None, None, None


def blocked_favor(
    qf: torch.Tensor, kf: torch.Tensor, values: torch.Tensor, w: torch.Tensor, valid: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """The core through the kernel (the caller checked `applies`); see `BlockedFavor`."""
    out: torch.Tensor = BlockedFavor.apply(qf, kf, values, w, valid, eps)
    return out
