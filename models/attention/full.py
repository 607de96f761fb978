"""Exact softmax attention through `torch.nn.functional.scaled_dot_product_attention` (flash/efficient
kernels on GPU when the mask allows)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.attention.base import Attention


@dataclass
class FullConfig:
    name: str = "full"
    dropout: float = 0.0


def key_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """`[B, N]` → SDPA's boolean `[B, 1, 1, N]` (True = attend). A sequence with no real token attends to
    all positions rather than producing NaN; its outputs are zeroed by the caller anyway."""
    if mask is None:
        return None
    mask = mask | ~mask.any(-1, keepdim=True)
    return mask[:, None, None, :]


class FullAttention(Attention):
    name = "full"
    config = FullConfig

    def __init__(self, head_dim: int, num_heads: int, seq_len: int, dropout: float = 0.0) -> None:
        super().__init__(head_dim, num_heads, seq_len)
        self.dropout = dropout

    def forward(self, q, k, v, mask):
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask(mask), dropout_p=p)

    def implied_matrix(self, q, k, mask):
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        keys = key_mask(mask)
        if keys is not None:
            scores = scores.masked_fill(~keys, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights * mask[:, None, :, None]
        return weights
