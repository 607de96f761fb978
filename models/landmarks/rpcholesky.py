"""Randomly pivoted Cholesky landmarks (Chen, Epperly, Tropp & Webber, arXiv 2207.06503) on the exp kernel of keys.

RPCholesky builds a rank-m Nyström approximation of a PSD kernel matrix K from m of its columns. It keeps the
residual diagonal d (initially diag K); each step draws a pivot s with probability d_s / Σd, forms the residual
column g = K[:, s] − F F[s]ᵀ, appends g/√g_s to F and updates d ← d − (g/√g_s)². m steps cost O(N·m²)
arithmetic plus m kernel columns (O(N·D) each); the N×N matrix never exists. It is the randomized
counterpart of greedy pivoting (`pivoted_qr`) with a near-optimal expected trace-norm error.

The kernel (which matrix RPCholesky runs on). Softmax attention A is not PSD, so the selector works on the
keys alone, with WildCat's kernel (Schröder & Mackey, arXiv 2602.10056; microsoft/wildcat@93e0a28
`wildcat/compress_kv.py`): the exp kernel κ(k_i, k_j) = exp(k̃_i·k̃_j / τ²) of the keys k (already scaled so
that q·k are the attention logits, i.e. k = k₀·d^(-1/4)), centred (k̃ = k − mean of the real keys, as the
official module does before compressing; `center: false` skips it) and cooled by the temperature τ. These are
the features exp(⟨k_j, ·⟩) every column of A is built from, so the same selector serves `wildcat` (whose
Nyström weights use this kernel) and any other attention that takes token landmarks (`nystrom`, `pivoted`, …).
`tau: auto` is the official rule τ² = ρ·max‖k̃‖ / max‖q‖ with ρ = 3.94582 (per sequence and head, over real
tokens); a number fixes τ.

Numerics follow the official code: the exp kernel is handled through the Gaussian kernel of the features
z = k̃/τ, G_ij = exp(−‖z_i − z_j‖²/2) = κ_ij·e^{−‖z_i‖²/2}·e^{−‖z_j‖²/2} (entries ≤ 1, unit diagonal), whose
residual diagonal d^G relates to κ's by d^κ_i = e^{‖z_i‖²}·d^G_i; pivots are drawn ∝ d^G·e^{‖z‖²} in the log
domain, which is exactly RPCholesky on κ without overflow. Everything runs on detached fp32 under `no_grad`
(the pivots are a discrete choice; the landmarks' queries and keys stay differentiable).

Draws: one uniform per step from the selector's own generator (`SeededSelector`: a training stream saved with
the model; a fixed per-(head, step) draw in eval mode), turned into a pivot by inverting the CDF of the
weights over positions. Pads and chosen tokens have weight exactly 0 and are never drawn, and trailing padding
does not change any prefix sum, so a sequence's landmarks do not depend on its padding. A step whose pivot has
a normalised residual ≤ `tol` (numerically no new direction: duplicate keys, or rank exhausted) leaves its slot
invalid, as does a step with nothing left to draw (fewer real tokens than m).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models import kernels
from models.cost import Flops, Params
from models.kernels import rpcholesky_pivots
from models.knobs import follows_run_seed
from models.landmarks.base import Landmarks, length_groups
from models.landmarks.kmeans import exact_fp32
from models.landmarks.uniform import DataDrivenTokenSelector, token_landmarks

#: the official temperature constant (microsoft/wildcat@93e0a28, `find_kernel_temperature`): τ² = ρ·‖k‖∞/‖q‖∞
RHO = 3.94582


def check_tau(tau: Any, key: str) -> float | str:
    """`tau` is "auto" or a positive number; anything else is one clear error naming `key`."""
    if isinstance(tau, str):
        if tau != "auto":
            raise ValueError(f"{key}={tau!r}: expected 'auto' or a positive number")
        return tau
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
        raise ValueError(f"{key}={tau!r}: expected 'auto' or a positive number")
    return float(tau)


def centred_keys(k: torch.Tensor, real: torch.Tensor, center: bool) -> torch.Tensor:
    """The keys over the real tokens (`real [B, 1, N, 1]`, 0/1 in k's dtype), centred on their mean when `center`:
    k̃, pads exactly 0. Differentiable."""
    k = k * real
    if center:
        mean = k.sum(-2, keepdim=True) / real.sum(-2, keepdim=True).clamp_min(1.0)
        k = (k - mean) * real
    return k


def temperature(k_max: torch.Tensor, q_max: torch.Tensor) -> torch.Tensor:
    """The official rule τ = √(ρ·max‖k̃‖ / max‖q‖) from the two maxima `[B, H]` (each floored at the dtype's tiny)."""
    tiny = torch.finfo(k_max.dtype).tiny
    return torch.sqrt(RHO * k_max.clamp_min(tiny) / q_max.clamp_min(tiny))


def key_features(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, tau: float | str, center: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's features: z = k̃/τ `[B, H, N, D]` (so κ = exp(z zᵀ)) and the centred keys k̃.

    `q`, `k` are logit-scaled (q·k = logits); `mask [B, 1, N]` bool. Means and norms are over real tokens
    only; padded rows of z and k̃ are zero. Differentiable; callers that only choose pivots pass detached inputs
    (WildCat takes the same values through `centred_keys` and `temperature`, its gradient otherwise).
    """
    real = mask.unsqueeze(-1).to(k.dtype)  # [B, 1, N, 1]
    k = centred_keys(k, real, center)
    if tau == "auto":
        t = temperature(k.norm(dim=-1).amax(-1), (q * real).norm(dim=-1).amax(-1))[..., None, None]
    else:
        t = torch.full((), float(tau), dtype=k.dtype, device=k.device)
    return k / t, k


def rpcholesky(
    z: torch.Tensor,
    eligible: torch.Tensor,
    m: int,
    u: torch.Tensor,
    tol: float,
    bins: torch.Tensor | None = None,
    num_bins: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """m RPCholesky pivots of κ = exp(z zᵀ), batched over the leading dims (see the module docstring).

    `z [B, H, N, D]` fp32 (detached), `eligible [B, H, N]` bool (real tokens), `u [B, H, m]` uniforms in [0, 1).
    With `bins [B, H, N]` (bin ids in [0, num_bins)) the kernel is block-diagonal over bins and step t draws
    from bin t mod num_bins: an independent RPCholesky per bin with ⌈m/C⌉ or ⌊m/C⌋ pivots each (WildCat's
    `num_bins`). Returns pivot indices and validity `[B, H, m]` (invalid slots point at token 0).

    Runs on groups of sequences of similar length, each cut after its last eligible column (`length_groups`):
    every step re-reads z and the factor over all N columns, memory-bound, and the trailing padding is never
    drawn — a column past the last eligible one has weight 0 at the end of the cumulative sum, so the draws, the
    kernel columns and the pivots are those of the full width (each sequence's are independent of the others').
    """
    b, h, n, _ = z.shape
    groups = length_groups(eligible, m)
    if len(groups) == 1 and groups[0][1] == n:
        return _rpcholesky_steps(z, eligible, m, u, tol, bins, num_bins)
    idx = z.new_zeros(b, h, m, dtype=torch.long)
    ok = z.new_zeros(b, h, m, dtype=torch.bool)
    for rows, width in groups:
        part = None if bins is None else bins[rows, :, :width]
        idx[rows], ok[rows] = _rpcholesky_steps(
            z[rows, :, :width], eligible[rows, :, :width], m, u[rows], tol, part, num_bins
        )
    return idx, ok


def _rpcholesky_steps(
    z: torch.Tensor,
    eligible: torch.Tensor,
    m: int,
    u: torch.Tensor,
    tol: float,
    bins: torch.Tensor | None,
    num_bins: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The m steps of `rpcholesky` on all of `z`'s columns."""
    b, h, n, _ = z.shape
    half_sq = 0.5 * z.pow(2).sum(-1)  # ‖z‖²/2, [B, H, N]
    resid = eligible.to(z.dtype)  # residual diagonal of the Gaussian kernel G (unit diagonal)
    chosen = ~eligible
    factor = z.new_zeros(b, h, m, n)  # Fᵀ (G ≈ F Fᵀ over the pivots so far), pivot-major: row slices are contiguous
    picks, valid = [], []
    two_half_sq = 2.0 * half_sq
    for t in range(m):
        allowed = resid > 0  # chosen tokens and pads have resid exactly 0 (masked at the end of every step)
        if bins is not None:
            allowed = allowed & (bins == t % num_bins)
        # log only where drawable: clamp_min(1e-38) of the zeros elsewhere gives subnormals, whose log is 5x slower
        logw = (torch.where(allowed, resid, 1.0).clamp_min(1e-38).log() + two_half_sq).masked_fill(
            ~allowed, float("-inf")
        )
        top = logw.amax(-1, keepdim=True)
        has = torch.isfinite(top)  # [B, H, 1]
        cdf = torch.exp(logw - top.nan_to_num(0.0, neginf=0.0)).cumsum(-1)  # weights ∝ d^G·e^{‖z‖²}
        total = cdf[..., -1:].contiguous()
        j = torch.searchsorted(cdf, (u[..., t : t + 1] * total).contiguous(), right=True)
        j = torch.minimum(j, torch.searchsorted(cdf, total)).clamp_max(n - 1)  # u·total rounding up to total
        z_j = z.gather(-2, j[..., None].expand(b, h, 1, z.shape[-1]))  # [B, H, 1, D]
        col = torch.exp((z @ z_j.transpose(-1, -2)).squeeze(-1) - half_sq - half_sq.gather(-1, j))  # G[:, j]
        if bins is not None:
            col = col * (bins == bins.gather(-1, j)).to(col.dtype)
        if t:
            f_j = factor[..., :t, :].gather(-1, j[..., None].expand(b, h, t, 1))  # F[j]ᵀ, [B, H, t, 1]
            col = col - (f_j.transpose(-1, -2) @ factor[..., :t, :]).squeeze(-2)
        g_j = col.gather(-1, j)
        ok = has & (g_j > tol)
        f = col * (ok.to(col.dtype) * g_j.clamp_min(tol).rsqrt())
        factor[..., t, :] = f
        resid = (resid - f.pow(2)).clamp_min(0.0)
        chosen = chosen | torch.zeros_like(chosen).scatter(-1, j, has)  # nothing drawn: nothing taken
        resid = resid.masked_fill(chosen, 0.0)
        picks.append(j.squeeze(-1))
        valid.append(ok.squeeze(-1))
    if not picks:
        return z.new_zeros(b, h, 0, dtype=torch.long), z.new_zeros(b, h, 0, dtype=torch.bool)
    idx, ok = torch.stack(picks, -1), torch.stack(valid, -1)
    return torch.where(ok, idx, torch.zeros_like(idx)), ok


@dataclass
class RPCholeskyConfig:
    """Randomly pivoted Cholesky (arXiv 2207.06503) on the exp kernel of the centred keys; token landmarks.
    Under attn=wildcat the kernel is the attention's (attn.tau, attn.center_keys); these apply elsewhere."""

    name: str = "rpcholesky"
    tau: Any = "auto"  # kernel temperature: auto (WildCat's rule τ² = 3.94582·max‖k‖/max‖q‖) or a number
    center: bool = True  # centre the keys over the real tokens before taking the kernel
    tol: float = 1.0e-5  # a pivot whose normalised residual is <= tol leaves its slot invalid
    seed: int = follows_run_seed()


class RPCholeskySelector(DataDrivenTokenSelector):
    config = RPCholeskyConfig  # the draws follow the kernel's residual

    def configure(self, cfg: RPCholeskyConfig) -> None:
        super().configure(cfg)
        self.tau = check_tau(cfg.tau, "selector.tau")
        self.center, self.tol = bool(cfg.center), float(cfg.tol)

    def pivots(
        self,
        z: torch.Tensor,
        eligible: torch.Tensor,
        m: int,
        bins: torch.Tensor | None = None,
        num_bins: int = 1,
        fused: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RPCholesky pivots of exp(z zᵀ) for given features (WildCat passes its own kernel's), own draws. `fused`:
        through the compiled loop (`models.kernels.rpcholesky_pivots`) where it applies — the same draws, the same
        pivots unless a draw falls within fp32 rounding of a boundary of the cumulative weights."""
        b, h = z.shape[:2]
        with exact_fp32(z.device):
            u = self.uniform((b, h, m), z.device)
            features, drawable = z.detach().float(), eligible.expand(b, h, -1)
            if fused and kernels.applies("rpcholesky_pivots", features):
                return rpcholesky_pivots.pivots(features, drawable, u, self.tol, bins, num_bins)
            return rpcholesky(features, drawable, m, u, self.tol, bins, num_bins)

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        with exact_fp32(q.device):
            z, _ = key_features(q.detach().float(), k.detach().float(), mask, self.tau, self.center)
        idx, valid = self.pivots(z, mask, m)
        return token_landmarks(q, k, idx, valid)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        # m steps, each one kernel column (Z z_j: 2nd) and its residual against the factor so far (F F[j]ᵀ: 2n·t at
        # step t); the centring, the draws (a cumulative sum) and the downdates are elementwise
        return Flops(0.0, 2.0 * n * d * m + n * m * (m - 1.0))
