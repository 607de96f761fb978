"""Exact softmax attention with dropout on its weights, forward and backward without the n × n matrix (the
compiled kernel `flash_attention.cpp`; its header says what it computes and why).

The dropout mask is made inside the kernel from a 63-bit seed drawn from torch's default CPU generator at each
call, so a run stays reproducible from its seed and resumes bit-identically (the checkpoint restores that
generator), and the backward regenerates the same mask. Each weight is kept with probability 1 − p', where
p' = round(p · 2³²) / 2³², and kept weights are scaled by 1 / (1 − p'): the distribution of `nn.Dropout(p)` up to
that rounding, from another random stream (as a GPU's Philox stream is another stream too).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import torch

from models import kernels
from models.kernels import draw_seed, load


def kernel() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    return load("flash_attention")


def built() -> ModuleType:
    """The compiled module, for a caller that checked `kernel()` first."""
    return kernels.built("flash_attention")


class FlashDropoutAttention(torch.autograd.Function):
    """`softmax(q kᵀ / √d + bias) ⊙ keep / (1 − p) · v` with `q, k, v: [B, H, N, D]`, `bias: [B, N]` (0 for a key
    that is attended, −inf for one that is not)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, p: float, seed: int):
        b, h, n, d = q.shape
        scale = 1.0 / math.sqrt(d)
        flat = [per_head(t) for t in (q * scale, k, v)]
        bias_bh = bias_per_head(bias, h, q.dtype)
        out = built().forward(*flat, bias_bh, p, seed)
        ctx.save_for_backward(*flat, bias_bh, out)
        ctx.p, ctx.seed, ctx.scale, ctx.shape = p, seed, scale, (b, h)
        return out.view(b, h, n, v.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        q, k, v, bias_bh, out = ctx.saved_tensors
        b, h = ctx.shape
        grad = grad_out.reshape(out.shape).contiguous()
        delta = (grad * out).sum(-1).contiguous()
        dq, dk, dv = built().backward(grad, q, k, v, bias_bh, delta, ctx.p, ctx.seed)
        dq = (dq * ctx.scale).view(b, h, *dq.shape[1:])
        return dq, dk.view(b, h, *dk.shape[1:]), dv.view(b, h, *dv.shape[1:]), None, None, None


def key_bias(keys: torch.Tensor | None, batch: int, n_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """`[B, N]` additive bias: 0 for a key that is attended, −inf for one that is not (`keys`: bool, None = all)."""
    if keys is None:
        return torch.zeros(batch, n_keys, dtype=dtype)
    return torch.zeros(keys.shape, dtype=dtype).masked_fill_(~keys, float("-inf"))


def per_head(t: torch.Tensor) -> torch.Tensor:
    """`[B, H, N, D]` → the contiguous `[B·H, N, D]` the kernel walks."""
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


def bias_per_head(bias: torch.Tensor, heads: int, dtype: torch.dtype) -> torch.Tensor:
    """`[B, N]` key bias → the contiguous `[B·H, N]` the kernel walks, one row per (batch, head)."""
    return (
        bias[:, None, :].expand(bias.shape[0], heads, bias.shape[-1]).reshape(-1, bias.shape[-1]).to(dtype).contiguous()
    )


def flash_dropout_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor | None, p: float, seed: int | None = None
) -> torch.Tensor:
    """Attention of `q` over the keys where `keys` (`[B, N]` bool, True = attended; None = all) with dropout `p` on
    the weights; `seed` fixes the mask (drawn from torch's generator when None)."""
    bias = key_bias(keys, k.shape[0], k.shape[-2], q.dtype)
    return FlashDropoutAttention.apply(q, k, v, bias, float(p), draw_seed() if seed is None else int(seed))
