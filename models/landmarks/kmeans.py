"""k-means landmarks: Lloyd iterations on the queries, landmarks = query and key means over the clusters.

The clustering (initialisation, Lloyd iterations, empty-cluster handling, final assignment) runs on detached
fp32 queries under `no_grad` with autocast off; only the final centroids are differentiable: query means AND
key means over the same clusters, recomputed from the final assignment with `cluster_means` (the stop-grad
pattern of clustered attention: assignment constant, centroids differentiable, exactly segment-means-style
gradients). Distances are ‖c‖² − 2·x·cᵀ (+‖x‖² where the value matters), one batched matmul: never a
B×N×m×D tensor. Padding never seeds, joins or moves a cluster.

Initialisations: `segment_means` (Nyströmformer's landmarks: deterministic, a strong warm start), `random`
(m distinct real tokens, seeded) and `kmeans++` (D² sampling, seeded; m sequential O(N·D) steps). Empty
clusters are re-seeded to the points farthest from their centroids (`farthest`) or keep their previous
centroid (`keep`); a cluster that ends empty is an invalid landmark.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from models.landmarks.base import Landmarks, cluster_means, gather_tokens
from models.landmarks.segment_means import segment_assignment
from models.landmarks.uniform import SeededSelector, weighted_sample

INITS = ("segment_means", "random", "kmeans++")
EMPTY = ("farthest", "keep")


@contextlib.contextmanager
def exact_fp32(device: torch.device) -> Iterator[None]:
    """No grad and no autocast: clustering arithmetic stays fp32 whatever the training precision."""
    with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
        yield


def check_options(init: str, empty: str) -> None:
    if init not in INITS:
        raise ValueError(f"selector.init={init!r}: expected one of {', '.join(INITS)}")
    if empty not in EMPTY:
        raise ValueError(f"selector.empty={empty!r}: expected one of {', '.join(EMPTY)}")


def half_distances(x: torch.Tensor, c: torch.Tensor, c_valid: torch.Tensor | None = None) -> torch.Tensor:
    """‖c‖² − 2·x·cᵀ for `x [..., N, D]`, `c [..., m, D]` → `[..., N, m]` (add ‖x‖² for true distances);
    +inf for invalid centroids (`c_valid [..., m]`), folded into the bias of one `baddbmm`."""
    lead = torch.broadcast_shapes(x.shape[:-2], c.shape[:-2])
    x3 = x.expand(*lead, *x.shape[-2:]).reshape(-1, *x.shape[-2:])
    c3 = c.expand(*lead, *c.shape[-2:]).reshape(-1, *c.shape[-2:])
    bias = (c3 * c3).sum(-1)
    if c_valid is not None:
        valid = c_valid.expand(*lead, c.shape[-2]).reshape(-1, c.shape[-2])
        bias = bias.masked_fill(~valid, float("inf"))
    out = torch.baddbmm(bias.unsqueeze(1), x3, c3.transpose(1, 2), alpha=-2.0)
    return out.reshape(*lead, x.shape[-2], c.shape[-2])


def assign(
    x: torch.Tensor, c: torch.Tensor, c_valid: torch.Tensor, distances: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Nearest valid centroid of every point and (if `distances`) its squared distance (≥ 0)."""
    best, idx = half_distances(x, c, c_valid).min(dim=-1)
    if not distances:
        return idx, None
    return idx, (best + (x * x).sum(-1)).clamp_min(0.0)


def reseed_farthest(
    x: torch.Tensor, mask: torch.Tensor, dist: torch.Tensor, centroids: torch.Tensor, empty: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each empty cluster onto one of the real points farthest from their centroids (distinct points,
    farthest first). Returns the new centroids and which of the empty clusters got a (real) point."""
    m, n = centroids.shape[-2], x.shape[-2]
    dist = dist.masked_fill(~mask.expand(dist.shape), float("-inf"))
    far_d, far_i = dist.topk(min(m, n), dim=-1)  # [..., m']
    rank = (empty.long().cumsum(-1) - 1).clamp(0, far_i.shape[-1] - 1)  # which farthest point each empty gets
    pick = far_i.gather(-1, rank)
    ok = empty & torch.isfinite(far_d.gather(-1, rank)) & (empty.long().cumsum(-1) <= far_i.shape[-1])
    points = gather_tokens(x.expand(*pick.shape[:-1], *x.shape[-2:]), pick)
    return torch.where(ok.unsqueeze(-1), points, centroids), ok


def lloyd(
    x: torch.Tensor,
    mask: torch.Tensor,
    centroids: torch.Tensor,
    c_valid: torch.Tensor,
    iterations: int,
    empty: str = "farthest",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`iterations` Lloyd steps on `x [B, H, N, D]` (fp32, detached) with real-token `mask [B, 1, N]` from
    `centroids [B, H, m, D]` / `c_valid [B, H, m]`. Returns the centroids and their validity."""
    m = centroids.shape[-2]
    for _ in range(iterations):
        idx, dist = assign(x, centroids, c_valid)
        means, counts = cluster_means(x, idx, mask, m)
        filled = counts > 0
        if empty == "farthest":
            means, reseeded = reseed_farthest(x, mask, dist, means, ~filled)
            centroids, c_valid = means, filled | reseeded
        else:  # keep: an empty cluster keeps its previous centroid (and validity)
            centroids = torch.where(filled.unsqueeze(-1), means, centroids)
            c_valid = filled | c_valid
    return centroids, c_valid


def kmeanspp_indices(x: torch.Tensor, mask: torch.Tensor, m: int, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k-means++ (D² sampling) seeds among the real points: `x [B, H, N, D]`, `mask [B, 1, N]`, uniforms
    `u [B, H, m]`. Returns token indices and validity `[B, H, m]`: a seed is invalid once every real point
    coincides with a chosen seed (fewer distinct real points than m)."""
    real = mask.expand(x.shape[:-1]).to(x.dtype)
    x_sq = (x * x).sum(-1)
    dmin = torch.full_like(x_sq, float("inf"))
    indices, valid = [], []
    u = u.clamp(max=1.0 - 1e-6)
    for t in range(m):
        weights = real if t == 0 else dmin.clamp_min(0.0).nan_to_num(posinf=0.0) * real
        total = weights.sum(-1, keepdim=True)
        cdf = weights.cumsum(-1)
        j = torch.searchsorted(cdf.contiguous(), (u[..., t : t + 1] * total).contiguous(), right=True)
        j = j.clamp(max=x.shape[-2] - 1)
        indices.append(j)
        valid.append(total > 0)
        c = gather_tokens(x, j)  # [B, H, 1, D]
        d = (x_sq - 2.0 * (x @ c.transpose(-1, -2)).squeeze(-1) + (c * c).sum(-1)).clamp_min(0.0)
        dmin = torch.minimum(dmin, d)
    idx, ok = torch.cat(indices, -1), torch.cat(valid, -1)
    return torch.where(ok, idx, torch.zeros_like(idx)), ok


def initial_centroids(
    x: torch.Tensor, mask: torch.Tensor, m: int, init: str, rng: SeededSelector | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting centroids `[B, H, m, D]` and validity for `x [B, H, N, D]` (fp32, detached); `rng` draws
    the random numbers of the `random` and `kmeans++` inits."""
    b, h, n, _ = x.shape
    if init == "segment_means":
        seg = segment_assignment(mask, m).expand(b, h, n)
        means, counts = cluster_means(x, seg, mask, m)
        return means, counts > 0
    if rng is None:
        raise ValueError(f"selector.init={init!r} needs a seeded selector to draw from")
    if init == "random":
        idx, valid = weighted_sample(rng.uniform((b, h, n), x.device), mask.expand(b, h, n), m)
    elif init == "kmeans++":
        idx, valid = kmeanspp_indices(x, mask, m, rng.uniform((b, h, m), x.device))
    else:
        raise ValueError(f"selector.init={init!r}: expected one of {', '.join(INITS)}")
    return gather_tokens(x, idx), valid


def cluster_landmarks(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, assignment: torch.Tensor, m: int
) -> Landmarks:
    """Differentiable query and key means over the clusters of `assignment [B, H, N]`; empty = invalid.
    One `cluster_means` on [q | k] (the one-hot is built once for both)."""
    both, counts = cluster_means(torch.cat([q, k], dim=-1), assignment, mask, m)
    q_l, k_l = both.split([q.shape[-1], k.shape[-1]], dim=-1)
    return Landmarks(queries=q_l, keys=k_l, valid=counts > 0)


def kmeans_landmarks(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor,
    m: int,
    iterations: int,
    init: str,
    empty: str,
    rng: SeededSelector | None,
) -> Landmarks:
    """Per-sequence k-means on the queries (see the module docstring)."""
    with exact_fp32(q.device):
        x = q.detach().float()
        c, c_valid = initial_centroids(x, mask, m, init, rng)
        c, c_valid = lloyd(x, mask, c, c_valid, iterations, empty)
        assignment, _ = assign(x, c, c_valid, distances=False)
    return cluster_landmarks(q, k, mask, assignment, m)


@dataclass
class KMeansConfig:
    name: str = "kmeans"
    iterations: int = 10  # Lloyd iterations (GPA: 10)
    init: str = "segment_means"  # segment_means | random | kmeans++
    empty: str = "farthest"  # farthest (re-seed) | keep (previous centroid)
    seed: int = 0  # for init=random / kmeans++


class KMeansSelector(SeededSelector):
    name = "kmeans"
    config = KMeansConfig

    randomized = False  # segment-means init is deterministic; random inits use the seeded generator

    def __init__(self, iterations: int = 10, init: str = "segment_means", empty: str = "farthest", seed: int = 0):
        super().__init__(seed)
        check_options(init, empty)
        self.iterations, self.init, self.empty = int(iterations), init, empty

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        return kmeans_landmarks(q, k, mask, m, self.iterations, self.init, self.empty, self)
