"""WildCat attention (Schröder & Mackey, arXiv 2602.10056): a weighted coreset of keys, Nyström weights.

With β = 1/√d, exact attention is softmax(βQKᵀ)V = (A V)/(A 1) for A = exp(βQKᵀ). WildCat keeps r key rows
K_S (the coreset, chosen by randomly pivoted Cholesky on the key kernel) and the Nyström weights
    W = exp((β/τ²) K_S K_Sᵀ)⁻¹ exp((β/τ²) K_S Kᵀ)   ∈ ℝ^{r×n},
and outputs  Â V / (Â 1)  with  Â = exp(βQK_Sᵀ) W,  evaluated right to left: O(n·r·d + r³), never n×n.
With every key in the coreset (r = n), W = I and the output is exact softmax attention.

Our reading, checked against the official code (microsoft/wildcat@93e0a28 `wildcat/compress_kv.py`,
`wildcat/rp_nystrom.py`; microsoft/wildcat@e0b728c `wildcat/wildcat.py`):
* Keys are centred over the real tokens first (`center_keys`), as the official module does: the shift only
  rescales each row of A, which the normalisation cancels, and it shortens the keys the kernel sees.
* The kernel of the coreset choice and of W is exp(k̃·k̃'/τ²) on the logit-scaled keys (k = k₀·d^(-1/4), so
  this is exp((β/τ²) k₀·k₀')); `tau: auto` is the official rule τ² = ρ·max‖k̃‖/max‖q‖, ρ = 3.94582, per
  sequence and head; a number fixes τ (`models/landmarks/rpcholesky.py` has the kernel and the pivots).
  With `selector=rpcholesky` (the default) the coreset is drawn on exactly this kernel; any other token
  selector (uniform, pivoted_qr, …) may supply the coreset instead.
* W is computed in the official, overflow-free way, through the Gaussian form of the kernel:
  W = D_S⁻¹ G_SS⁻¹ G_SK D with G = exp(−‖z_i − z_j‖²/2) (z = k̃/τ, unit diagonal) and D = diag(e^{‖z‖²/2}).
  The r×r core G_SS is solved in fp32 with autocast off (fp64 when given fp64) by the shared stable solve
  (`numerics.stable_pinv`), like every other core; invalid coreset slots are the identity there and drop out.
* `num_bins` (the official option): the real tokens are split by rank into C contiguous bins, the coreset has
  ⌈r/C⌉ or ⌊r/C⌋ keys per bin drawn by RPCholesky within the bin, and W is block-diagonal (each key is
  represented by its own bin's coreset). Formed densely with a mask here (no compute saved); needs
  `selector=rpcholesky`.
* Row normalisation: the Nyström weights can be negative, so Â1 can be ≤ 0 or tiny for a row. Our guard
  (the paper leaves it open; the official code outputs 0 for Â1 ≤ 1e-20) uses the exact partial row sum over
  the coreset, Σ_{s∈S} exp(βq·k_s), which is a true lower bound of the exact row sum A1:
      out_i = (Â V)_i / max((Â 1)_i, Σ_{s∈S} exp(βq_i·k_s)).
  It never changes a row whose estimate is plausible, keeps r = n exact, and is always > 0.
* `clamp_output` (off by default) applies the official code's inference-time safeguard: each output
  coordinate is clipped to the range of the values over the real tokens (exact attention is a convex
  combination of them). It is not part of Â, so `implied_matrix` omits it and forward no longer equals
  Â V where it acts; it also zeroes the gradient of clipped coordinates — hence off for training.
* `kernel: fused` (the default) draws the RPCholesky coreset with the compiled pivot loop
  (`models/kernels/rpcholesky_pivots.cpp`: the eager loop's pivots unless a draw lands within fp32 rounding of a
  boundary); `eager` runs the torch loop. Either way the differentiable path forms z only for the draw (see
  `_operator`) and sums the key side per sequence (`models/attention/wildcat_sums.py`).
* Not implemented from the official package: `subsample_ratio` (r is always `num_landmarks` here) and
  causal masking (the official code has none either). Padding is masked everywhere: pads are never in the
  coreset, carry no weight in W and take no part in the centring, τ or the bins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.attention.landmark import LandmarkAttention
from models.attention.numerics import fp32_core, max_row_norm, stable_pinv
from models.attention.wildcat_sums import KeySums, Links, extents
from models.cost import Flops, Params, pinv_flops
from models.landmarks.base import broadcast_mask, gather_tokens
from models.landmarks.rpcholesky import (
    RPCholeskyConfig,
    RPCholeskySelector,
    centred_keys,
    check_tau,
    temperature,
)
from models.landmarks.segment_means import segment_assignment

KERNELS = ("fused", "eager")


def clamp_to_values(out: torch.Tensor, v: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """`clamp_output`: each output coordinate clipped to the range of the values over the real tokens (`real
    [B, 1, N]`), the official code's inference safeguard."""
    big = torch.finfo(v.dtype).max
    rv = real.unsqueeze(-1)
    lo = v.masked_fill(~rv, big).amin(-2, keepdim=True)
    hi = v.masked_fill(~rv, -big).amax(-2, keepdim=True)
    return torch.minimum(torch.maximum(out, lo), hi)


@dataclass
class WildcatConfig:
    """WildCat (Schröder & Mackey, arXiv 2602.10056): a coreset of keys by randomly pivoted Cholesky, Nyström
    weights."""

    name: str = "wildcat"
    num_landmarks: Any = 64  # r, the coreset size (int or log2)
    tau: Any = "auto"  # kernel temperature of the coreset choice and the weights: auto (official rule) or a number
    center_keys: bool = True  # centre the keys over the real tokens first (exact for softmax; the official default)
    num_bins: int = 1  # C bins of real tokens, each with its own coreset (official num_bins; needs rpcholesky)
    clamp_output: bool = False  # clip outputs to the values' range (official inference safeguard; not part of Â)
    kernel: str = "fused"  # fused (CPU: the RPCholesky pivots in one compiled pass per sequence and head) | eager


class WildcatAttention(LandmarkAttention):
    config = WildcatConfig
    default_selector = "rpcholesky"

    #: the coreset must be tokens (checked by lra_bench.config.validate)
    needs_token_landmarks = True
    memory_width = 2.0  # G_SK, X, the left factor, the pivoting factor F

    def configure(self, cfg: WildcatConfig) -> None:
        super().configure(cfg)
        selector = self.selector
        self.tau = check_tau(cfg.tau, "attn.tau")
        self.center_keys, self.clamp_output = bool(cfg.center_keys), bool(cfg.clamp_output)
        self.num_bins = int(cfg.num_bins)
        if cfg.kernel not in KERNELS:
            raise ValueError(f"attn.kernel={cfg.kernel!r}: expected one of {', '.join(KERNELS)}")
        self.kernel = cfg.kernel
        if self.num_bins < 1:
            raise ValueError(f"attn.num_bins={cfg.num_bins!r}: expected a positive integer")
        rpc = isinstance(selector, RPCholeskySelector)
        if self.num_bins > 1 and not rpc:
            raise ValueError(
                f"attn.num_bins={cfg.num_bins} needs selector=rpcholesky (the per-bin coreset is part of its draw); "
                f"got {type(selector).__name__}"
            )
        if rpc:
            defaults = RPCholeskyConfig()
            own = (selector.tau, selector.center)
            if own != (self.tau, self.center_keys) and own != (defaults.tau, defaults.center):
                raise ValueError(
                    f"selector.tau={selector.tau!r}, selector.center={selector.center}: under attn=wildcat the "
                    f"coreset is drawn on the weights' kernel; set attn.tau / attn.center_keys instead"
                )

    def _coreset(
        self, q: torch.Tensor, k: torch.Tensor, scale: float, z: torch.Tensor, mask: torch.Tensor | None, r: int, bins
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices and validity `[B, H, r]` of the coreset: RPCholesky on our kernel, or any token selector (given
        the logit-scaled queries and keys)."""
        real = broadcast_mask(mask, q)
        if isinstance(self.selector, RPCholeskySelector):
            bin_ids = None if bins is None else bins.expand(z.shape[:3])
            return self.selector.pivots(z, real, r, bin_ids, self.num_bins, fused=self.kernel == "fused")
        lm = self.selector(q * scale, k * scale, mask, r)
        if lm.indices is None:
            raise ValueError(
                f"attn=wildcat needs token landmarks; selector {type(self.selector).__name__} returns cluster means"
            )
        return lm.indices, lm.valid

    def _temperature(self, q: torch.Tensor, keys: torch.Tensor, real: torch.Tensor, scale: float) -> torch.Tensor:
        """τ `[B, H, 1, 1]` (a scalar when fixed) of the logit-scaled queries `q·scale` and centred keys `keys`: the
        official rule's value exactly as `key_features` computes it, its gradient through the maximal rows only
        (`max_row_norm`)."""
        if self.tau != "auto":
            return torch.full((), float(self.tau), dtype=keys.dtype, device=keys.device)
        return temperature(max_row_norm(keys), max_row_norm(q, real, scale))[..., None, None]

    def _operator(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, clamp: bool
    ) -> torch.Tensor:
        """out = (Â rhs) / (Â 1) for any right-hand side `v [B, H, N, E]` (E = D in forward, N for Â itself).

        The coreset is drawn on exactly the features `key_features` gives (the same pivots as the selector alone);
        the differentiable path never forms z = k̃/τ over all keys: 1/τ and the logit scale join the r-row side of
        each product (z_s·zᵀ = (z_s/τ)·k̃ᵀ, (q·s)·k̃_sᵀ = q·(s·k̃_s)ᵀ: fp32 rounding), which saves the passes over
        [B, H, N, D] of z, of q·s and of their gradients (the temperature's among them)."""
        n, e = q.shape[-2], v.shape[-1]
        r = self.rank_budget(n)
        if self.num_bins > r:
            raise ValueError(f"attn.num_bins={self.num_bins} exceeds the coreset size r={r}; choose num_bins <= r")
        scale = q.shape[-1] ** -0.25
        real = broadcast_mask(mask, q)  # [B, 1, N]
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        neg_inf = float("-inf")
        with fp32_core(q.device):
            qf, vf = q.to(dtype), v.to(dtype)
            real_f = real.unsqueeze(-1).to(dtype)  # [B, 1, N, 1]
            kc = centred_keys(k.to(dtype) * scale, real_f, self.center_keys)  # k̃, logit-scaled
            t = self._temperature(qf, kc, real_f, scale)
            bins = segment_assignment(real, self.num_bins) if self.num_bins > 1 else None
            with torch.no_grad():
                z = kc / t  # the kernel's features, for the coreset only
            idx, valid = self._coreset(q, k, scale, z, mask, r, bins)
            kc_s = gather_tokens(kc, idx)
            z_s = kc_s / t
            hsq_s = 0.5 * z_s.pow(2).sum(-1)  # ‖z_s‖²/2, [B, H, r]
            pair = valid[..., :, None] & valid[..., None, :]  # [B, H, r, r]
            links = Links(valid, real)
            if bins is not None:
                links.bin_k = bins.expand(idx.shape[:2] + (n,))
                links.bin_s = bin_s = links.bin_k.gather(-1, idx)
                pair = pair & (bin_s[..., :, None] == bin_s[..., None, :])
            # the r×r core G_SS (Gaussian form, unit diagonal), invalid slots → identity
            core = torch.exp(z_s @ z_s.transpose(-1, -2) - hsq_s[..., :, None] - hsq_s[..., None, :])
            eye = torch.eye(r, device=core.device, dtype=core.dtype)
            core_inv = stable_pinv(torch.where(pair, core, eye))
            shift, x_rhs = self._key_sums(z_s / t, kc, hsq_s, vf, links)
            coef = core_inv @ x_rhs  # e^{h_s - M}·(W [V | 1])_s, [B, H, r, E + 1]
            # exp(βq·k_s)·e^{-h_s}, one shift per row (cancels in the ratio): entries ≤ 1
            b, h = idx.shape[:2]
            bias = (-hsq_s).masked_fill(~valid, neg_inf).reshape(b * h, 1, r)
            logits_q = torch.baddbmm(bias, qf.reshape(b * h, n, -1), (kc_s * scale).reshape(b * h, r, -1).mT)
            with torch.no_grad():
                row_shift = logits_q.amax(-1, keepdim=True).nan_to_num_(0.0, neginf=0.0)
            left = logits_q.sub_(row_shift).exp_().view(b, h, n, r)  # [B, H, N, r]
            # Σ_{s∈S} exp(βq·k_s) on the same scale as the last column: the partial row sum, one product with them
            partial_s = torch.exp(hsq_s - shift.squeeze(-1)).unsqueeze(-1)
            num, est, partial = (left @ torch.cat([coef, partial_s], dim=-1)).split([e, 1, 1], dim=-1)
            out = num / torch.maximum(est, partial).clamp_min(torch.finfo(dtype).tiny)
            if clamp:
                out = clamp_to_values(out, vf, real)
        return out.to(v.dtype)

    @staticmethod
    def _key_sums(
        zs: torch.Tensor, keys: torch.Tensor, hsq_s: torch.Tensor, v: torch.Tensor, links: Links
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """X·[V | 1] with X = G_SK·D scaled by one shift per head (e^{-M}, cancels in the ratio; entries ≤ 1), and
        that shift `[B, H, 1, 1]`: `KeySums`, per sequence over its keys up to its last real one
        (`models/attention/wildcat_sums.py` says why)."""
        return KeySums.apply(zs, keys, hsq_s, v, links, extents(links.real))

    def forward(self, q, k, v, mask):
        return self._operator(q, k, v, mask, self.clamp_output)

    def implied_matrix(self, q, k, mask):
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        return self.operator_matrix(q, k, mask, dtype, clamp=False)

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        r = int(m or 0)
        # the r×r Gaussian core Z_S Z_Sᵀ and its pseudo-inverse, G_SK = Z_S Zᵀ, G_SK·[V | 1], core⁺·(…), exp(Q K_Sᵀ),
        # left·(…) and left·e^{h_S} (the coreset's partial row sums, the denominator guard). The coreset itself is
        # the selector's (counted there). `num_bins` masks the same dense products (no saving in our implementation).
        diff = 2 * r * r * d + 2 * r * n * d + 2 * r * n * (d + 1) + 2 * r * r * (d + 1)
        diff += 2 * n * r * d + 2 * n * r * (d + 1) + 2 * n * r
        # backward: twice the products but for X·1, whose right factor (the key mask) takes no gradient (2rn); the
        # SVD-based pseudo-inverse: forward an estimate (`pinv_flops`), backward torch's formula, 8 r×r products
        return Flops(diff, backward=2.0 * diff - 2 * r * n) + Flops(pinv_flops(r, "exact", 0), backward=16.0 * r**3)
