"""What every attention built on landmarks shares: the selector, the landmark count and the rank it spends.

Nyström, GPA, spectral, pivoted and WildCat each take a selector and `num_landmarks` (an int or `"log2"`) and
report the rank they really used for the diagnostics (`last_rank [B, H]`: valid landmarks, kept pivots, …).
The constructor is `Attention`'s, with the `selector` as a positional argument: the shared geometry (`head_dim`,
`num_heads`, `seq_len`), the selector, and the variant's config dataclass (`cfg`, its class's `config()` when left
out: each has its own `num_landmarks` default) handed to `configure`, where this class reads `num_landmarks` and the
variant its own knobs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from models.attention.base import Attention
from models.landmarks.base import Landmarks, LandmarkSelector, resolve_num_landmarks


class LandmarkAttention(Attention):
    """An attention on m landmarks chosen by a selector (a base class: no `name`, so not an option itself)."""

    takes_selector: ClassVar[bool] = True
    rank_knob: ClassVar[str | None] = "num_landmarks"
    #: `T(q, k) v` without forming T, in the variants that have one (pivoted, WildCat): `operator_matrix` uses it
    _operator: Callable[..., torch.Tensor]

    selector: LandmarkSelector

    def __init__(
        self, head_dim: int, num_heads: int, seq_len: int, selector: LandmarkSelector, cfg: Any = None
    ) -> None:
        assert self.config is not None, f"{type(self).__name__} declares no config dataclass (its num_landmarks)"
        super().__init__(head_dim, num_heads, seq_len, cfg, selector=selector)

    def configure(self, cfg: Any) -> None:
        """The landmark count every variant has; a variant's own `configure` calls this first, so it may look at the
        selector and `num_landmarks`."""
        self.num_landmarks: int | str = cfg.num_landmarks
        self.last_rank: torch.Tensor | None = None

    def rank_budget(self, seq_len: int) -> int:
        return resolve_num_landmarks(self.num_landmarks, seq_len)

    def select_landmarks(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> Landmarks:
        """The selector's m landmarks for these (already scaled) q, k; records the rank really spent."""
        lm = self.selector(q, k, mask, self.rank_budget(q.shape[-2]))
        self.last_rank = lm.valid.sum(-1).detach()  # [B, H]: valid landmarks (diagnostics' effective budget)
        return lm

    def operator_matrix(
        self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, dtype: torch.dtype, **options: bool
    ) -> torch.Tensor:
        """The implied matrix of a variant that computes `out = T(q, k) v` without forming T (`self._operator(q, k,
        v, mask, **options)`, as pivoted and WildCat do): T applied to the identity, pads zeroed. Diagnostics only."""
        eye = torch.eye(q.shape[-2], device=q.device, dtype=dtype).expand(*q.shape[:2], -1, -1)
        mat = self._operator(q.to(dtype), k.to(dtype), eye, mask, **options)
        if mask is not None:
            mat = mat * mask[:, None, :, None] * mask[:, None, None, :]
        return mat
