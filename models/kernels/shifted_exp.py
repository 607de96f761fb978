"""Performer's positive random features from their projections, `exp(proj − offset) + floor`, forward and backward in
one pass over the features each (the compiled kernel `shifted_exp.cpp`; its header says what it computes and why):
the values of `PerformerAttention`'s eager `ShiftedExp` at fp32 rounding."""

from __future__ import annotations

from typing import Any

import torch

from models import kernels


def applies(proj: torch.Tensor) -> bool:
    """Whether the kernel computes the features of `proj`: a CPU tensor of fp32 or fp64 where the kernel is built."""
    return kernels.applies("shifted_exp", proj)


def per_row(x: torch.Tensor, rows: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A per-row quantity (`offset`, `floor`: broadcast against `[..., N, 1]`) as the contiguous `[R]` the kernel
    reads."""
    return x.to(dtype).expand(*rows, 1).reshape(-1).contiguous()


class CompiledShiftedExp(torch.autograd.Function):
    """`exp(proj − offset) + floor` for `proj [..., N, M]`, `offset [..., N, 1]` (+inf drops a row) and `floor`
    (broadcast against `[..., N, 1]`), with gradients to `proj` and `offset`; the eager form is
    `models.attention.performer.ShiftedExp`."""

    @staticmethod
    def forward(ctx: Any, proj: torch.Tensor, offset: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
        rows = proj.reshape(-1, proj.shape[-1]).contiguous()
        shift = per_row(offset, proj.shape[:-1], proj.dtype)
        ctx.save_for_backward(rows, shift)
        ctx.shapes = (proj.shape, offset.shape)
        floors = per_row(floor, proj.shape[:-1], proj.dtype)
        out: torch.Tensor = kernels.built("shifted_exp").forward(rows, shift, floors)
        return out.view(proj.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        rows, shift = ctx.saved_tensors
        proj_shape, offset_shape = ctx.shapes
        grad_rows = grad.reshape(rows.shape).contiguous()
        grad_proj, grad_shift = kernels.built("shifted_exp").backward(grad_rows, rows, shift)
        return grad_proj.view(proj_shape), grad_shift.view(*proj_shape[:-1], 1).sum_to_size(offset_shape), None


def shifted_exp(proj: torch.Tensor, offset: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """The features through the kernel (the caller checked `applies`); see `CompiledShiftedExp`."""
    out: torch.Tensor = CompiledShiftedExp.apply(proj, offset, floor)
    return out
