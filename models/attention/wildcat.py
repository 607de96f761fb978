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
* Not implemented from the official package: `subsample_ratio` (r is always `num_landmarks` here) and
  causal masking (the official code has none either). Padding is masked everywhere: pads are never in the
  coreset, carry no weight in W and take no part in the centring, τ or the bins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.attention.landmark import LandmarkAttention
from models.attention.numerics import fp32_core, stable_pinv
from models.cost import Flops, Params, pinv_flops
from models.landmarks.base import broadcast_mask, gather_tokens, length_groups
from models.landmarks.rpcholesky import RPCholeskyConfig, RPCholeskySelector, check_tau, key_features
from models.landmarks.segment_means import segment_assignment


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
        self, q: torch.Tensor, k: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None, r: int, bins
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices and validity `[B, H, r]` of the coreset: RPCholesky on our kernel, or any token selector."""
        real = broadcast_mask(mask, q)
        if isinstance(self.selector, RPCholeskySelector):
            bin_ids = None if bins is None else bins.expand(z.shape[:3])
            return self.selector.pivots(z, real, r, bin_ids, self.num_bins)
        lm = self.selector(q, k, mask, r)
        if lm.indices is None:
            raise ValueError(
                f"attn=wildcat needs token landmarks; selector {type(self.selector).__name__} returns cluster means"
            )
        return lm.indices, lm.valid

    def _operator(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, clamp: bool
    ) -> torch.Tensor:
        """out = (Â rhs) / (Â 1) for any right-hand side `v [B, H, N, E]` (E = D in forward, N for Â itself)."""
        n = q.shape[-2]
        r = self.rank_budget(n)
        if self.num_bins > r:
            raise ValueError(f"attn.num_bins={self.num_bins} exceeds the coreset size r={r}; choose num_bins <= r")
        scale = q.shape[-1] ** -0.25
        real = broadcast_mask(mask, q)  # [B, 1, N]
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        with fp32_core(q.device):
            qf, kf, vf = q.to(dtype) * scale, k.to(dtype) * scale, v.to(dtype)
            z, kc = key_features(qf, kf, real, self.tau, self.center_keys)
            bins = segment_assignment(real, self.num_bins) if self.num_bins > 1 else None
            idx, valid = self._coreset(q * scale, k * scale, z, mask, r, bins)
            z_s, kc_s = gather_tokens(z, idx), gather_tokens(kc, idx)
            hsq = 0.5 * z.pow(2).sum(-1)  # ‖z‖²/2, [B, H, N]
            hsq_s = hsq.gather(-1, idx)  # [B, H, r]
            key_ok = real.expand(hsq.shape)
            pair = valid[..., :, None] & valid[..., None, :]  # [B, H, r, r]
            link = valid[..., :, None] & key_ok[..., None, :]  # [B, H, r, N]
            if bins is not None:
                bin_k = bins.expand(hsq.shape)
                bin_s = bin_k.gather(-1, idx)
                pair = pair & (bin_s[..., :, None] == bin_s[..., None, :])
                link = link & (bin_s[..., :, None] == bin_k[..., None, :])
            # the r×r core G_SS (Gaussian form, unit diagonal), invalid slots → identity
            core = torch.exp(z_s @ z_s.transpose(-1, -2) - hsq_s[..., :, None] - hsq_s[..., None, :])
            eye = torch.eye(r, device=core.device, dtype=core.dtype)
            core_inv = stable_pinv(torch.where(pair, core, eye))
            rhs = torch.cat([vf, key_ok[..., None].to(vf.dtype)], dim=-1)  # [V | 1]
            shift, x_rhs = self._key_sums(z_s, z, hsq_s, link, rhs, key_ok)
            coef = core_inv @ x_rhs  # e^{h_s - M}·(W [V | 1])_s, [B, H, r, E + 1]
            # exp(βq·k_s)·e^{-h_s}, one shift per row (cancels in the ratio): entries ≤ 1
            logits_q = (qf @ kc_s.transpose(-1, -2) - hsq_s[..., None, :]).masked_fill(
                ~valid[..., None, :], float("-inf")
            )
            row_shift = logits_q.amax(-1, keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
            left = torch.exp(logits_q - row_shift)  # [B, H, N, r]
            both = left @ coef
            partial = left @ torch.exp(hsq_s - shift.squeeze(-1)).unsqueeze(-1)  # Σ_{s∈S} exp(βq·k_s), same scale
            den = torch.maximum(both[..., -1:], partial).clamp_min(torch.finfo(dtype).tiny)
            out = both[..., :-1] / den
            if clamp:
                big = torch.finfo(dtype).max
                rv = real.unsqueeze(-1)
                lo = vf.masked_fill(~rv, big).amin(-2, keepdim=True)
                hi = vf.masked_fill(~rv, -big).amax(-2, keepdim=True)
                out = torch.minimum(torch.maximum(out, lo), hi)
        return out.to(v.dtype)

    @staticmethod
    def _key_sums(
        z_s: torch.Tensor,
        z: torch.Tensor,
        hsq_s: torch.Tensor,
        link: torch.Tensor,
        rhs: torch.Tensor,
        real: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """X·rhs with X = G_SK·D scaled by one shift per head (e^{-M}, cancels in the ratio; entries ≤ 1), and
        that shift `[B, H, 1, 1]`. Summed per group of similar-length sequences over the keys up to the group's
        last real one (`length_groups`, `real [B, H, N]`): the r×N logits, their exp and the product — forward
        and backward — otherwise spend ~40% of their work on ListOps' trailing pads, whose masked terms are
        exactly 0; the shift (a max over real keys) is the same, the sums differ at fp32 rounding only."""
        n = z.shape[-2]
        groups = length_groups(real, 1)
        if len(groups) == 1 and groups[0][1] == n:
            return _shifted_key_sums(z_s, z, hsq_s, link, rhs)
        parts = [
            _shifted_key_sums(z_s[rows], z[rows, :, :width], hsq_s[rows], link[rows, ..., :width], rhs[rows, :, :width])
            for rows, width in groups
        ]
        back = torch.cat([rows for rows, _ in groups]).argsort()
        return torch.cat([p[0] for p in parts])[back], torch.cat([p[1] for p in parts])[back]

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
        # the SVD-based pseudo-inverse: forward an estimate (`pinv_flops`), backward torch's formula, 8 r×r products
        return Flops(diff) + Flops(pinv_flops(r, "exact", 0), backward=16.0 * r**3)


def _shifted_key_sums(
    z_s: torch.Tensor, z: torch.Tensor, hsq_s: torch.Tensor, link: torch.Tensor, rhs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`WildcatAttention._key_sums` on all of `z`'s keys: the per-head shift and exp(logits − shift)·rhs."""
    logits = (z_s @ z.transpose(-1, -2) - hsq_s[..., None]).masked_fill(~link, float("-inf"))
    shift = logits.amax(dim=(-1, -2), keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
    return shift, torch.exp(logits - shift) @ rhs
