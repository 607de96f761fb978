"""k-means landmarks: a proper k-means on the queries; landmarks = query and key means over the clusters.

One k-means core serves the `kmeans` selector, GPA's codebook refresh (`models/landmarks/gpa.py`) and the
block-coherence diagnostic (`lra_bench/diagnostics/metrics.py`):

* **seeding**: greedy k-means++ (D² sampling, `2 + ⌊ln m⌋` candidates per step, the one that lowers the
  potential most is kept — the variant scikit-learn uses), drawn from the selector's own seeded generator;
  `segment_means` (Nyströmformer's landmarks) and `random` (m distinct real tokens) remain as options. Why
  k-means++ by default: started from segment means, Lloyd cannot leave the basin that token order puts it
  in, so when position says nothing about the clusters (shuffled planted clusters) it stalled at 1.3–1.9×
  the inertia of a proper k-means and its Nyström error did not fall with m;
* **Lloyd until it converges**: a sequence/head stops when its assignment no longer changes or its inertia
  falls by less than `tol` (relative) in one step; the loop ends when every sequence/head has stopped, or at
  `max_iterations` (a cap). Converged sequences are frozen, so batch-mates never change each other's result;
* **restarts**: `restarts` independent seedings, the lowest inertia kept per sequence/head;
* **empty clusters** are re-seeded onto the real points farthest from their centroids (`farthest`) or keep
  their previous centroid (`keep`); a cluster that ends empty is an invalid landmark.

Cost: seeding is m·(2 + ln m) distance columns, O(N·m·log m·D); each Lloyd iteration is one batched
‖c‖² − 2·x·cᵀ matmul (`baddbmm`) plus the one-hot cluster means, O(N·m·D) — never a B×N×m×D or N×N tensor.
The stopping test costs one host sync per iteration.

Differentiability: the clustering runs on detached fp32 queries under `no_grad` with autocast off; only the
landmarks are differentiable — query means AND key means over the final clusters, recomputed from the
(constant) assignment with `cluster_means` (the stop-grad pattern of clustered attention). Padding never
seeds, joins or moves a cluster.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol, overload

import torch

from models.cost import Flops, Params, lloyd_flops
from models.cpu import below_vector_width
from models.knobs import follows_run_seed, knobs
from models.landmarks.base import Landmarks, cluster_landmarks, cluster_means, gather_tokens
from models.landmarks.segment_means import segment_assignment
from models.landmarks.uniform import SeededSelector, weighted_sample

INITS = ("kmeans++", "segment_means", "random")
EMPTY = ("farthest", "keep")

#: draws uniforms `[B, H, L]` for one purpose (`stream`): the selector's own generator (see `SeededSelector`)
Draw = Callable[[tuple[int, int, int], int], torch.Tensor]


@dataclass(frozen=True)
class KMeansSettings:
    """The knobs of one k-means run, validated: the `kmeans` and `gpa` selectors' config fields of the same names
    take their defaults from here (`KMeansConfig`, `models.landmarks.gpa.GPAConfig`), so the two selectors and the
    diagnostics' clustering share one k-means default."""

    max_iterations: int = 100
    tol: float = 1e-4
    restarts: int = 1
    init: str = "kmeans++"
    empty: str = "farthest"

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ValueError(f"selector.init={self.init!r}: expected one of {', '.join(INITS)}")
        if self.empty not in EMPTY:
            raise ValueError(f"selector.empty={self.empty!r}: expected one of {', '.join(EMPTY)}")
        if int(self.max_iterations) < 0:
            raise ValueError(f"selector.max_iterations={self.max_iterations}: must be >= 0")
        if int(self.restarts) < 1:
            raise ValueError(f"selector.restarts={self.restarts}: must be >= 1")
        if float(self.tol) < 0:
            raise ValueError(f"selector.tol={self.tol}: must be >= 0")


@dataclass
class KMeansFit:
    """Centroids `[B, H, m, D]`, their validity `[B, H, m]`, the assignment `[B, H, N]`, the inertia `[B, H]`
    (sum over real tokens of the squared distance to their centroid) and the Lloyd iterations run (max)."""

    centroids: torch.Tensor
    valid: torch.Tensor
    assignment: torch.Tensor
    inertia: torch.Tensor
    iterations: int


@contextlib.contextmanager
def exact_fp32(device: torch.device) -> Iterator[None]:
    """No grad and no autocast: clustering arithmetic stays fp32 whatever the training precision."""
    with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
        yield


def half_distances(
    x: torch.Tensor, c: torch.Tensor, c_valid: torch.Tensor | None = None, by_centroid: bool = False
) -> torch.Tensor:
    """‖c‖² − 2·x·cᵀ for `x [..., N, D]`, `c [..., m, D]` → `[..., N, m]` (add ‖x‖² for true distances);
    +inf for invalid centroids (`c_valid [..., m]`), folded into the bias of one `baddbmm`. `by_centroid`:
    the same values laid out `[..., m, N]`."""
    lead = torch.broadcast_shapes(x.shape[:-2], c.shape[:-2])
    x3 = x.expand(*lead, *x.shape[-2:]).reshape(-1, *x.shape[-2:])
    c3 = c.expand(*lead, *c.shape[-2:]).reshape(-1, *c.shape[-2:])
    bias = (c3 * c3).sum(-1)
    if c_valid is not None:
        valid = c_valid.expand(*lead, c.shape[-2]).reshape(-1, c.shape[-2])
        bias = bias.masked_fill(~valid, float("inf"))
    if by_centroid:
        out = torch.baddbmm(bias.unsqueeze(2), c3, x3.transpose(1, 2), alpha=-2.0)
        return out.reshape(*lead, c.shape[-2], x.shape[-2])
    out = torch.baddbmm(bias.unsqueeze(1), x3, c3.transpose(1, 2), alpha=-2.0)
    return out.reshape(*lead, x.shape[-2], c.shape[-2])


@overload
def assign(
    x: torch.Tensor, c: torch.Tensor, c_valid: torch.Tensor, distances: Literal[True] = True
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def assign(
    x: torch.Tensor, c: torch.Tensor, c_valid: torch.Tensor, distances: Literal[False]
) -> tuple[torch.Tensor, None]: ...
def assign(
    x: torch.Tensor, c: torch.Tensor, c_valid: torch.Tensor, distances: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Nearest valid centroid of every point and (if `distances`) its squared distance (≥ 0).

    With fewer centroids than a CPU vector register holds (`models.cpu`: GPA's m = 11) the distances are laid out
    `[…, m, N]` and the minimum taken along dim −2, vectorised across the points: 10.3 → 6.2 ms per call at B=32,
    H=2, N=2048, D=32 on one AVX-512 thread. The distances agree to fp32 rounding (dot products summed in another
    order); ties go to the first centroid either way."""
    if below_vector_width(c.shape[-2], x.device):
        best, idx = half_distances(x, c, c_valid, by_centroid=True).min(dim=-2)
    else:
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
    ok = ok & (far_d.gather(-1, rank) > 0)  # a point already on its centroid cannot found a new cluster
    points = gather_tokens(x.expand(*pick.shape[:-1], *x.shape[-2:]), pick)
    return torch.where(ok.unsqueeze(-1), points, centroids), ok


def lloyd(
    x: torch.Tensor,
    mask: torch.Tensor,
    centroids: torch.Tensor,
    c_valid: torch.Tensor,
    max_iterations: int,
    tol: float = KMeansSettings.tol,
    empty: str = KMeansSettings.empty,
) -> KMeansFit:
    """Lloyd's algorithm on `x [B, H, N, D]` (detached) with real-token `mask [B, 1, N]` from `centroids
    [B, H, m, D]` / `c_valid [B, H, m]`, each sequence/head until its assignment stops changing or its inertia
    falls by less than `tol` (relative) in a step; the loop stops when all have, or after `max_iterations`."""
    m = centroids.shape[-2]
    real = mask.expand(x.shape[:-1])
    realf = real.to(x.dtype)
    idx, dist = assign(x, centroids, c_valid)
    inertia = (dist * realf).sum(-1)
    active = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    done = 0
    for step in range(int(max_iterations)):
        if not bool(active.any()):
            break
        means, counts = cluster_means(x, idx, mask, m)
        filled = counts > 0
        if empty == "farthest":
            means, reseeded = reseed_farthest(x, mask, dist, means, ~filled)
            new_valid = filled | reseeded
        else:  # keep: an empty cluster keeps its previous centroid (and validity)
            means = torch.where(filled.unsqueeze(-1), means, centroids)
            new_valid = filled | c_valid
        centroids = torch.where(active[..., None, None], means, centroids)
        c_valid = torch.where(active[..., None], new_valid, c_valid)
        new_idx, new_dist = assign(x, centroids, c_valid)
        new_inertia = (new_dist * realf).sum(-1)
        changed = ((new_idx != idx) & real).any(-1)
        improving = (inertia - new_inertia) > float(tol) * inertia
        idx = torch.where(active[..., None], new_idx, idx)
        dist = torch.where(active[..., None], new_dist, dist)
        inertia = torch.where(active, new_inertia, inertia)
        active = active & changed & improving
        done = step + 1
    return KMeansFit(centroids, c_valid, idx, inertia, done)


def kmeanspp_indices(
    x: torch.Tensor, mask: torch.Tensor, m: int, u: torch.Tensor, trials: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy k-means++ seeds among the real points: `x [B, H, N, D]`, `mask [B, 1, N]`, uniforms
    `u [B, H, m·trials]`. Seed 1 is a uniformly drawn real point; each next one is the best (lowest potential
    Σ min-distance²) of `trials` real points drawn ∝ their squared distance to the nearest seed so far
    (`trials=1`: plain D² sampling). Returns token indices and validity `[B, H, m]`: a seed is invalid once
    every real point coincides with a chosen seed (fewer distinct real points than m)."""
    real = mask.expand(x.shape[:-1]).to(x.dtype)
    x_sq = (x * x).sum(-1)
    dmin = torch.full_like(x_sq, float("inf"))
    u = u.clamp(max=1.0 - 1e-6).reshape(*x.shape[:2], m, trials)
    indices, valid = [], []
    for t in range(m):
        weights = real if t == 0 else dmin.clamp_min(0.0).nan_to_num(posinf=0.0) * real
        total = weights.sum(-1, keepdim=True)
        cdf = weights.cumsum(-1).contiguous()
        draws = u[..., t, :1] if t == 0 else u[..., t, :]
        cand = torch.searchsorted(cdf, (draws * total).contiguous(), right=True).clamp(max=x.shape[-2] - 1)
        c = gather_tokens(x, cand)  # [B, H, trials, D]
        d = (x_sq.unsqueeze(-1) - 2.0 * (x @ c.transpose(-1, -2)) + (c * c).sum(-1).unsqueeze(-2)).clamp_min(0.0)
        d = torch.minimum(dmin.unsqueeze(-1), d)  # [B, H, N, trials]: min-distance² with each candidate added
        best = (d * real.unsqueeze(-1)).nan_to_num(posinf=0.0).sum(-2).argmin(-1, keepdim=True)  # [B, H, 1]
        indices.append(cand.gather(-1, best))
        valid.append(total > 0)
        dmin = d.gather(-1, best.unsqueeze(-2).expand(*d.shape[:-1], 1)).squeeze(-1)
    idx, ok = torch.cat(indices, -1), torch.cat(valid, -1)
    return torch.where(ok, idx, torch.zeros_like(idx)), ok


def greedy_trials(m: int) -> int:
    """Candidates per k-means++ step: 2 + ⌊ln m⌋ (Arthur & Vassilvitskii's suggestion, scikit-learn's default)."""
    return 2 + int(math.log(max(m, 1)))


def initial_centroids(
    x: torch.Tensor, mask: torch.Tensor, m: int, init: str, draw: Draw | None, stream: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting centroids `[B, H, m, D]` and validity for `x [B, H, N, D]` (detached); `draw` supplies the
    random numbers of the `random` and `kmeans++` inits (`stream` tells restarts apart)."""
    b, h, n, _ = x.shape
    if init == "segment_means":
        seg = segment_assignment(mask, m).expand(b, h, n)
        means, counts = cluster_means(x, seg, mask, m)
        return means, counts > 0
    if draw is None:
        raise ValueError(f"selector.init={init!r} needs a seeded selector to draw from")
    if init == "random":
        idx, valid = weighted_sample(draw((b, h, n), stream).to(x.dtype), mask.expand(b, h, n), m)
    elif init == "kmeans++":
        trials = greedy_trials(m)
        idx, valid = kmeanspp_indices(x, mask, m, draw((b, h, m * trials), stream).to(x.dtype), trials)
    else:
        raise ValueError(f"selector.init={init!r}: expected one of {', '.join(INITS)}")
    return gather_tokens(x, idx), valid


def kmeans_fit(
    x: torch.Tensor,
    mask: torch.Tensor,
    m: int,
    settings: KMeansSettings,
    draw: Draw | None,
    start: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> KMeansFit:
    """k-means of `x [B, H, N, D]` (detached; real-token `mask [B, 1, N]`) into m clusters per (B, H): seeding
    (or `start` = centroids, validity to warm-start from), Lloyd to convergence, best of `restarts`."""
    b, h = x.shape[:2]
    run = lambda c, v, xx, mm: lloyd(xx, mm, c, v, settings.max_iterations, settings.tol, settings.empty)  # noqa: E731
    if start is not None:
        c, v = start
        return run(c.expand(b, h, *c.shape[-2:]), v.expand(b, h, v.shape[-1]), x, mask)
    restarts = 1 if settings.init == "segment_means" else int(settings.restarts)
    fits = [run(*initial_centroids(x, mask, m, settings.init, draw, stream=r), x, mask) for r in range(restarts)]
    if restarts == 1:
        return fits[0]
    best = torch.stack([f.inertia for f in fits]).argmin(0)  # [B, H]

    def pick(name: str) -> torch.Tensor:
        stacked = torch.stack([getattr(f, name) for f in fits])  # [R, B, H, ...]
        sel = best.view(1, b, h, *([1] * (stacked.dim() - 3))).expand(1, b, h, *stacked.shape[3:])
        return stacked.gather(0, sel)[0]

    return KMeansFit(
        pick("centroids"), pick("valid"), pick("assignment"), pick("inertia"), max(f.iterations for f in fits)
    )


def selector_draw(selector: SeededSelector, device: torch.device) -> Draw:
    """The selector's own generator as a `Draw` (training: its advancing stream; eval: fixed per stream)."""
    return lambda shape, stream: selector.uniform(shape, device, stream)


def kmeans_landmarks(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int, settings: KMeansSettings, draw: Draw | None
) -> tuple[Landmarks, KMeansFit]:
    """Per-sequence k-means on the queries (see the module docstring) and the fit behind the landmarks."""
    with exact_fp32(q.device):
        fit = kmeans_fit(q.detach().float(), mask, m, settings, draw)
    return cluster_landmarks(q, k, mask, fit.assignment, m), fit


def seeding_flops(n: int, m: int, d: int, init: str, restarts: int) -> float:
    """Greedy k-means++: m steps of 2 + ⌊ln m⌋ candidate distance columns, per restart (segment means: one pass;
    random tokens: no arithmetic)."""
    if init == "segment_means":
        return float(n * d)
    if init == "random":
        return 0.0
    return max(1, int(restarts)) * m * (2 + int(math.log(max(m, 1)))) * 2.0 * n * d


class HasKMeansKnobs(Protocol):
    """A selector config that carries the k-means knobs (`kmeans`, and `gpa`, which builds on this module and so
    is not imported here)."""

    max_iterations: int
    tol: float
    restarts: int
    init: str
    empty: str


def kmeans_settings(cfg: HasKMeansKnobs) -> KMeansSettings:
    """The validated k-means knobs of a `kmeans` or `gpa` selector config."""
    return KMeansSettings(int(cfg.max_iterations), float(cfg.tol), int(cfg.restarts), cfg.init, cfg.empty)


@dataclass
class KMeansConfig:
    """Per-sequence k-means on the queries (k-means++ seeding, Lloyd to convergence); landmarks = query and key
    means over the clusters."""

    name: str = "kmeans"
    max_iterations: int = KMeansSettings.max_iterations  # cap on Lloyd iterations (it stops earlier
    #                                                       once every sequence/head converged)
    tol: float = KMeansSettings.tol  # converged when the inertia falls by less than tol (relative) in one step
    restarts: int = KMeansSettings.restarts  # independent seedings; the lowest inertia is kept
    init: str = KMeansSettings.init  # kmeans++ | segment_means | random
    empty: str = KMeansSettings.empty  # farthest (re-seed empty clusters) | keep (previous centroid)
    seed: int = follows_run_seed()  # the selector's own generator (kmeans++ / random seeding)


class KMeansSelector(SeededSelector):
    config = KMeansConfig

    randomized = False  # data-driven: the seeding follows the data

    def configure(self, cfg: KMeansConfig) -> None:
        super().configure(cfg)
        self.settings = kmeans_settings(cfg)
        self.last_iterations = 0  # Lloyd iterations of the last call (the slowest sequence/head)

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        lm, fit = kmeans_landmarks(q, k, mask, m, self.settings, selector_draw(self, q.device))
        self.last_iterations = fit.iterations
        return lm

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        # seeding, Lloyd iterations at their cap (an upper bound: Lloyd stops once every sequence/head converged),
        # per restart, the final assignment, then q and k means over the clusters
        cfg = knobs(KMeansConfig, params)
        its = int(cfg.max_iterations)
        restarts = 1 if cfg.init == "segment_means" else max(1, int(cfg.restarts))
        seeding = seeding_flops(n, m, d, cfg.init, cfg.restarts)
        work = seeding + restarts * lloyd_flops(n, m, d, its) + 2.0 * n * m * d + 2.0 * n * d
        return Flops(0.0, work)
