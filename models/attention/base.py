"""The attention interface every variant implements.

`forward(q, k, v, mask) -> out` with `q, k, v: [B, H, N, D]` and `mask: [B, N]` bool (True = real token,
None = no padding). Variants know nothing of tasks or training. `implied_matrix(q, k, mask)` returns the
N×N row-operator the method applies to V (exact softmax for `full`); it exists for diagnostics on short
probe sequences only — no training path may call it.

Causal attention (token i attends to keys j <= i, for next-token self-pretraining) is a property a variant
declares with `supports_causal`; `set_causal(True)` switches an instance into that mode and refuses on a variant
that has no causal form (most approximations mix every key into a shared summary, so position i would see the
future). A mode on the instance, not a `forward` argument: the nine variants and the projection wrapper keep one
signature, and only the language-model stage ever switches it on.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class Attention(nn.Module):
    """Base class. Subclasses set `takes_selector` when they accept a landmark selector."""

    #: whether a `selector` is part of this attention's configuration
    takes_selector: bool = False
    #: the `attn=` option name; a class with its own `name` is discovered by `lra_bench.registry`
    name: ClassVar[str] = ""
    #: the config dataclass: its fields are the constructor's keyword arguments (plus `name`)
    config: ClassVar[type | None] = None
    #: whether the variant has an exact causal form (`set_causal(True)`), used by causal self-pretraining
    supports_causal: ClassVar[bool] = False

    def __init__(self, head_dim: int, num_heads: int, seq_len: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.seq_len = seq_len
        self.causal = False

    def set_causal(self, causal: bool) -> None:
        """Attend to keys j <= i only (True) or to every key (False); ValueError on a variant without a causal form."""
        if causal and not self.supports_causal:
            raise ValueError(f"attn={self.name or type(self).__name__} has no causal form (supports_causal=False)")
        self.causal = bool(causal)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def implied_matrix(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The `[B, H, N, N]` matrix Â with `forward(q, k, v) ≈ Â v` (padded rows/cols zero)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its implied matrix")

    def extra_diagnostics(self) -> dict[str, float]:
        """Scalars a variant reports about its last forward (e.g. the rank kept); empty by default."""
        return {}
