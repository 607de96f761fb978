"""Pivoted-QR landmarks' sketch and greedy pivots, one pass per sequence and head in cache (the compiled kernel
`pivoted_qr.cpp`; its header says why and what it computes). The eager form it replaces is
`models.landmarks.pivoted_qr`'s `sketch_rows_softmax` and `greedy_pivots`.

The kernel is called as a torch operator (`torch.ops.lra_bench.pivoted_qr_pivots`) with a FLOP formula, so that
torch's FLOP counter still sees the products the eager form computes (its batched matmuls are counted; a plain call
into the compiled module is invisible to the counter)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch.utils.flop_counter import register_flop_formula

from models import kernels
from models.kernels import load


def kernel() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    return load("pivoted_qr")


@torch.library.custom_op("lra_bench::pivoted_qr_pivots", mutates_args=())
def pivots_op(
    qs: torch.Tensor, k: torch.Tensor, eligible: torch.Tensor, rows_valid: torch.Tensor, m: int, tol: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled kernel on flat rows: `qs [R, ℓ, D]`, `k [R, N, D]`, `eligible [R, N]`, `rows_valid [R, ℓ]`."""
    idx, ok = kernels.built("pivoted_qr").pivots(qs, k, eligible, rows_valid, m, tol)
    return idx, ok


@register_flop_formula(torch.ops.lra_bench.pivoted_qr_pivots, get_raw=True)
def pivots_flops(
    qs: torch.Tensor,
    k: torch.Tensor,
    eligible: torch.Tensor,
    rows_valid: torch.Tensor,
    m: int,
    *args: Any,
    **kwargs: Any,
) -> int:
    """The eager form's products on each row's extent w (its last eligible key + 1; the eager loop runs on its
    length group's, at least as wide): the sketch Q_S Kᵀ over all N keys (2ℓND), and per step t of min(m, w) the
    mat-vec qᵀA (2ℓw) and the residual and two re-orthogonalisations against the t directions so far (10ℓt)."""
    rows, ell, d = qs.shape
    pos = torch.arange(1, eligible.shape[-1] + 1, device=eligible.device)
    widths = (eligible * pos).amax(-1).tolist() if eligible.numel() else []
    greedy = sum(min(m, w) * 2 * ell * w + 5 * ell * min(m, w) * (min(m, w) - 1) for w in widths)
    return int(rows * 2 * ell * k.shape[1] * d + greedy)


def pivots(
    q_rows: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, rows_valid: torch.Tensor, m: int, tol: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`greedy_pivots(sketch_rows_softmax(…))`'s pivots and validity `[B, H, m]` from the compiled kernel, for a
    caller that checked `kernels.applies("pivoted_qr", …)`: `q_rows [B, H, ℓ, D]` (the sketch's gathered queries),
    `k [B, H, N, D]`, `mask [B, 1, N]`, `rows_valid [B, H, ℓ]`."""
    b, h, ell, d = q_rows.shape
    n = k.shape[-2]
    idx, ok = pivots_op(
        q_rows.detach().reshape(b * h, ell, d).contiguous(),
        k.detach().reshape(b * h, n, d).contiguous(),
        mask.expand(b, h, n).reshape(b * h, n).contiguous(),
        rows_valid.reshape(b * h, ell).contiguous(),
        int(m),
        float(tol),
    )
    return idx.view(b, h, m), ok.view(b, h, m)
