"""Nyströmformer's convolution skip — each head's values convolved along the sequence with that head's taps, padded
positions zeroed first — forward and backward in place on the head-major `[B, H, N, D]` layout (the compiled kernel
`depthwise_conv.cpp`; its header says what it computes and why): the values of the eager skip
(`NystromAttention.skip`) at fp32 rounding, without its mask pass and layout copies."""

from __future__ import annotations

from typing import Any

import torch

from models import kernels


def applies(v: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel computes the skip of `v` with `weight [H, K]`: K odd (zero padding K // 2 on both sides,
    the length kept), the weight in `v`'s dtype (no autocast), and `v` a CPU tensor of fp32 or fp64 where the kernel
    is built."""
    return weight.shape[-1] % 2 == 1 and weight.dtype == v.dtype and kernels.applies("depthwise_conv", v)


class DepthwiseConv(torch.autograd.Function):
    """`y[b,h,n] = Σ_t w[h,t] · m[b,n+t−P] · v[b,h,n+t−P]` for `v: [B, H, N, D]`, `mask: [B, N]` (bool, or None: every
    position real), `weight: [H, K]`, K odd, P = K // 2."""

    @staticmethod
    def forward(ctx: Any, v: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        v, weight = v.contiguous(), weight.contiguous()
        real = None if mask is None else mask.to(v.dtype).contiguous()
        ctx.save_for_backward(v, real, weight)
        return kernels.built("depthwise_conv").forward(v, real, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        v, real, weight = ctx.saved_tensors
        grad_v, grad_weight = kernels.built("depthwise_conv").backward(grad.contiguous(), v, real, weight)
        return grad_v, None, grad_weight


def depthwise_conv(v: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    """The skip of `v` through the kernel (the caller checked `applies`); see `DepthwiseConv`."""
    out: torch.Tensor = DepthwiseConv.apply(v, mask, weight)
    return out
