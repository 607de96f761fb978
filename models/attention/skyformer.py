"""Skyformer (Chen et al. 2021): Nyström approximation of a Gaussian kernel on the stacked [Q; K].

    κ(a, b) = exp(−‖a − b‖²/2) = exp(a·b − ‖a‖²/2 − ‖b‖²/2),   q, k scaled by d^(-1/4);
    X = [Q; K] (2N × d) makes κ(X, X) positive semi-definite; m landmarks X_S are drawn uniformly from the
    *real* tokens, half from the Q part and half from the K part;
    W = κ(X_S, X_S) + λI, degree-normalised D^(-1/2) W D^(-1/2) (D = row sums) for the iterative
    pseudo-inverse (6 Newton–Schulz steps), then un-normalised:  W⁺ ≈ D^(-1/2) pinv(D^(-1/2) W D^(-1/2)) D^(-1/2);
    out = κ(Q, X_S) · W⁺ · (κ(X_S, K) V)   (no row normalisation, as in the paper).

Landmarks are sampled (two draws: Q part, K part) with the module's own seeded generator (a fixed draw at
eval, like every selector here); invalid landmark slots (fewer real tokens than m/2) drop out through
identity rows in W. Core in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.attention.base import Attention
from models.attention.numerics import (
    core_precision,
    exact_pinv,
    fp32_core,
    iterative_pinv,
    product_with_transposed,
)
from models.cost import Flops, Params, pinv_flops
from models.kernels import clamped_exp, fused_encoder
from models.knobs import follows_run_seed, knobs
from models.landmarks.base import broadcast_mask, gather_tokens
from models.landmarks.uniform import UniformConfig, UniformSelector, sample_real_tokens


@dataclass
class SkyformerConfig:
    """Skyformer: Nyström on the Gaussian kernel of the stacked [Q; K], uniform landmarks from real tokens."""

    name: str = "skyformer"
    num_landmarks: int = 128  # nb_features
    ridge: float = 0.1  # λ added to W
    pinv: str = "iterative"  # iterative | exact
    pinv_iterations: int = 6  # Newton–Schulz steps of the iterative pinv
    seed: int = follows_run_seed()


#: the logit offset of a row that is left out: exp(x − 10⁴) is exactly 0 in fp32 and fp64 for every x ≤ 0, and so
#: is its gradient (the kernel's value times the other side's finite features)
LEFT_OUT = -1.0e4


def gaussian_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    a_valid: torch.Tensor | None = None,
    b_valid: torch.Tensor | None = None,
    compiled: bool = False,
) -> torch.Tensor:
    """κ(a, b) = exp(−‖a − b‖²/2) for `a [..., n, d]`, `b [..., p, d]` → `[..., n, p]`, with the rows of `a` and `b`
    that are not valid (`a_valid [..., n]`, `b_valid [..., p]`, bool; None = all) giving exact zeros. `compiled` (the
    attention's: the encoder's chain is compiled): the clamp and exp through the kernel `models.kernels.clamped_exp`,
    one pass over the kernel each way, where it applies.

    Why this form: the exponent a·b − ‖a‖²/2 − ‖b‖²/2 is one product of augmented rows, [a, −‖a‖²/2, 1] ·
    [b, 1, −‖b‖²/2] (an invalid row's −‖·‖²/2 shifted by `LEFT_OUT`), so the [n, p] tensor sees two passes forward
    (the clamp to ≤ 0, as ‖a − b‖² ≥ 0, and exp) instead of the six of the sum, difference, clamp, scale and exp,
    plus a mask multiply per validity: the Skyformer step's largest element-wise cost on a CPU (forward + backward of
    κ(Q, X_S) at B = 32, H = 2, n = 2048, m = 128, one thread, loaded: 1.8–4× faster; the faithful step 8%). The
    same values at fp32 rounding."""
    ones_a, ones_b = torch.ones_like(a[..., :1]), torch.ones_like(b[..., :1])
    half_a, half_b = -0.5 * (a * a).sum(-1, keepdim=True), -0.5 * (b * b).sum(-1, keepdim=True)
    if a_valid is not None:
        half_a = half_a + (~a_valid).unsqueeze(-1).to(a.dtype) * LEFT_OUT
    if b_valid is not None:
        half_b = half_b + (~b_valid).unsqueeze(-1).to(b.dtype) * LEFT_OUT
    # b's gradient row-major (`product_with_transposed`), the layout of its gradients from ‖b‖² and the landmark gather
    logits = product_with_transposed(torch.cat([a, half_a, ones_a], -1), torch.cat([b, ones_b, half_b], -1))
    if compiled and fused_encoder.applies(logits) and clamped_exp.applies(logits):
        return clamped_exp.clamped_exp(logits)
    return torch.exp(logits.clamp_max(0.0))


class SkyformerAttention(Attention):
    config = SkyformerConfig
    approximates = "Gaussian-kernel attention without row normalisation"
    rank_knob = "num_landmarks"

    def configure(self, cfg: SkyformerConfig) -> None:
        if cfg.pinv not in ("iterative", "exact"):
            raise ValueError(f"attn.pinv={cfg.pinv!r}: expected 'iterative' or 'exact'")
        if int(cfg.num_landmarks) < 2:
            raise ValueError(f"attn.num_landmarks={cfg.num_landmarks}: need at least 2 (half from Q, half from K)")
        self.num_landmarks, self.ridge = int(cfg.num_landmarks), float(cfg.ridge)
        self.pinv, self.pinv_iterations = cfg.pinv, int(cfg.pinv_iterations)
        self.sampler = UniformSelector(UniformConfig(seed=cfg.seed))

    def landmark_total(self, seq_len: int) -> int:
        return min(self.num_landmarks, 2 * seq_len)

    def _factors(self, q, k, mask):
        """κ(Q, X_S) `[B,H,N,m]`, W⁺ `[B,H,m,m]`, κ(X_S, K) `[B,H,m,N]` (pads zero), all fp32."""
        scale = q.shape[-1] ** -0.25
        qf, kf = q.float() * scale, k.float() * scale
        m = self.landmark_total(q.shape[-2])
        half = m // 2
        real = broadcast_mask(mask, qf)
        idx_q, valid_q = sample_real_tokens(self.sampler, real, q.shape[1], half, stream=0)
        idx_k, valid_k = sample_real_tokens(self.sampler, real, q.shape[1], m - half, stream=1)
        x_s = torch.cat([gather_tokens(qf, idx_q), gather_tokens(kf, idx_k)], dim=-2)
        valid = torch.cat([valid_q, valid_k], dim=-1)
        keys = None if mask is None else mask[:, None, :]
        left = gaussian_kernel(qf, x_s, b_valid=valid, compiled=self.compiled)
        right = gaussian_kernel(x_s, kf, a_valid=valid, b_valid=keys, compiled=self.compiled)
        pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
        eye = torch.eye(m, device=q.device, dtype=qf.dtype)
        core = torch.where(pair, gaussian_kernel(x_s, x_s, compiled=self.compiled) + self.ridge * eye, eye)
        inv_sqrt = core.sum(-1).clamp_min(1e-12).rsqrt()
        normed = core * inv_sqrt.unsqueeze(-1) * inv_sqrt.unsqueeze(-2)
        pinv = exact_pinv(normed) if self.pinv == "exact" else iterative_pinv(normed, self.pinv_iterations)
        core_inv = pinv * inv_sqrt.unsqueeze(-1) * inv_sqrt.unsqueeze(-2)
        return left, core_inv, right

    def rank_budget(self, seq_len: int) -> int:
        return min(self.landmark_total(seq_len), seq_len)

    def forward(self, q, k, v, mask):
        with fp32_core(q.device):
            left, core_inv, right = self._factors(q, k, mask)
            out = left @ (core_inv @ (right @ v.float()))
        return out.to(v.dtype)

    def implied_matrix(self, q, k, mask):
        with fp32_core(q.device):
            left, core_inv, right = self._factors(q, k, mask)
            mat = left @ core_inv @ right
        if mask is not None:
            mat = mat * mask[:, None, :, None]
        return mat

    def target_pair(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None):
        """(κ(Q, K), κ(Q, X_S) W⁺ κ(X_S, K)): the unnormalised Gaussian-kernel attention the method approximates and
        its Nyström estimate, `[B, H, N, N]` with pads zero (diagnostics only): its error against softmax attention
        is a distance between two operators, this pair's is its approximation error."""
        scale = q.shape[-1] ** -0.25
        with fp32_core(q.device):
            exact = gaussian_kernel(core_precision(q) * scale, core_precision(k) * scale)
        approx = self.implied_matrix(q, k, mask).to(exact.dtype)
        if mask is not None:
            pair = mask[:, None, :, None] & mask[:, None, None, :]
            exact, approx = exact * pair, approx * pair
        return exact, approx

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        cfg = knobs(SkyformerConfig, params)
        m = int(m or cfg.num_landmarks)
        # κ(Q, X_S), κ(X_S, K), κ(X_S, X_S) (Gaussian kernels: one product each), pinv, right-to-left apply
        return Flops(8.0 * n * m * d + 4.0 * m * m * d + pinv_flops(m, cfg.pinv, cfg.pinv_iterations))
