"""Hash landmarks: deterministic, evenly spaced real tokens (the inference-time choice of the spectral paper).

Among the n_real real tokens of a sequence, landmark j is the real token of rank ⌊(2j+1)·n_real / (2m)⌋ —
the midpoints of m equal strata, distinct whenever n_real ≥ m. With fewer real tokens than m every real
token is a landmark and the remaining slots are invalid. No randomness, no state: the same sequence always
gets the same landmarks, in training and at inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.cost import Flops, Params
from models.landmarks.base import Landmarks, LandmarkSelector
from models.landmarks.uniform import token_landmarks


def evenly_spaced(mask: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`mask [B, 1, N]` → token indices and validity `[B, 1, m]` (stratum midpoints over the real tokens)."""
    n = mask.shape[-1]
    n_real = mask.long().sum(-1, keepdim=True)  # [B, 1, 1]
    j = torch.arange(m, device=mask.device)
    spread = ((2 * j + 1) * n_real) // (2 * m)
    rank = torch.where(n_real >= m, spread, j.expand_as(spread))
    valid = j < n_real
    # positions of the real tokens, in order, first: a stable sort of "is pad"
    order = torch.sort((~mask).to(torch.uint8), dim=-1, stable=True).indices
    idx = order.gather(-1, rank.clamp(max=n - 1))
    return torch.where(valid, idx, torch.zeros_like(idx)), valid


@dataclass
class HashConfig:
    """Deterministic landmarks: evenly spaced real tokens (stratum midpoints); no randomness, no state."""

    name: str = "hash"


class HashSelector(LandmarkSelector):
    config = HashConfig

    token_landmarks = True

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        idx, valid = evenly_spaced(mask, m)
        shape = (q.shape[0], q.shape[1], idx.shape[-1])
        return token_landmarks(q, k, idx.expand(shape), valid.expand(shape))

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        return Flops(0.0)  # evenly spaced positions: no arithmetic
