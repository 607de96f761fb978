"""Ridge-leverage landmarks: sample m key tokens with probability ∝ their ridge leverage scores in A.

On a row sketch A_S = softmax(Q_S Kᵀ) (ℓ uniformly drawn real query rows, exact, ℓ×N), the ridge leverage
score of column j is
    τ_j(λ) = a_jᵀ (A_S A_Sᵀ + λ I)⁻¹ a_j        (a_j = A_S[:, j]),
computed through the ℓ×ℓ Gram matrix in fp32 (Cholesky), O(ℓ²N). λ = ridge·‖A_S‖_F²/m — our choice, a
cheap stand-in for Musco & Musco's λ = ‖A − A_m‖_*/m (scale-free; `ridge` tunes it). m distinct real tokens
are then drawn without replacement ∝ τ (Efraimidis–Spirakis keys, seeded generator). Padded columns have
τ = 0 and are never drawn; every real token keeps a tiny floor so that m real tokens can always be drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.cost import Flops, Params
from models.knobs import follows_run_seed, knobs
from models.landmarks.base import Landmarks
from models.landmarks.kmeans import exact_fp32
from models.landmarks.pivoted_qr import SketchedSelector, sketch_rows_softmax, sketch_size
from models.landmarks.uniform import sample_real_tokens, token_landmarks, weighted_sample


def ridge_leverage(a: torch.Tensor, ridge: float, m: int) -> torch.Tensor:
    """Column ridge leverage scores `[B, H, N]` of `a [B, H, ℓ, N]` (fp32)."""
    ell = a.shape[-2]
    gram = a @ a.transpose(-1, -2)  # [B, H, ℓ, ℓ]
    lam = (ridge * gram.diagonal(dim1=-2, dim2=-1).sum(-1) / max(m, 1)).clamp_min(1e-12)
    gram = gram + lam[..., None, None] * torch.eye(ell, device=a.device, dtype=a.dtype)
    chol, info = torch.linalg.cholesky_ex(gram)
    solved = torch.cholesky_solve(a, chol)  # (G + λI)⁻¹ A_S
    scores = (solved * a).sum(-2).clamp_min(0.0)
    return torch.where((info == 0)[..., None], scores, a.pow(2).sum(-2) / lam[..., None])


@dataclass
class LeverageConfig:
    """Ridge-leverage-score sampling of key tokens on a row sketch of softmax(QKᵀ)."""

    name: str = "leverage"
    ridge: float = 1.0  # λ = ridge·‖A_S‖_F²/m
    sketch_rows: int = 0  # ℓ query rows in the sketch; 0 = 2·m
    seed: int = follows_run_seed()


class LeverageSelector(SketchedSelector):
    config = LeverageConfig

    def configure(self, cfg: LeverageConfig) -> None:
        super().configure(cfg)
        self.ridge = float(cfg.ridge)

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        b, h, n, _ = q.shape
        rows, rows_valid = sample_real_tokens(self, mask, h, sketch_size(self.sketch_rows, m, n), stream=0)
        with exact_fp32(q.device):
            a = sketch_rows_softmax(q.detach().float(), k.detach().float(), mask, rows, rows_valid)
            scores = ridge_leverage(a, self.ridge, m)
            real = mask.expand(b, h, n)
            floor = 1e-6 * scores.amax(-1, keepdim=True).clamp_min(1e-30)
            weights = torch.where(real, scores + floor, torch.zeros_like(scores))
            idx, valid = weighted_sample(self.uniform((b, h, n), q.device, stream=1), real, m, weights)
        return token_landmarks(q, k, idx, valid)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        ell = sketch_size(knobs(LeverageConfig, params).sketch_rows, m, n)
        # sketch rows, Gram A_S A_Sᵀ, Cholesky, solve against A_S, column-wise dot products
        return Flops(0.0, 2.0 * ell * n * d + 2.0 * ell * ell * n + ell**3 / 3 + 2.0 * ell * ell * n + 2.0 * ell * n)
