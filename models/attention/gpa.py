"""GPA — Geometric Progressive Attention: Nyström attention with k-means landmarks on the queries.

Public facts (ICLR 2026 submission 20651, known only through its reviews): Nyström approximation of softmax
attention whose landmarks come from k-means on the *query* vectors, m = log₂ n landmarks, 10 Lloyd
iterations, landmarks recomputed every 50 passes. There is no public code. This module is a thin subclass of
`NystromAttention` (the three Nyström kernels, masking and the fp32 core are shared, not copied); the
progressive codebook lives in the `gpa` selector (`models/landmarks/gpa.py`), which any landmark attention
can use. **Our reading / our choices**, all configurable:

* the key landmarks are the key means over the query clusters (so each landmark pair describes one
  cluster of tokens), both recomputed differentiably from the (stop-grad) assignment;
* "recomputed every 50 passes" = a per-layer codebook refreshed by Lloyd iterations on the current batch
  every `refresh_every` training forwards, every sequence assigned to it (see the selector's docstring);
* m = ⌈log₂ n⌉ is resolved once, for the configured seq_len: the codebook has a fixed size, so a shorter
  probe sequence uses the same centroids (some clusters empty = invalid landmarks);
* everything else is Nyströmformer's: d^(-1/4) scaling before clustering, the 6-step iterative
  pseudo-inverse with per-matrix init, the depthwise-conv skip (kernel 35) — so that `attn=gpa` vs
  `attn=nystrom` at the same m isolates the choice of landmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.attention.nystrom import NystromAttention, NystromConfig
from models.landmarks.base import resolve_num_landmarks


@dataclass
class GPAConfig(NystromConfig):
    """GPA (ICLR 2026 submission 20651): Nyström with k-means landmarks on the queries, m = log2 n,
    10 Lloyd iterations, landmarks refreshed every 50 passes (the progressive `gpa` selector). Every other knob is
    Nyströmformer's (`NystromConfig`), so `attn=gpa` vs `attn=nystrom` isolates the choice of landmarks."""

    name: str = "gpa"
    num_landmarks: Any = "log2"  # int, or "log2" (⌈log₂ seq_len⌉, GPA's default)


class GPAAttention(NystromAttention):
    config = GPAConfig
    default_selector = "gpa"

    def configure(self, cfg: NystromConfig) -> None:  # a GPAConfig (derived from NystromConfig)
        super().configure(cfg)
        bind = getattr(self.selector, "bind", None)
        if callable(bind):  # a progressive codebook: fixed size for the configured length, allocated now
            bind(self.num_heads, self.head_dim, resolve_num_landmarks(cfg.num_landmarks, self.seq_len))

    def rank_budget(self, seq_len: int) -> int:
        size = getattr(self.selector, "codebook_size", None)
        return int(size) if size else super().rank_budget(seq_len)

    def extra_diagnostics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in ("passes", "refreshes"):
            value = getattr(self.selector, name, None)
            if value is not None:
                out[f"codebook_{name}"] = float(value)
        return out
