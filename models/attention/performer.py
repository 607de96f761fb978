"""Performer (Choromanski et al. 2021): FAVOR+ positive orthogonal random features for the softmax kernel.

    exp(q·k) = E_w[φ(q) φ(k)],   φ(x) = exp(Wx − ‖x‖²/2) / √M,   out = φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1),

with q, k scaled by d^(-1/4) (so q·k is the softmax logit) and W `[H, M, D]` made of orthogonal Gaussian
blocks with χ-distributed row norms. W is a buffer (it checkpoints) drawn from the module's own seeded
generator — never the global RNG — and redrawn every `redraw_every` training forwards (0 = never). Eval never
redraws. For stability the exponent is shifted by a per-row maximum for queries and by one maximum over all
keys (both cancel in the ratio); padded keys get φ = 0; the core is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.attention.base import Attention
from models.attention.numerics import fp32_core
from models.cost import Flops, Params
from models.knobs import follows_run_seed, knobs


@dataclass
class PerformerConfig:
    """Performer: FAVOR+ positive orthogonal random features, redrawn with a seeded generator."""

    name: str = "performer"
    num_features: int = 256  # M
    redraw_every: int = 1000  # training forwards between feature redraws; 0 = never
    orthogonal: bool = True  # orthogonal Gaussian blocks (false: i.i.d. Gaussian rows)
    seed: int = follows_run_seed()


def gaussian_features(
    generator: torch.Generator, heads: int, features: int, dim: int, orthogonal: bool
) -> torch.Tensor:
    """`[heads, features, dim]` random projection rows (orthogonal blocks with Gaussian-like norms)."""
    if not orthogonal:
        return torch.randn(heads, features, dim, generator=generator)
    blocks = []
    for _ in range(-(-features // dim)):
        gauss = torch.randn(heads, dim, dim, generator=generator)
        q, _ = torch.linalg.qr(gauss)
        blocks.append(q.transpose(-1, -2))
    rows = torch.cat(blocks, dim=1)[:, :features]
    norms = torch.randn(heads, features, dim, generator=generator).norm(dim=-1, keepdim=True)
    return rows * norms


class PerformerAttention(Attention):
    config = PerformerConfig
    projection: torch.Tensor
    passes: torch.Tensor
    rank_knob = "num_features"

    def configure(self, cfg: PerformerConfig) -> None:
        if int(cfg.num_features) < 1:
            raise ValueError(f"attn.num_features={cfg.num_features}: must be a positive integer")
        self.num_features, self.redraw_every = int(cfg.num_features), int(cfg.redraw_every)
        self.orthogonal = bool(cfg.orthogonal)
        self._generator = torch.Generator().manual_seed(int(cfg.seed))
        self.register_buffer("projection", self._draw())
        self.register_buffer("passes", torch.zeros((), dtype=torch.long))
        self._passes = 0

    def _draw(self) -> torch.Tensor:
        return gaussian_features(self._generator, self.num_heads, self.num_features, self.head_dim, self.orthogonal)

    def get_extra_state(self) -> dict[str, Any]:
        return {"generator": self._generator.get_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state and "generator" in state:
            self._generator.set_state(state["generator"].detach().to("cpu", torch.uint8))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._passes = int(self.passes)

    def rank_budget(self, seq_len: int) -> int:
        return min(self.num_features, seq_len)

    def _maybe_redraw(self) -> None:
        if not self.training:
            return
        self.passes += 1
        self._passes += 1
        if self.redraw_every and self._passes % self.redraw_every == 0:
            self.projection.copy_(self._draw())

    def _factors(self, q, k, mask):
        w = self.projection.float().unsqueeze(0)  # [1, H, M, D]
        scale = q.shape[-1] ** -0.25
        qf, kf = q.float() * scale, k.float() * scale
        wq, wk = qf @ w.transpose(-1, -2), kf @ w.transpose(-1, -2)  # [B, H, N, M]
        wq = wq - (qf * qf).sum(-1, keepdim=True) / 2
        wk = wk - (kf * kf).sum(-1, keepdim=True) / 2
        if mask is not None:
            wk = wk.masked_fill(~mask[:, None, :, None], float("-inf"))
        q_shift = wq.amax(-1, keepdim=True).detach()
        k_shift = wk.amax((-2, -1), keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
        phi_q = torch.exp(wq - q_shift)
        phi_k = torch.exp(wk - k_shift)
        return phi_q, phi_k

    def forward(self, q, k, v, mask):
        self._maybe_redraw()
        with fp32_core(q.device):
            phi_q, phi_k = self._factors(q, k, mask)
            ones = torch.ones_like(v[..., :1], dtype=torch.float32)
            both = phi_q @ (phi_k.transpose(-1, -2) @ torch.cat([v.float(), ones], dim=-1))
            out = both[..., :-1] / both[..., -1:].clamp_min(1e-30)
        return out.to(v.dtype)

    def implied_matrix(self, q, k, mask):
        with fp32_core(q.device):
            phi_q, phi_k = self._factors(q, k, mask)
            weights = phi_q @ phi_k.transpose(-1, -2)
            mat = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
        if mask is not None:
            mat = mat * mask[:, None, :, None]
        return mat

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        r = int(m or knobs(PerformerConfig, params).num_features)
        proj, mix = 4.0 * n * r * d, 4.0 * n * r * (d + 1)  # Q·Wᵀ and K·Wᵀ; φ(K)ᵀ[V | 1] and φ(Q)·(…)
        return Flops(proj + mix, backward=proj + 2.0 * mix)  # W is a constant: one backward product each
