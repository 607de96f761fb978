"""Linformer (Wang et al. 2020): keys and values projected along the sequence to k rows by learned E and F.

    out = softmax(Q (E K)ᵀ / √d) (F V),   E, F ∈ R^{k×n}  (one pair per layer, shared by its heads).

Masking: padded keys and values are zeroed before the projection, so pads contribute nothing to E K or F V
(a projected row is a learned mixture of real tokens only). Sequences shorter than the configured length
use the first N columns of E and F. The implied N×N matrix is softmax(Q(EK)ᵀ/√d)·F, of rank ≤ k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from models.attention.base import Attention
from models.cost import Flops, Params
from models.knobs import knobs


@dataclass
class LinformerConfig:
    """Linformer: learned length projections E, F of keys and values (k rows)."""

    name: str = "linformer"
    proj_dim: int = 256  # k
    share_kv: bool = False  # F = E


class LinformerAttention(Attention):
    config = LinformerConfig
    rank_knob = "proj_dim"

    def configure(self, cfg: LinformerConfig) -> None:
        if int(cfg.proj_dim) < 1:
            raise ValueError(f"attn.proj_dim={cfg.proj_dim}: must be a positive integer")
        self.proj_dim = int(cfg.proj_dim)
        scale = math.sqrt(self.proj_dim)
        self.proj_k = nn.Parameter(torch.randn(self.proj_dim, self.seq_len) / scale)
        self.proj_v = None if cfg.share_kv else nn.Parameter(torch.randn(self.proj_dim, self.seq_len) / scale)

    def rank_budget(self, seq_len: int) -> int:
        return min(self.proj_dim, seq_len)

    def _projections(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if n > self.seq_len:
            raise ValueError(f"attn=linformer was built for seq_len={self.seq_len}, got a sequence of {n}")
        e = self.proj_k[:, :n]
        f = e if self.proj_v is None else self.proj_v[:, :n]
        return e, f

    def _weights(self, q, k, mask) -> tuple[torch.Tensor, torch.Tensor]:
        e, f = self._projections(q.shape[-2])
        if mask is not None:
            k = k * mask[:, None, :, None].to(k.dtype)
        keys = e.to(k.dtype) @ k  # [B, H, k, D]
        return torch.softmax((q @ keys.transpose(-1, -2)) / math.sqrt(q.shape[-1]), dim=-1), f

    def forward(self, q, k, v, mask):
        weights, f = self._weights(q, k, mask)
        if mask is not None:
            v = v * mask[:, None, :, None].to(v.dtype)
        return weights @ (f.to(v.dtype) @ v)

    def implied_matrix(self, q, k, mask):
        weights, f = self._weights(q, k, mask)
        mat = weights.float() @ f.float()
        if mask is not None:
            mat = mat * mask[:, None, :, None] * mask[:, None, None, :]
        return mat

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        k = int(m or knobs(LinformerConfig, params).proj_dim)
        return Flops(8.0 * n * k * d)  # E·K, F·V, Q·(EK)ᵀ, softmax(…)·(FV)
