"""k-means++ landmarks: the D²-sampling seeds alone (no Lloyd iterations); the landmarks are those tokens.

Seed 1 is a uniformly random real token; each next seed is a real token drawn with probability ∝ its squared
distance to the nearest seed so far (on detached fp32 queries, seeded generator). Cheap (m steps of O(N·D)),
spread out like k-means centroids, but the landmarks are tokens, so exact columns of A exist for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.cost import Flops, Params
from models.knobs import follows_run_seed
from models.landmarks.base import Landmarks
from models.landmarks.kmeans import exact_fp32, kmeanspp_indices
from models.landmarks.uniform import DataDrivenTokenSelector, token_landmarks


@dataclass
class KMeansPPConfig:
    """k-means++ (D² sampling) seeds on the queries; the landmarks are those tokens."""

    name: str = "kmeans_pp"
    seed: int = follows_run_seed()


class KMeansPPSelector(DataDrivenTokenSelector):
    config = KMeansPPConfig  # D² sampling follows the data

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        b, h = q.shape[:2]
        with exact_fp32(q.device):
            u = self.uniform((b, h, m), q.device)
            idx, valid = kmeanspp_indices(q.detach().float(), mask, m, u)  # plain D² sampling
        return token_landmarks(q, k, idx, valid)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        return Flops(0.0, 2.0 * n * m * d)  # m D²-sampling steps, one distance column each
