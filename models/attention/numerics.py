"""Numerics every landmark attention shares: masked softmax, the fp32 core, pseudo-inverses.

Small cores (m×m) are always solved in fp32 with autocast off: cuSOLVER has no half-precision pinv/eigh
and the iterative pseudo-inverse loses its cubic convergence in bf16.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def fp32_core(device: torch.device) -> Iterator[None]:
    """Disable autocast for the enclosed small linear algebra (callers cast their inputs with `.float()`)."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def masked_softmax(scores: torch.Tensor, key_valid: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim with invalid keys at weight exactly 0.

    `key_valid` broadcasts against `scores`. A row whose keys are all invalid returns zeros, not NaN.
    """
    if key_valid is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~key_valid, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights * key_valid.to(weights.dtype)


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
    """`torch.linalg.pinv` in fp32 (the reference for approximation studies).

    Singular values below `rtol·σ₁` are dropped: softmax cores of nearly coincident landmarks are numerically
    singular, and inverting their fp32 noise floor (rtol 1e-6) gave outputs hundreds of times ‖A‖."""
    return torch.linalg.pinv(a.float(), rtol=rtol)


def stable_pinv(a: torch.Tensor) -> torch.Tensor:
    """The stable reference solve every small core can use (Nyström cores, WildCat's r×r kernel, …).

    Interface fixed here; the policy (cut-off / ridge) is documented where it is chosen. Computed in fp32 (fp64
    when given fp64) under the caller's `fp32_core`. Current policy: SVD pseudo-inverse with torch's default
    spectrum-relative cut-off max(m, n)·eps·σ₁, which reproduces a matrix covered exactly by its landmarks to
    float precision.
    """
    a = a if a.dtype == torch.float64 else a.float()
    return torch.linalg.pinv(a)
