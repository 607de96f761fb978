"""Exact softmax attention through `torch.nn.functional.scaled_dot_product_attention` (flash/efficient
kernels on GPU when the mask allows). Supports the causal mode (`set_causal(True)`) used by causal
self-pretraining: the key mask and the lower triangle combined.

Training with dropout on the weights on the CPU, where SDPA has no fused kernel and materialises every n × n
weight, mask and gradient, goes through the compiled flash kernel (`models.kernels.flash_attention`) when
`kernel: fused` and it can be built: the same attention at fp32 rounding, with its own dropout stream."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.attention.base import Attention
from models.cost import Flops, Params, fused_memory
from models.kernels import flash_attention

#: the values of `FullConfig.kernel`
KERNELS = ("fused", "eager")


@dataclass
class FullConfig:
    """Exact softmax attention (SDPA with the padding mask)."""

    name: str = "full"
    dropout: float = 0.0  # attention-weight dropout (training only)
    kernel: str = "fused"  # fused (CPU training with dropout: the compiled flash kernel) | eager (SDPA only)


def key_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """`[B, N]` → SDPA's boolean `[B, 1, 1, N]` (True = attend). A sequence with no real token attends to
    all positions rather than producing NaN; its outputs are zeroed by the caller anyway."""
    if mask is None:
        return None
    mask = mask | ~mask.any(-1, keepdim=True)
    return mask[:, None, None, :]


def causal_key_mask(mask: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """SDPA's boolean mask for causal attention: key j visible to query i iff j <= i and j is a real token
    (`[B, 1, N, N]`, or `[N, N]` without padding). Position 0 always sees itself, so no row is empty unless the
    sequence has no real token (then `key_mask` lets it see everything; its outputs are zeroed by the caller)."""
    lower = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    keys = key_mask(mask)
    return lower if keys is None else keys & lower


class FullAttention(Attention):
    config = FullConfig
    supports_causal = True

    def configure(self, cfg: FullConfig) -> None:
        if cfg.kernel not in KERNELS:
            raise ValueError(f"attn.kernel={cfg.kernel!r}: expected one of {', '.join(KERNELS)}")
        self.dropout = cfg.dropout
        self.kernel = cfg.kernel

    def _fused(self, q: torch.Tensor, p: float) -> bool:
        """Whether this call goes through the compiled flash kernel: CPU training with dropout, fp32/fp64, no
        causal mask, `kernel: fused`, and the kernel built on this machine."""
        if p == 0.0 or self.causal or self.kernel != "fused" or q.device.type != "cpu":
            return False
        return q.dtype in (torch.float32, torch.float64) and flash_attention.kernel() is not None

    def _keys(self, q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        return causal_key_mask(mask, q.shape[-2], q.device) if self.causal else key_mask(mask)

    def forward(self, q, k, v, mask):
        p = self.dropout if self.training else 0.0
        if self._fused(q, p):
            keys = None if mask is None else mask | ~mask.any(-1, keepdim=True)
            return flash_attention.flash_dropout_attention(q, k, v, keys, p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._keys(q, mask), dropout_p=p)

    def implied_matrix(self, q, k, mask):
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        keys = self._keys(q, mask)
        if keys is not None:
            scores = scores.masked_fill(~keys, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights * mask[:, None, :, None]
        return weights

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        return Flops(4.0 * n * n * d)  # QKᵀ and AV

    @classmethod
    def memory(cls, n: int, m: int | None, d: int, mode: str, params: Params) -> float:
        return fused_memory(n, d, mode)  # SDPA: flash / memory-efficient kernels, never n²
