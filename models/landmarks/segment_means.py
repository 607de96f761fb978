"""Segment means (Nyströmformer's landmarks), computed over the *real* tokens only.

Each real token gets its rank r among the real tokens of its sequence; token r goes to segment
⌊r·m / n_real⌋. With no padding and m | n this is exactly Nyströmformer's reshape-and-mean; with padding
it never dilutes a mean with pad zeros (mlpen does) and never wastes landmarks on an all-pad tail
(lucidrains masks them instead). A sequence with fewer real tokens than m leaves some segments empty:
those landmarks are marked invalid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.cost import Flops, Params
from models.landmarks.base import Landmarks, LandmarkSelector, cluster_means


def segment_assignment(mask: torch.Tensor, m: int) -> torch.Tensor:
    """`mask [B, 1, N]` → segment id `[B, 1, N]` of each token (pads get id 0 but carry no weight)."""
    real = mask.long()
    rank = real.cumsum(-1) - 1
    n_real = real.sum(-1, keepdim=True).clamp_min(1)
    return (rank.clamp_min(0) * m) // n_real


@dataclass
class SegmentMeansConfig:
    """Nyströmformer's landmarks: means of m contiguous segments of the real tokens."""

    name: str = "segment_means"


class SegmentMeans(LandmarkSelector):
    config = SegmentMeansConfig

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        assignment = segment_assignment(mask, m).expand(q.shape[:3])
        q_l, counts = cluster_means(q, assignment, mask, m)
        k_l, _ = cluster_means(k, assignment, mask, m)
        return Landmarks(queries=q_l, keys=k_l, valid=counts > 0)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        return Flops(0.0, 2.0 * n * d)  # one add per element of q and of k (its backward is as many adds again)
