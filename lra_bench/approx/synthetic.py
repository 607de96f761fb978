"""Synthetic attention inputs with controlled structure: q, k, v `[n, d]` (fp64), one head.

* `geometric` / `algebraic`: the logit matrix L = q kᵀ/√d = U diag(σ) Vᵀ has a prescribed singular-value
  decay — σ_i = ρ^(i−1) (geometric) or σ_i = i^(−α) (algebraic), i = 1…d — with U, V Haar-random orthonormal
  n×d frames. The spectrum is rescaled so the logits' RMS entry is `logit_std` (‖L‖_F = logit_std·n): the
  softmax temperature is then comparable across decays. (The decay is the decay of QKᵀ; A = softmax(L)
  inherits it only approximately — its own spectrum is measured, not assumed.)
* `clusters`: planted block-coherent tokens. c centroids μ_j ~ N(0, I_d) with unequal cluster sizes
  (proportions ∝ j^(−zipf)); token x_i = μ_c(i) + noise·ε_i, in random order (so position says nothing about
  cluster); q = x W_q, k = x W_k with Gaussian W's, rescaled so the logits' RMS entry is `logit_std`. Rows of
  A then depend (up to noise) on the query's cluster and its columns on the key's cluster: A is close to a
  rank-c block matrix whose leverage sits in the clusters — small clusters included, which uniform sampling
  tends to miss.
* `planted_rank`: keys take exactly r distinct values, so A = softmax(q kᵀ/√d) has rank ≤ r exactly
  (identical keys give identical columns) — the test bed for "pivoting finds the column space".

v ~ N(0, I) everywhere (a probe for the output residual).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _frame(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, d, generator=gen, dtype=torch.float64))
    return q


def _scale_logits(q: torch.Tensor, k: torch.Tensor, logit_std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rescale q and k by one common factor so that the RMS entry of q kᵀ/√d is `logit_std`."""
    n, d = q.shape
    rms = float(torch.linalg.norm(q @ k.T / math.sqrt(d))) / n
    s = math.sqrt(logit_std / max(rms, 1e-300))
    return q * s, k * s


def spectrum(kind: str, d: int, decay: float) -> torch.Tensor:
    i = torch.arange(1, d + 1, dtype=torch.float64)
    if kind == "geometric":
        return decay ** (i - 1)
    if kind == "algebraic":
        return i ** (-decay)
    raise ValueError(f"spectrum kind={kind!r}: expected geometric or algebraic")


def decay_inputs(
    n: int, d: int, kind: str, decay: float, logit_std: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sigma = spectrum(kind, d, decay)
    u, w = _frame(n, d, gen), _frame(n, d, gen)
    root = sigma.sqrt() * d**0.25  # q kᵀ/√d = U diag(σ) Wᵀ
    q, k = _scale_logits(u * root, w * root, logit_std)
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return q, k, v


def cluster_sizes(n: int, clusters: int, zipf: float) -> list[int]:
    """Sizes ∝ j^(−zipf), each ≥ 1, summing to n."""
    w = [(j + 1) ** (-zipf) for j in range(clusters)]
    raw = [max(1, int(round(n * x / sum(w)))) for x in w]
    raw[0] += n - sum(raw)
    return raw


def cluster_inputs(
    n: int, d: int, clusters: int, zipf: float, noise: float, logit_std: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v and each token's planted cluster id `[n]`."""
    gen = torch.Generator().manual_seed(seed)
    sizes = cluster_sizes(n, clusters, zipf)
    labels = torch.cat([torch.full((s,), j, dtype=torch.long) for j, s in enumerate(sizes)])
    labels = labels[torch.randperm(n, generator=gen)]
    centroids = torch.randn(clusters, d, generator=gen, dtype=torch.float64)
    x = centroids[labels] + noise * torch.randn(n, d, generator=gen, dtype=torch.float64)
    wq = torch.randn(d, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    wk = torch.randn(d, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    q, k = _scale_logits(x @ wq, x @ wk, logit_std)
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return q, k, v, labels


def planted_rank_inputs(
    n: int, d: int, rank: int, logit_std: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys with exactly `rank` distinct values (random order): rank(softmax(q kᵀ/√d)) ≤ rank."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, d, generator=gen, dtype=torch.float64)
    distinct = torch.randn(rank, d, generator=gen, dtype=torch.float64)
    which = torch.arange(n) % rank
    k = distinct[which[torch.randperm(n, generator=gen)]]
    q, k = _scale_logits(q, k, logit_std)
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return q, k, v


def generate(name: str, spec: dict[str, Any], n: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Dispatch on the source `name` with its settings `spec` (see conf/approx.yaml)."""
    std = float(spec.get("logit_std", 2.0))
    kind = spec.get("kind", name)
    if kind in ("geometric", "algebraic"):
        return decay_inputs(n, d, kind, float(spec["decay"]), std, seed)
    if kind == "clusters":
        q, k, v, _ = cluster_inputs(n, d, int(spec["clusters"]), float(spec["zipf"]), float(spec["noise"]), std, seed)
        return q, k, v
    if kind == "planted_rank":
        return planted_rank_inputs(n, d, int(spec["rank"]), std, seed)
    raise ValueError(f"approx source kind={kind!r}: expected geometric, algebraic, clusters or planted_rank")


def covered_instances(
    n: int, d: int, logit_std: float, seed: int
) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Inputs whose softmax attention A is determined exactly by a few landmark tokens: (name, q, k, indices).

    * `clusters`: 16 planted clusters of *identical* tokens (no noise; Zipf sizes, shuffled) — A has 16
      distinct rows and columns, and one token per cluster (16 landmarks) covers it; `clusters_twice` names
      every cluster's token twice (32 landmarks, an exactly singular core);
    * `planted_rank`: keys with 16 distinct values, each n/16 times — one landmark token per distinct key (16)
      or two different tokens per distinct key (32).

    Nyström with these landmarks reproduces A exactly in exact arithmetic (the interpolation is exact and the
    key multiplicities are equal within what the landmarks see), so any error is the solve's."""
    _, _, _, labels = cluster_inputs(n, d, 16, 1.5, 0.0, logit_std, seed)
    qc, kc, _, _ = cluster_inputs(n, d, 16, 1.5, 0.0, logit_std, seed)
    first = torch.stack([torch.nonzero(labels == c)[0, 0] for c in range(16)])
    qr, kr, _ = planted_rank_inputs(n, d, 16, logit_std, seed)
    _, value = torch.unique(kr, dim=0, return_inverse=True)
    one = torch.stack([torch.nonzero(value == c)[0, 0] for c in range(16)])
    two = torch.stack([torch.nonzero(value == c)[1, 0] for c in range(16)])
    return [
        ("clusters", qc, kc, first),
        ("clusters_twice", qc, kc, torch.cat([first, first])),
        ("planted_rank", qr, kr, one),
        ("planted_rank_two", qr, kr, torch.cat([one, two])),
    ]
