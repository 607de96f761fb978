"""Linformer (Wang et al. 2020): keys and values projected along the sequence to k rows by learned E and F.

    out = softmax(Q (E K)ᵀ / √d) (F V),   E, F ∈ R^{k×n}  (by default one pair per layer, shared by its heads).

What is learned, and by whom, is three knobs (`LinformerConfig`):

* `share`: `none` — an E and an F in every layer; `kv` — F = E (the paper's key-value sharing; it replaces the
  former `share_kv=true`); `kv_layers` — F = E and one E for every layer (with `per_head=false`, the paper's
  layerwise sharing, its §4). A layer cannot see the others, so the encoder ties them after it builds its blocks:
  it calls `share_with(first)` on every later block's attention (`Attention.share_with`), and each later layer's
  projection becomes the first layer's very `nn.Parameter` — one tensor in `parameters()`, the optimiser and the
  gradient; the state dict lists it under every layer's name, and loading copies into that one tensor, so the tie
  survives a checkpoint round trip.
* `per_head`: one projection per head, E ∈ R^{H×k×n} (E[h] projects head h); false (the default): one [k, n]
  that all heads of the layer share (the paper's headwise sharing).
* `init_std`: the initial entries ~ N(0, init_std²); None keeps randn/√k.

The Nyströmformer reference code's Linformer (the LRA baseline of the Nyströmformer paper) is
`share=kv_layers per_head=true init_std=0.02`: a class attribute E of shape [num_head, linformer_k, max_seq_len],
created by the first layer and reused by every later one, `normal_(E, std=0.02)`, and `K = E (K·mask)`,
`V = E (V·mask)` (mlpen/Nystromformer@5689313 LRA/code/attention_linformer.py:17-21, forward :25-26).

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

#: the values of `LinformerConfig.share`
SHARES = ("none", "kv", "kv_layers")


@dataclass
class LinformerConfig:
    """Linformer: learned length projections E, F of keys and values (k rows)."""

    name: str = "linformer"
    proj_dim: int = 256  # k (reference: 256, linformer_k)
    share: str = "none"  # none (E, F per layer) | kv (F = E) | kv_layers (F = E, one E for all layers)
    # (reference: kv_layers)
    per_head: bool = False  # one projection per head, [H, k, n], instead of one [k, n] (reference: true)
    init_std: float | None = None  # entries ~ N(0, init_std²); null: randn/√k (reference: 0.02)


class LinformerAttention(Attention):
    config = LinformerConfig
    rank_knob = "proj_dim"

    def configure(self, cfg: LinformerConfig) -> None:
        if int(cfg.proj_dim) < 1:
            raise ValueError(f"attn.proj_dim={cfg.proj_dim}: must be a positive integer")
        if cfg.share not in SHARES:
            raise ValueError(f"attn.share={cfg.share!r}: expected one of {', '.join(SHARES)}")
        if cfg.init_std is not None and not float(cfg.init_std) > 0:
            raise ValueError(f"attn.init_std={cfg.init_std}: must be positive, or null for randn/√k")
        self.proj_dim = int(cfg.proj_dim)
        self.share = str(cfg.share)
        self.per_head = bool(cfg.per_head)
        self.init_std = None if cfg.init_std is None else float(cfg.init_std)
        self.proj_k = nn.Parameter(self._initial())
        self.proj_v = None if self.share != "none" else nn.Parameter(self._initial())

    def _initial(self) -> torch.Tensor:
        """A fresh projection, `[H, k, n]` per head or `[k, n]` (drawn from the global RNG, as every weight)."""
        shape = (self.num_heads, self.proj_dim, self.seq_len) if self.per_head else (self.proj_dim, self.seq_len)
        if self.init_std is None:
            return torch.randn(shape) / math.sqrt(self.proj_dim)
        return torch.empty(shape).normal_(0.0, self.init_std)

    def share_with(self, first: Attention) -> None:
        """`share=kv_layers`: use `first`'s projection (the same `nn.Parameter`), dropping this layer's own."""
        if self.share != "kv_layers":
            return
        if not isinstance(first, LinformerAttention) or first.share != "kv_layers":
            raise ValueError("attn.share=kv_layers: the first layer's attention is not a kv_layers Linformer")
        if first.proj_k.shape != self.proj_k.shape:
            shapes = f"{tuple(first.proj_k.shape)} vs {tuple(self.proj_k.shape)}"
            raise ValueError(f"attn.share=kv_layers: the layers' projections differ in shape ({shapes})")
        self.proj_k = first.proj_k

    def rank_budget(self, seq_len: int) -> int:
        return min(self.proj_dim, seq_len)

    def _projections(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if n > self.seq_len:
            raise ValueError(f"attn=linformer was built for seq_len={self.seq_len}, got a sequence of {n}")
        e = self.proj_k[..., :n]  # [k, n], or [H, k, n] per head (broadcast over the batch)
        f = e if self.proj_v is None else self.proj_v[..., :n]
        return e, f

    @staticmethod
    def project(proj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`proj @ x` along the sequence — `[k, n]` or `[H, k, n]` times `x [B, H, n, D]` → `[B, H, k, D]` — as one
        matrix product over the whole batch (per head: one per head), not B·H small ones.

        Why: `proj @ x` broadcasts `proj` over the batch, and torch's CPU matmul then copies it B times
        (`[B, H, k, n]`, 131 MB for the faithful ListOps batch) and, in the backward, sums B such gradients back.
        Laying `x` out as `[(H,) n, B·(H·)D]` (a 16 MB copy) makes it one wide GEMM instead: the same products,
        summed in another order (fp32 rounding). The faithful attention core forward + backward, side by side in
        one process on one loaded Zen 5 thread: 1.38–1.79 s → 0.78–1.08 s."""
        b, h, n, d = x.shape
        if proj.dim() == 2:  # one [k, n] for every head
            cols = x.permute(2, 0, 1, 3).reshape(n, b * h * d)
            return (proj @ cols).view(-1, b, h, d).permute(1, 2, 0, 3)
        cols = x.permute(1, 2, 0, 3).reshape(h, n, b * d)
        return (proj @ cols).view(h, -1, b, d).permute(2, 0, 1, 3)

    def _weights(self, q, k, mask) -> tuple[torch.Tensor, torch.Tensor]:
        e, f = self._projections(q.shape[-2])
        if mask is not None:
            k = k * mask[:, None, :, None].to(k.dtype)
        keys = self.project(e.to(k.dtype), k) * (1.0 / math.sqrt(q.shape[-1]))  # [B, H, k, D], scaled (k ≪ n rows)
        return torch.softmax(q @ keys.transpose(-1, -2), dim=-1), f

    def forward(self, q, k, v, mask):
        weights, f = self._weights(q, k, mask)
        if mask is not None:
            v = v * mask[:, None, :, None].to(v.dtype)
        return weights @ self.project(f.to(v.dtype), v)

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
