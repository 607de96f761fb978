"""Bench-only reference operators (not registry attentions, never trained): exact softmax attention through
one SDPA backend forced with `torch.nn.attention.sdpa_kernel`.

- `sdpa_math`: the textbook implementation that materialises the B·H·n×n score matrix — the memory wall the
  efficient methods exist to avoid, and what `full` would cost without a fused kernel.
- `sdpa_flash`: the flash kernel (CPU: PyTorch's flash-attention-for-CPU, fp32; CUDA: FlashAttention-2, which
  takes fp16/bf16 only, so the bench feeds it bf16 on CUDA and says so). `full` already goes through SDPA and
  lets PyTorch pick the backend; this pins it, which is the comparison the GPU section asks for.
- `sdpa_efficient`: the memory-efficient kernel (CUDA only; fp32 and bf16), the backend SDPA falls back to when
  a padding mask rules flash out — what `full` runs on in padded training batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.attention.full import FullAttention
from models.cost import Flops, Params, fused_memory, quadratic_memory

REFERENCES = {
    "sdpa_math": SDPBackend.MATH,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
}


class SDPAReference(nn.Module):
    """Exact attention through one pinned SDPA backend; its cost model is exact attention's, with the memory of
    what that backend materialises (the score matrix for `sdpa_math`, never for the fused kernels)."""

    @staticmethod
    def flops(n: int, m: int | None, d: int, params: Params) -> Flops:
        return FullAttention.flops(n, m, d, params)

    @staticmethod
    def memory_of(name: str, n: int, d: int, mode: str) -> float:
        return quadratic_memory(n, mode) if name == "sdpa_math" else fused_memory(n, d, mode)

    def __init__(self, name: str) -> None:
        super().__init__()
        if name not in REFERENCES:
            raise KeyError(f"reference {name!r} unknown; valid: {', '.join(REFERENCES)}")
        self.name, self.backend = name, REFERENCES[name]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        attn_mask = None if mask is None else mask[:, None, None, :]
        with sdpa_kernel(self.backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def reference_dtype(name: str, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype a reference runs in: flash on CUDA has no fp32 kernel, so bf16 there."""
    if name == "sdpa_flash" and device.type == "cuda" and dtype == torch.float32:
        return torch.bfloat16
    return dtype
