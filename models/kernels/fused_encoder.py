"""The encoder's memory-bound chain in one pass per step, forward and backward (the compiled kernel
`fused_encoder.cpp`; its header says what each step computes and why): the biases of the linear layers added after
unbiased matmuls, bias + GELU + dropout, bias + dropout + residual add (and the embedding's position add + dropout),
and the head split/merge copies with the padding mask folded in; the unbiased products of the linear layers through
oneDNN (`product`).

Dropout masks are made inside the kernel from a seed drawn from torch's default generator at each call
(`models.kernels.draw_seed`; the hash of `hash_dropout.h`, as the flash-attention kernel's), so the backward
regenerates them, a run stays reproducible from its seed, and a resume (which restores that generator) draws the same
masks. Each element is kept with probability 1 − p', p' = round(p · 2³²) / 2³², and scaled by 1 / (1 − p'): the
distribution of `nn.Dropout(p)` up to that rounding, from another random stream than the eager path's
(`models.dropout`). Everything else is the eager encoder's arithmetic at fp32 rounding (the biases are added after
the product instead of inside it; bias gradients are summed in double).
"""

from __future__ import annotations

import math
from functools import cache
from types import ModuleType
from typing import Any

import torch
from torch.utils.flop_counter import register_flop_formula

from models import kernels
from models.kernels import draw_seed, load


def kernel() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    return load("fused_encoder")


def built() -> ModuleType:
    """The compiled module, for a caller that checked `kernel()` first."""
    return kernels.built("fused_encoder")


def applies(x: torch.Tensor) -> bool:
    """Whether the encoder's chain on `x` can go through the kernel: a CPU tensor in fp32 or fp64, outside autocast
    (whose bf16 products the kernel does not take), and the kernel built on this machine."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    return not torch.is_autocast_enabled("cpu") and kernel() is not None


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`[..., F]` → the contiguous `[rows, F]` the kernel walks."""
    return t.reshape(-1, t.shape[-1]).contiguous()


def _mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The key mask `[B, N]` as 1/0 in the data's dtype (None: every position attended)."""
    return None if mask is None else mask.to(dtype).contiguous()


class BiasDropoutAdd(torch.autograd.Function):
    """`residual + dropout(y + bias)` over `[..., F]`, `bias: [P, F]` repeating every P rows (P = 1: a linear
    layer's bias; P = N: a position embedding); `residual` may be None."""

    @staticmethod
    def forward(ctx: Any, residual: torch.Tensor | None, y: torch.Tensor, bias: torch.Tensor, p: float, seed: int):
        rows = _rows(y)
        out = built().bias_dropout_add_forward(
            None if residual is None else _rows(residual), rows, bias.contiguous(), p, seed
        )
        ctx.p, ctx.seed, ctx.bias_shape, ctx.has_residual = p, seed, bias.shape, residual is not None
        return out.view(y.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        grad_y, grad_bias = built().bias_dropout_add_backward(_rows(grad), ctx.bias_shape[0], ctx.p, ctx.seed)
        grad_residual = grad if ctx.has_residual else None
        return grad_residual, grad_y.view(grad.shape), grad_bias.view(ctx.bias_shape), None, None


class BiasDropoutAddNorm(torch.autograd.Function):
    """`out = residual + dropout(y + bias)` and `layer_norm(out)` (`weight`, `shift`, `eps`) from one pass per row:
    `BiasDropoutAdd` with the next sublayer's layer norm made while the row is in cache, and in the backward the norm's
    gradient added to out's in the same pass (autograd would add them in a pass of its own)."""

    @staticmethod
    def forward(
        ctx: Any,
        residual: torch.Tensor | None,
        y: torch.Tensor,
        bias: torch.Tensor,
        p: float,
        seed: int,
        weight: torch.Tensor,
        shift: torch.Tensor,
        eps: float,
    ):
        out, normed, stats = built().bias_dropout_add_norm_forward(
            None if residual is None else _rows(residual),
            _rows(y),
            bias.contiguous(),
            p,
            seed,
            weight.contiguous(),
            shift.contiguous(),
            eps,
        )
        ctx.save_for_backward(out, stats, weight)
        ctx.p, ctx.seed, ctx.bias_shape, ctx.has_residual = p, seed, bias.shape, residual is not None
        return out.view(y.shape), normed.view(y.shape)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_normed: torch.Tensor):
        out, stats, weight = ctx.saved_tensors
        total, grad_y, grad_bias, grad_weight, grad_shift = built().bias_dropout_add_norm_backward(
            _rows(grad_out), _rows(grad_normed), out, stats, weight.contiguous(), ctx.bias_shape[0], ctx.p, ctx.seed
        )
        grad_residual = total.view(grad_out.shape) if ctx.has_residual else None
        return (
            grad_residual,
            grad_y.view(grad_out.shape),
            grad_bias.view(ctx.bias_shape),
            None,
            None,
            grad_weight.view(weight.shape),
            grad_shift.view(weight.shape),
            None,
        )


class BiasGeluDropout(torch.autograd.Function):
    """`dropout(gelu(h + bias))` over `[..., F]`, `bias: [F]` (GELU exact, with erf, as `nn.GELU()`)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, bias: torch.Tensor, p: float, seed: int):
        rows = _rows(h)
        out = built().bias_gelu_dropout_forward(rows, bias.contiguous(), p, seed)
        ctx.save_for_backward(rows, bias)
        ctx.p, ctx.seed = p, seed
        return out.view(h.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        rows, bias = ctx.saved_tensors
        grad_h, grad_bias = built().bias_gelu_dropout_backward(_rows(grad), rows, bias.contiguous(), ctx.p, ctx.seed)
        return grad_h.view(grad.shape), grad_bias.view(bias.shape), None, None


class SplitHeads(torch.autograd.Function):
    """The qkv projection `[B, N, 3·H·D]` (without its bias) + `bias` → q, k, v `[B, H, N, D]`, each contiguous, v
    times the key mask `[B, N]` (pads carry no value)."""

    @staticmethod
    def forward(ctx: Any, proj: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None, heads: int):
        batch = proj.shape[0]
        weights = _mask(mask, proj.dtype)
        q, k, v = built().split_heads_forward(_rows(proj), bias.contiguous(), weights, batch, heads)
        ctx.weights, ctx.shape = weights, proj.shape
        return q, k, v

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor | None, dk: torch.Tensor | None, dv: torch.Tensor | None):
        like = next(g for g in (dq, dk, dv) if g is not None)
        grads = [torch.zeros_like(like) if g is None else g for g in (dq, dk, dv)]  # read through their strides
        dproj, dbias = built().split_heads_backward(*grads, ctx.weights)
        return dproj.view(ctx.shape), dbias, None, None


class MergeHeads(torch.autograd.Function):
    """`ctx [B, H, N, D]` → `[B, N, H·D]` times the key mask `[B, N]` (pads receive no output)."""

    @staticmethod
    def forward(ctx: Any, heads_ctx: torch.Tensor, mask: torch.Tensor | None):
        b, h, n, d = heads_ctx.shape
        weights = _mask(mask, heads_ctx.dtype)
        out = built().merge_heads_forward(heads_ctx, weights)  # read through its strides
        ctx.weights, ctx.heads = weights, h
        return out.view(b, n, h * d)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        batch = grad.shape[0]
        return built().merge_heads_backward(_rows(grad), ctx.weights, batch, ctx.heads), None


class Product(torch.autograd.Function):
    """`x Wᵀ` of a linear layer without its bias (the chain adds it after), `x: [..., K]`, `weight: [F, K]`, through
    oneDNN's fp32 matmul: torch's `mm` goes to MKL, which at the encoder's shapes (65,536 token rows, K and F of
    64-192) reached 45-74 GFLOP/s against oneDNN's 49-91 on one Zen 4 thread (`aten::mm` vs
    `mkldnn::_linear_pointwise`, fp32 square-matmul rate 93). Each output is one dot product over K, so the two
    agree to fp32 rounding (bit for bit where both sum in order). The backward's input gradient is the same
    product with Wᵀ; the weight gradient (a K of 65,536 rows) stays torch's `mm`, as `F.linear`'s backward has it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor):
        rows = _rows(x)
        ctx.save_for_backward(rows, weight)
        ctx.shape = x.shape
        return _onednn(rows, weight).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        rows, weight = ctx.saved_tensors
        grad_rows = _rows(grad)
        grad_x = _onednn(grad_rows, weight.t().contiguous()).view(ctx.shape) if ctx.needs_input_grad[0] else None
        grad_weight = grad_rows.t().mm(rows) if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


def _onednn(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`rows @ weightᵀ` by oneDNN (`rows: [M, K]` contiguous, `weight: [F, K]`)."""
    return torch.ops.mkldnn._linear_pointwise(rows, weight.contiguous(), None, "none", [], "")


@cache  # a fact of this torch build, asked on every product
def onednn_products() -> bool:
    """Whether this torch has oneDNN's fp32 linear (a CPU build with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


if onednn_products():  # torch's FLOP counter knows `mm`, not this op: taught here, so a count sees the same products

    @register_flop_formula(torch.ops.mkldnn._linear_pointwise)
    def _linear_flops(input_shape: torch.Size, weight_shape: torch.Size, *args: Any, **kwargs: Any) -> int:
        """`rows @ weightᵀ`: 2 · rows · K · F."""
        return 2 * math.prod(input_shape[:-1]) * input_shape[-1] * weight_shape[0]


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x Wᵀ` without a bias: `Product` in fp32 where oneDNN is built in, `F.linear` otherwise (fp64: oneDNN has
    no fp64 matmul)."""
    if x.dtype == torch.float32 and onednn_products():
        return Product.apply(x, weight)
    return torch.nn.functional.linear(x, weight)


def _seed(p: float) -> int:
    """A fresh mask seed when the call drops anything (none drawn at p = 0, as the eager dropout draws none)."""
    return draw_seed() if p > 0.0 else 0


def bias_dropout_add(residual: torch.Tensor | None, y: torch.Tensor, bias: torch.Tensor, p: float) -> torch.Tensor:
    """`residual + dropout(y + bias)` (`p` already 0 outside training); see `BiasDropoutAdd`."""
    return BiasDropoutAdd.apply(residual, y, bias.reshape(-1, y.shape[-1]), float(p), _seed(p))


def bias_dropout_add_norm(
    residual: torch.Tensor | None, y: torch.Tensor, bias: torch.Tensor, p: float, norm: torch.nn.LayerNorm
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(x, norm(x))` for `x = residual + dropout(y + bias)` (`p` already 0 outside training); see
    `BiasDropoutAddNorm`."""
    x, normed = BiasDropoutAddNorm.apply(
        residual, y, bias.reshape(-1, y.shape[-1]), float(p), _seed(p), norm.weight, norm.bias, float(norm.eps)
    )
    return x, normed


def bias_gelu_dropout(h: torch.Tensor, bias: torch.Tensor, p: float) -> torch.Tensor:
    """`dropout(gelu(h + bias))` (`p` already 0 outside training); see `BiasGeluDropout`."""
    return BiasGeluDropout.apply(h, bias, float(p), _seed(p))


def split_heads(
    proj: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor | None, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v `[B, H, N, D]` from the unbiased qkv projection; see `SplitHeads`."""
    q, k, v = SplitHeads.apply(proj, bias, mask, heads)
    return q, k, v


def merge_heads(heads_ctx: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`[B, H, N, D]` → `[B, N, H·D]`, pads zeroed; see `MergeHeads`."""
    return MergeHeads.apply(heads_ctx, mask)
