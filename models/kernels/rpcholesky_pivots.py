"""Randomly pivoted Cholesky's pivots, one pass per sequence and head in cache (the compiled kernel
`rpcholesky_pivots.cpp`; its header says why and what it computes). The eager loop it replaces, and the draws it
takes, are `models.landmarks.rpcholesky`'s.

The kernel is called as a torch operator (`torch.ops.lra_bench.rpcholesky_pivots`) with a FLOP formula, so that
torch's FLOP counter — the step benchmark's limit and the cost tests — still sees the products the pivots compute
(the eager loop's are batched matmuls, which it counts; a plain call into the compiled module is invisible to it)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch.utils.flop_counter import register_flop_formula

from models import kernels
from models.kernels import load


def kernel() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    return load("rpcholesky_pivots")


@torch.library.custom_op("lra_bench::rpcholesky_pivots", mutates_args=())
def pivots_op(
    z: torch.Tensor, eligible: torch.Tensor, u: torch.Tensor, bins: torch.Tensor, num_bins: int, tol: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled kernel on flat rows: `z [R, N, D]`, `eligible [R, N]`, `u [R, m]`, `bins [R, N]` or empty."""
    idx, ok = kernels.built("rpcholesky_pivots").pivots(z, eligible, u, bins, num_bins, tol)
    return idx, ok


@register_flop_formula(torch.ops.lra_bench.rpcholesky_pivots, get_raw=True)
def pivots_flops(z: torch.Tensor, eligible: torch.Tensor, u: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """The eager loop's products on each row's extent w (what the kernel computes): per step t a kernel column
    Z z_j (2wD) and its residual F F[j]ᵀ (2wt) — `RPCholeskySelector.flops` at n = w."""
    d, m = z.shape[-1], u.shape[-1]
    pos = torch.arange(1, eligible.shape[-1] + 1, device=eligible.device)
    widths = (eligible * pos).amax(-1) if eligible.numel() else pos.new_zeros(0)
    return int(widths.sum()) * (2 * d * m + m * (m - 1))


def pivots(
    z: torch.Tensor, eligible: torch.Tensor, u: torch.Tensor, tol: float, bins: torch.Tensor | None, num_bins: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`models.landmarks.rpcholesky.rpcholesky`'s pivots and validity `[B, H, m]` (m = the draws' `u [B, H, m]`), from
    the compiled kernel, for a caller that checked `kernels.applies("rpcholesky_pivots", z)`; the other arguments
    are that function's."""
    (b, h, n, d), m = z.shape, u.shape[-1]
    rows = b * h
    flat_bins = torch.empty(0, dtype=torch.long) if bins is None else bins.expand(b, h, n).reshape(rows, n)
    idx, ok = pivots_op(
        z.detach().reshape(rows, n, d).contiguous(),
        eligible.expand(b, h, n).reshape(rows, n).contiguous(),
        u.to(z.dtype).reshape(rows, m).contiguous(),
        flat_bins.long().contiguous(),
        int(num_bins),
        float(tol),
    )
    return idx.view(b, h, m), ok.view(b, h, m)
