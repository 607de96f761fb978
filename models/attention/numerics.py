"""Numerics every landmark attention shares: masked softmax, the fp32 core, pseudo-inverses.

Small cores (m×m) are always solved in fp32 with autocast off: cuSOLVER has no half-precision pinv/eigh
and the iterative pseudo-inverse loses its cubic convergence in bf16.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from models.cpu import below_vector_width


@contextlib.contextmanager
def fp32_core(device: torch.device) -> Iterator[None]:
    """Disable autocast for the enclosed small linear algebra (callers cast their inputs with `.float()`)."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def core_precision(x: torch.Tensor) -> torch.Tensor:
    """The precision small cores are solved in: fp64 inputs stay fp64 (the approximation study), anything else
    becomes fp32 (training, whatever the autocast dtype)."""
    return x if x.dtype == torch.float64 else x.float()


def masked_softmax(scores: torch.Tensor, key_valid: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    """Softmax over `dim` (the keys' axis, the last by default) with invalid keys at weight exactly 0.

    `key_valid` broadcasts against `scores`. A row whose keys are all invalid returns zeros, not NaN.

    Invalid keys get the dtype's lowest value through an additive bias of the mask's (small, broadcast) shape,
    not `masked_fill`: min + s rounds to min for any score |s| < 10³¹, so the softmax sees the same values, and the
    gradient passes through the addition untouched — a masked key's weight is exactly 0, so its score's gradient
    w·(g − Σwg) is already 0, and `masked_fill`'s backward (a clone and a second fill of the [B, H, n, m] gradient)
    only re-zeroed it. An invalid key's weight is exp(min − max) = 0 exactly in a row that has a valid key, so the
    final multiply by the mask only changes rows without one; on a CPU (where asking costs no device sync) it is
    skipped when every row has a valid key. Both give the same values and gradients bit for bit
    (`tests/test_numerics.py`), with four fewer passes over the [B, H, n, m] weights per call.
    """
    if key_valid is None:
        return torch.softmax(scores, dim=dim)
    lowest = torch.finfo(scores.dtype).min
    bias = torch.zeros(key_valid.shape, dtype=scores.dtype, device=scores.device).masked_fill_(~key_valid, lowest)
    weights = torch.softmax(scores + bias, dim=dim)
    if scores.device.type == "cpu" and bool(key_valid.any(dim=dim).all()):
        return weights
    return weights * key_valid.to(weights.dtype)


def masked_attention(scores: torch.Tensor, key_valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`masked_softmax(scores, key_valid) @ values`, bit for bit in values and gradients (finite inputs), with a
    query that has no valid key zeroed in the product `[…, rows, E]` instead of in the weights `[…, rows, keys]`.

    Why: the weights of such a row are uniform over invalid keys, and `masked_softmax` zeroes them with one more
    pass over the whole weights tensor; padded sequences have many such rows (every query block past a short
    sequence's end under `local`). Zeroing the row's output instead touches E columns instead of `keys`: the
    output and every gradient are the same (a zeroed output row sends no gradient to its weights, as zero weights
    did; in a row with a valid key the invalid keys' weights are exactly 0 either way)."""
    lowest = torch.finfo(scores.dtype).min
    bias = torch.zeros(key_valid.shape, dtype=scores.dtype, device=scores.device).masked_fill_(~key_valid, lowest)
    out = torch.softmax(scores + bias, dim=-1) @ values
    has_key = key_valid.any(dim=-1, keepdim=True)
    if scores.device.type == "cpu" and bool(has_key.all()):
        return out
    return out * has_key.to(out.dtype)


class TransposedProduct(torch.autograd.Function):
    """`aᵀ b` for `a [..., N, s]`, `b [..., N, E]` (a summary over the N tokens), both gradients row-major.

    Why: autograd's gradient of `a` in `a.transpose(-1, -2) @ b` is the transpose of a row-major `[s, N]` product,
    and an attention that also uses `a` as `a @ (…)` (Performer's φ(K), the spectral mixer's C) has its two gradients
    added across two layouts — a pass that reads one of them against its layout (~20 ms a [32, 2, 2048, 64] add on
    one Zen 5 thread, loaded; Performer's [32, 2, 2048, 256] features' multiply ~160 ms). Here `a`'s gradient is
    `b gᵀ` written row-major: the same dot products as autograd's `(g bᵀ)ᵀ` (fp32 rounding: the BLAS may add them in
    another order); the forward and `b`'s gradient (`a g`) are autograd's own calls."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a.transpose(-1, -2) @ b

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = b @ grad.transpose(-1, -2) if ctx.needs_input_grad[0] else None
        grad_b = a @ grad if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def transposed_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`aᵀ b` with both gradients row-major (`TransposedProduct`)."""
    out: torch.Tensor = TransposedProduct.apply(a, b)
    return out


class ProductWithTransposed(torch.autograd.Function):
    """`a bᵀ` for `a [..., n, E]`, `b [..., p, E]` (scores of n rows against p), both gradients row-major: `b`'s is
    `gᵀ a` written row-major, where autograd's is the transpose of a row-major `[E, p]` product — see
    `TransposedProduct` for why and for the rounding (Skyformer's κ(X_S, K) sends K's gradient so)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a @ b.transpose(-1, -2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = grad @ b if ctx.needs_input_grad[0] else None
        grad_b = grad.transpose(-1, -2) @ a if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def product_with_transposed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a bᵀ` with both gradients row-major (`ProductWithTransposed`)."""
    out: torch.Tensor = ProductWithTransposed.apply(a, b)
    return out


def landmark_weights(q: torch.Tensor, landmarks: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """softmax(q landmarksᵀ) over the m landmarks, `[B, H, N, m]`, invalid landmarks (`valid [B, H, m]`) at 0.

    Why a layout choice (`models.cpu`): torch's CPU softmax vectorises along the softmax axis, so a last axis of m
    shorter than a vector register runs in scalar tails, and the scores' m-column matmul is slow too. For such m
    the weights are computed as `[B, H, m, N]` (landmarks @ qᵀ, softmax along dim −2) and returned as a transposed
    view: the same values up to fp32 rounding (dot products and softmax sums in another order). Forward + backward
    49 → 30 ms per call at B=32, H=2, N=2048, D=32, m=11 on one AVX-512 thread, forward alone 27 → 6 ms. From
    m = 16 up the row layout is the faster one (21 vs 27 ms at m=16, 104 vs 132 at m=64) and is kept.
    """
    if below_vector_width(landmarks.shape[-2], q.device):
        scores = landmarks @ q.transpose(-1, -2)  # [B, H, m, N]
        return masked_softmax(scores, valid[..., :, None], dim=-2).transpose(-1, -2)
    return masked_softmax(q @ landmarks.transpose(-1, -2), valid[..., None, :])


def iterative_pinv(a: torch.Tensor, iterations: int = 6, init: str = "per_matrix") -> torch.Tensor:
    """Razavi et al.'s cubic Newton–Schulz pseudo-inverse, as used by Nyströmformer.

    Z₀ = Aᵀ / (‖A‖₁‖A‖_∞); Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))). `init="original"` takes the norms as
    maxima over the whole batch (Nyströmformer's code); `"per_matrix"` takes them per matrix, which converges
    faster and keeps each sequence's output independent of its batch-mates (our default).
    """
    a = a.float()
    col = a.abs().sum(dim=-2)  # [..., m] column sums → ‖A‖₁ per column
    row = a.abs().sum(dim=-1)
    if init == "original":
        scale = col.max() * row.max()
    elif init == "per_matrix":
        scale = (col.amax(-1) * row.amax(-1))[..., None, None]
    else:
        raise ValueError(f"pinv_init={init!r}: expected 'original' or 'per_matrix'")
    z = a.transpose(-1, -2) / scale
    eye = torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def exact_pinv(a: torch.Tensor, rtol: float = 1e-4) -> torch.Tensor:
    """`torch.linalg.pinv` in fp32 with singular values below `rtol·σ₁` dropped (`attn.pinv=exact`).

    Nearly the Moore–Penrose inverse, hence nearly the exact Nyström operator — which is ill-conditioned on
    cores the factors do not match (errors of many times ‖A‖ in the approximation study) — yet not exact: a
    covered core with σ_r < 1e-4·σ₁ loses directions. Kept for backward compatibility; the reference is
    `stable_pinv`."""
    return torch.linalg.pinv(a.float(), rtol=rtol)


def stable_pinv(a: torch.Tensor) -> torch.Tensor:
    """The stable reference solve every small core uses (`attn.pinv=stable`, the approximation study's reference,
    WildCat's r×r core): the SVD pseudo-inverse with singular values σ_i ≤ max(m, n)·eps·σ₁ dropped (eps of the
    working dtype: fp32 in training, fp64 when given fp64, as the study does), computed under the caller's
    `fp32_core`.

    Why this policy (measured on planted inputs, n = 1024, d = 32; the case generator is
    `lra_bench.approx.synthetic.covered_instances`, the property is `tests/test_stable_solve.py`):

    * *Exact where the landmarks determine A.* On 36 inputs covered exactly by their landmarks (16 planted
      clusters of identical tokens with one or two landmark tokens per cluster, planted rank-16 keys with one or
      two landmark tokens per distinct key; logit scale 1, 2, 3; 3 seeds) the covered core's σ_r/σ₁ spans
      3e-6 … 0.12. This cut-off reproduces all 36 to ≤ 1.2e-12 in fp64 and ≤ 2e-4 in fp32, and drops the exactly
      singular directions of duplicated landmarks instead of inverting their rounding noise. Larger cut-offs
      miss covered cases (1e-4·σ₁: 6 of 36, error up to 1.3e-2; 1e-2·σ₁: 23, up to 0.23); the 6-step
      iterative pseudo-inverse misses all 36 (median error 7.5e-2, up to 0.28).
    * *Cut-off, not ridge.* A ridge σ/(σ² + λ²) biases every covered case by ≈ (λ/σ_r)² (λ = 1e-6·σ₁: up to
      2e-5 in fp64, 1.8e-3 in fp32; 1e-4·σ₁: 1.3e-2), and a λ small enough to be exact in fp64 (1e-8·σ₁) sits
      below the fp32 rounding floor and amplifies the noise of duplicated landmarks (errors up to 0.65).
    * *What it does not do.* It does not make an ill-conditioned operator well-conditioned: where the Nyström
      factors do not match the core (landmarks that do not cover A), the exact Nyström operator itself has
      large errors — the same at cut-offs 1e-6, 1e-8 and 1e-12, so they are not rounding noise — and only a
      cut-off near 1e-2·σ₁ or the iterative pseudo-inverse suppresses them, by giving up exactness above. The
      approximation study therefore reports both solves and flags errors ≥ 1 (worse than Â = 0).
    """
    return torch.linalg.pinv(core_precision(a))


def max_row_norm(x: torch.Tensor, real: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """`(x·scale·real).norm(dim=-1).amax(-1)` `[B, H]` for `x [B, H, N, D]` (`real [B, 1, N, 1]`, 0/1 in x's dtype),
    with that value bit for bit and autograd's gradient (amax's: split evenly among rows that tie at the maximum,
    times the norm's derivative at those rows), at fp32 rounding.

    Why: autograd through the whole expression keeps x·scale·real and runs the norm's backward on every row — about
    five passes over x for a gradient that is zero on all but the maximal rows (WildCat's temperature, one per
    sequence and head, reads the largest key and query norms). Here the value is computed without a graph, and the
    gradient comes from the tied rows alone, gathered, through `value + (t − t.detach())` (t their norms averaged)."""
    differentiable = torch.is_grad_enabled() and x.requires_grad
    with torch.no_grad():
        rows = x * scale if scale != 1.0 else x
        if real is not None:
            rows = rows * real
        norms = rows.norm(dim=-1)  # [B, H, N]
        top = norms.amax(-1)
        if not differentiable:
            return top
        tie = norms == top.unsqueeze(-1)
        count = tie.sum(-1, keepdim=True)
        width = int(count.max()) if count.numel() else 0
        at = tie.to(x.dtype).topk(width, dim=-1).indices  # the tied rows first (fewer ties: padded with others)
        weight = tie.gather(-1, at).to(x.dtype) / count.clamp_min(1).to(x.dtype)
        keep = None if real is None else real.squeeze(-1).expand(tie.shape).gather(-1, at).unsqueeze(-1)
    picked = torch.gather(x, -2, at.unsqueeze(-1).expand(*at.shape, x.shape[-1])) * scale
    if keep is not None:
        picked = picked * keep
    tied = (picked.norm(dim=-1) * weight).sum(-1)
    return top + (tied - tied.detach())
