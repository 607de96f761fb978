"""How well an attention's implied operator Â approximates exact softmax attention A — pure functions, fp64.

Per sequence (real tokens only: an n×n problem) and head:

* matrix residual   ‖A − Â‖_F / ‖A‖_F;    output residual   ‖(A − Â)V‖_F / ‖AV‖_F;
* Eckart–Young floor  sqrt(Σ_{i>r} σ_i²(A))  (the best any rank-r operator can do; r = the method's rank
  budget: landmarks, features, projection rows), reported relative to ‖A‖_F, and the ratio of the achieved
  ‖A − Â‖_F to it (1.0 = optimal; undefined when the floor is 0, i.e. r ≥ rank A);
* numerical rank of A and of Â (#σ_i > tol·σ_1); stable rank of A, ‖A‖_F² / ‖A‖_2²;
* coherence μ = (n/r)·max_i ℓ_i and block-coherence β (below), from the leverage scores ℓ_i = ‖U_r[i]‖² of
  the top-r left singular vectors U_r of A.

Singular values come from fp64 SVDs (not eigendecompositions of AAᵀ: those lose every σ below ~1e-8·σ_1,
which would turn an exact zero floor into noise). Cost at n = 1024: about 2–3 s per sequence and head on
one CPU core — keep `probe_size`, `max_len`, `layers`, `heads` small on CPU.

Block-coherence — **our operational definition** (GPA's paper gives none; reference/algorithms.md §1):
cluster the n queries into r groups C_1..C_r by k-means (segment-means init, 10 Lloyd iterations: the
`kmeans` selector's own routine, deterministic) and let

    β = Σ_c max_{i∈C_c} ℓ_i  /  Σ_i ℓ_i          (Σ_i ℓ_i = r when rank A ≥ r),

the share of A's rank-r leverage that one well-chosen token per query cluster can capture. β ∈ (0, 1]:
β = 1 when each cluster's leverage sits on one token (leverage concentrated inside discoverable clusters),
β ≈ r/n when leverage is spread evenly. `leverage_top_share` (the same sum over the r highest-leverage
tokens anywhere) bounds β from above; β close to it means the clusters discover the high-leverage tokens.
Cost: one k-means (O(n·r·d) per iteration) on top of the SVD every other quantity needs.
"""

from __future__ import annotations

import math

import torch

from models.landmarks.kmeans import assign, initial_centroids, lloyd


def exact_softmax(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√d) in fp64 for `q [n, d]`, `k [n, d]` (real tokens only)."""
    q, k = q.double(), k.double()
    return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)


def fro(x: torch.Tensor) -> float:
    return float(torch.linalg.norm(x.double()))


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def matrix_residual(a: torch.Tensor, a_hat: torch.Tensor) -> float | None:
    """‖A − Â‖_F / ‖A‖_F."""
    return ratio(fro(a.double() - a_hat.double()), fro(a))


def output_residual(a: torch.Tensor, a_hat: torch.Tensor, v: torch.Tensor) -> float | None:
    """‖(A − Â)V‖_F / ‖AV‖_F."""
    v = v.double()
    return ratio(fro((a.double() - a_hat.double()) @ v), fro(a.double() @ v))


def singular_values(a: torch.Tensor) -> torch.Tensor:
    """σ_1 ≥ σ_2 ≥ … in fp64."""
    return torch.linalg.svdvals(a.double())


def eckart_young_floor(sigma: torch.Tensor, rank: int) -> float:
    """sqrt(Σ_{i>r} σ_i²): the smallest ‖A − B‖_F over all B of rank ≤ r."""
    return float(sigma[rank:].pow(2).sum().sqrt()) if rank < sigma.numel() else 0.0


def numerical_rank(sigma: torch.Tensor, tol: float) -> int:
    """#σ_i > tol·σ_1 (0 for the zero matrix)."""
    if sigma.numel() == 0 or float(sigma[0]) <= 0:
        return 0
    return int((sigma > tol * sigma[0]).sum())


def stable_rank(sigma: torch.Tensor) -> float | None:
    """‖A‖_F² / ‖A‖_2²."""
    if sigma.numel() == 0 or float(sigma[0]) <= 0:
        return None
    return float(sigma.pow(2).sum() / sigma[0].pow(2))


def leverage_scores(u: torch.Tensor, rank: int) -> torch.Tensor:
    """ℓ_i = ‖U_r[i]‖² from the left singular vectors `u [n, ≥r]`."""
    return u[:, :rank].double().pow(2).sum(-1)


def coherence(lev: torch.Tensor, rank: int) -> float | None:
    """μ = (n/r)·max_i ℓ_i ∈ [1, n/r]."""
    return float(lev.numel() / rank * lev.max()) if rank > 0 and lev.numel() else None


def query_clusters(q: torch.Tensor, m: int, iterations: int = 10) -> torch.Tensor:
    """Deterministic k-means cluster ids `[n]` of the queries `q [n, d]` (segment-means init, Lloyd)."""
    x = q.detach().double()[None, None]
    mask = torch.ones(1, 1, q.shape[0], dtype=torch.bool, device=q.device)
    c, c_valid = initial_centroids(x, mask, m, "segment_means", None)
    c, c_valid = lloyd(x, mask, c, c_valid, iterations, "farthest")
    return assign(x, c, c_valid, distances=False)[0][0, 0]


def block_coherence(lev: torch.Tensor, clusters: torch.Tensor) -> float | None:
    """β = Σ_c max_{i∈C_c} ℓ_i / Σ_i ℓ_i (see the module docstring)."""
    total = float(lev.sum())
    if total <= 0:
        return None
    m = int(clusters.max()) + 1
    best = torch.zeros(m, dtype=lev.dtype, device=lev.device).scatter_reduce(0, clusters, lev, "amax")
    return float(best.sum()) / total


def leverage_top_share(lev: torch.Tensor, rank: int) -> float | None:
    """Share of Σℓ held by the r highest-leverage tokens (the upper bound of β)."""
    total = float(lev.sum())
    return float(lev.topk(min(rank, lev.numel())).values.sum()) / total if total > 0 else None


def head_metrics(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a_hat: torch.Tensor,
    rank_budget: int | None,
    rank_tol: float,
    target: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, float | int | None]:
    """Every quantity for one sequence and head: `q, k, v [n, d]` and `a_hat [n, n]` on the real tokens.

    `rank_budget` is r (None = no budget: full rank, so no floor). `target` = (T, T̂) when the method
    approximates an operator other than softmax (the spectral mixer's affinity and its Nyström estimate):
    ‖T − T̂‖_F/‖T‖_F and ‖(T − T̂)V‖_F/‖TV‖_F are reported as `target_residual`, `target_output_residual`."""
    n = q.shape[0]
    a = exact_softmax(q, k)
    a_hat = a_hat.double()
    u, sigma, _ = torch.linalg.svd(a, full_matrices=False)
    r = n if rank_budget is None else max(1, min(int(rank_budget), n))
    err = fro(a - a_hat)
    floor = eckart_young_floor(sigma, r)
    norm_a = float(sigma.pow(2).sum().sqrt())
    k_lev = r if r < n else max(1, min(n, math.ceil(math.log2(max(n, 2)))))
    lev = leverage_scores(u, k_lev)
    out: dict[str, float | int | None] = {
        "n": n,
        "rank_budget": r,
        "matrix_residual": ratio(err, norm_a),
        "output_residual": output_residual(a, a_hat, v),
        "ey_floor": ratio(floor, norm_a),
        "ey_floor_abs": floor,
        "ey_ratio": err / floor if floor > 1e-12 * max(norm_a, 1e-300) else None,
        "rank_a": numerical_rank(sigma, rank_tol),
        "rank_a_hat": numerical_rank(singular_values(a_hat), rank_tol),
        "stable_rank_a": stable_rank(sigma),
        "coherence": coherence(lev, k_lev),
        "block_coherence": block_coherence(lev, query_clusters(q, k_lev)),
        "leverage_top_share": leverage_top_share(lev, k_lev),
    }
    if target is not None:
        out["target_residual"] = matrix_residual(*target)
        out["target_output_residual"] = output_residual(*target, v)
    return out


def mean_metrics(rows: list[dict[str, float | int | None]]) -> dict[str, float | None]:
    """Mean of every key over `rows`, ignoring None (None when no row has a value)."""
    keys = {key for row in rows for key in row}
    out: dict[str, float | None] = {}
    for key in sorted(keys):
        values = [float(row[key]) for row in rows if row.get(key) is not None]
        out[key] = sum(values) / len(values) if values else None
    return out
