"""Local (sliding-window) attention, forward and backward, one (batch, head) slab at a time on the head-major
`[B, H, N, D]` layout (the compiled kernel `local_attention.cpp`; its header says what it computes and why): the
eager blocked form's values (`LocalAttention.forward`) at fp32 rounding, without its unfolded windows, mask tensors
and folded-back gradients."""

from __future__ import annotations

import math
from typing import Any

import torch

from models import kernels
from models.kernels.flash_attention import key_bias

#: query rows per block: their tile of scores, `rows × (rows + 2w)`, stays in cache (at w = 64, 20 KiB). At the
#: protocol's shape (B 32, H 2, N 2048, D 32, w 64, one Zen 5 thread) forward + backward took 141–144 ms at 16–32
#: rows, 153 at 48, 157 at 64, 194 at 128 (a wider tile scores more keys outside the band), 156 at 8 (more, smaller
#: products)
BLOCK_ROWS = 32


def applies(q: torch.Tensor) -> bool:
    """Whether the kernel computes local attention of `q`: a CPU tensor of fp32 or fp64 where the kernel is built."""
    return kernels.applies("local_attention", q)


class LocalWindowAttention(torch.autograd.Function):
    """`softmax(q kᵀ/√d + bias)` over each query's band `[i − left, i + right]`, times `v`; `q, k, v: [B, H, N, D]`,
    `bias: [B, N]` (0 for an attended key, −inf for a pad); a query whose band has no attended key gets 0."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, left: int, right: int
    ) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        ctx.band = (1.0 / math.sqrt(q.shape[-1]), left, right, BLOCK_ROWS)
        ctx.save_for_backward(q, k, v, bias)
        return kernels.built("local_attention").forward(q, k, v, bias, *ctx.band)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        q, k, v, bias = ctx.saved_tensors
        dq, dk, dv = kernels.built("local_attention").backward(grad.contiguous(), q, k, v, bias, *ctx.band)
        return dq, dk, dv, None, None, None


def local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, window: int, causal: bool
) -> torch.Tensor:
    """Each query's attention over the real keys at most `window` positions away (causal: and not after it), through
    the kernel (the caller checked `applies`); `mask [B, N]` bool, True = real token, None = no padding."""
    bias = key_bias(mask, q.shape[0], q.shape[-2], q.dtype)
    out: torch.Tensor = LocalWindowAttention.apply(q, k, v, bias, window, 0 if causal else window)
    return out
