"""How well an attention's implied operator Â approximates exact softmax attention A — pure functions, fp64.

Per sequence (real tokens only: an n×n problem) and head:

* matrix residual   ‖A − Â‖_F / ‖A‖_F;    output residual   ‖(A − Â)V‖_F / ‖AV‖_F;
* Eckart–Young floor  sqrt(Σ_{i>r} σ_i²(A))  (the best any rank-r operator can do; r = the method's
  *effective* rank budget: the landmarks, features or projection rows it really used — a GPA codebook's
  valid clusters, the pivots before the stopping rule — not the nominal m), reported relative to ‖A‖_F, and
  the ratio of the achieved ‖A − Â‖_F to it (1.0 = optimal; undefined when the floor is 0, i.e. r ≥ rank A);
  a floor below `FLOOR_FLAG`·‖A‖_F makes that ratio meaningless (a tiny denominator turns ordinary errors
  into ratios of thousands): such heads are flagged and left out of the summaries' ratio;
* numerical rank of A and of Â (#σ_i > tol·σ_1); stable rank of A, ‖A‖_F² / ‖A‖_2²;
* coherence μ = (n/r)·max_i ℓ_i and block-coherence β (below), from the leverage scores ℓ_i = ‖U_r[i]‖² of
  the top-r left singular vectors U_r of A — undefined (None) when r exceeds the numerical rank of A, where
  U_r would include directions of pure rounding noise.

Summaries over heads and sequences (`summary_metrics`) are medians, plus the pooled ratio Σ‖A − Â‖_F /
Σ floor over the heads whose floor is not flagged: an arithmetic mean of ratios is dominated by the head
with the smallest floor.

Singular values come from fp64 SVDs (not eigendecompositions of AAᵀ: those lose every σ below ~1e-8·σ_1,
which would turn an exact zero floor into noise). Cost at n = 1024: about 2–3 s per sequence and head on
one CPU core — keep `probe_size`, `max_len`, `layers`, `heads` small on CPU.

Locality (how far attention reaches; Miralles-González et al. 2025, arXiv 2501.14850, argue that most LRA accuracy
comes from short-range dependencies), for Â and for the exact A alike, positions counted among the real tokens:

* expected token distance  d = (1/n) Σ_i Σ_j w_ij |i − j|  and the mass within w tokens
  (1/n) Σ_i Σ_{|i−j| ≤ w} w_ij  for w in `LOCALITY_WINDOWS`, with w_ij = |Â_ij| / Σ_j |Â_ij| (rows without weight
  left out). For a row-stochastic matrix (softmax, local attention) w = Â, so d = Σ_ij Â_ij |i − j| / n; the
  absolute values and the row normalisation make the same numbers mean "where the operator's weight lies" for
  approximations whose rows are signed or do not sum to one (Nyström's pseudo-inverse, Performer's features).
  Uniform attention over n tokens gives d = (n² − 1)/(3n) ≈ n/3; a window of w gives d ≤ w and mass 1 within w.

Block-coherence — **our operational definition** (GPA's paper gives none): cluster the n queries into r
groups C_1..C_r by k-means (the `kmeans` selector's own core: k-means++ seeding from a fixed seed, Lloyd to
convergence — deterministic) and let

    β = Σ_c max_{i∈C_c} ℓ_i  /  Σ_i ℓ_i          (Σ_i ℓ_i = r when rank A ≥ r),

the share of A's rank-r leverage that one well-chosen token per query cluster can capture. β ∈ (0, 1]:
β = 1 when each cluster's leverage sits on one token (leverage concentrated inside discoverable clusters),
β ≈ r/n when leverage is spread evenly. `leverage_top_share` (the same sum over the r highest-leverage
tokens anywhere) bounds β from above; β close to it means the clusters discover the high-leverage tokens.
Cost: one k-means (O(n·r·d) per iteration) on top of the SVD every other quantity needs.
"""

from __future__ import annotations

import math
import statistics

import torch

from lra_bench.diagnostics import LOCALITY_KEYS, LOCALITY_WINDOWS
from models.landmarks.kmeans import KMeansSettings, kmeans_fit

#: the clustering behind block-coherence: the `kmeans` selector's defaults, seeded from `CLUSTER_SEED`
CLUSTER_SETTINGS = KMeansSettings()
CLUSTER_SEED = 0


#: a floor below this share of ‖A‖_F flags the ratio to it (left out of summaries, reported as flagged)
FLOOR_FLAG = 0.01
#: below this share of ‖A‖_F the floor counts as 0 and the ratio is undefined
RATIO_UNDEFINED = 1e-12


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


def query_clusters(q: torch.Tensor, m: int) -> torch.Tensor:
    """Deterministic k-means cluster ids `[n]` of the queries `q [n, d]` (fp64; k-means++ from a fixed seed)."""
    x = q.detach().double()[None, None]
    mask = torch.ones(1, 1, q.shape[0], dtype=torch.bool, device=q.device)

    def draw(shape: tuple[int, int, int], stream: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(CLUSTER_SEED + 7919 * stream)
        return torch.rand(shape, generator=gen, dtype=torch.float64).to(q.device)

    return kmeans_fit(x, mask, m, CLUSTER_SETTINGS, draw).assignment[0, 0]


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


def row_weights(a: torch.Tensor) -> torch.Tensor:
    """|A_ij| / Σ_j |A_ij| in fp64 (rows without weight become zero rows)."""
    weights = a.double().abs()
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(torch.finfo(torch.float64).tiny), 0.0)


def locality(a: torch.Tensor, suffix: str = "") -> dict[str, float | None]:
    """Expected token distance and the mass within each of `LOCALITY_WINDOWS` of the `[n, n]` operator `a` (see the
    module docstring), keyed `attn_distance<suffix>`, `mass_within_<w><suffix>`; None when no row has weight."""
    weights = row_weights(a)
    rows = weights.sum(-1) > 0
    keys = [f"{key}{suffix}" for key in LOCALITY_KEYS]
    if not bool(rows.any()):
        return dict.fromkeys(keys, None)
    n = a.shape[-1]
    positions = torch.arange(n, device=a.device, dtype=torch.float64)
    distance = (positions[:, None] - positions[None, :]).abs()
    values = [float((weights * distance).sum(-1)[rows].mean())]
    values += [float((weights * (distance <= w)).sum(-1)[rows].mean()) for w in LOCALITY_WINDOWS]
    return dict(zip(keys, values))


def head_metrics(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a_hat: torch.Tensor,
    rank_budget: int | None,
    rank_tol: float,
    target: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, float | int | bool | None]:
    """Every quantity for one sequence and head: `q, k, v [n, d]` and `a_hat [n, n]` on the real tokens.

    `rank_budget` is the effective r (None = no budget: full rank, so no floor). `target` = (T, T̂) when the
    method approximates an operator other than softmax (the spectral mixer's affinity and its Nyström
    estimate): ‖T − T̂‖_F/‖T‖_F and ‖(T − T̂)V‖_F/‖TV‖_F are reported as `target_residual`,
    `target_output_residual`."""
    n = q.shape[0]
    a = exact_softmax(q, k)
    a_hat = a_hat.double()
    u, sigma, _ = torch.linalg.svd(a, full_matrices=False)
    r = n if rank_budget is None else max(1, min(int(rank_budget), n))
    err = fro(a - a_hat)
    floor = eckart_young_floor(sigma, r)
    norm_a = float(sigma.pow(2).sum().sqrt())
    rank_a = numerical_rank(sigma, rank_tol)
    k_lev = r if r < n else max(1, min(n, math.ceil(math.log2(max(n, 2)))))
    leverage_defined = k_lev <= rank_a
    lev = leverage_scores(u, k_lev)
    out: dict[str, float | int | bool | None] = {
        "n": n,
        "rank_budget": r,
        "matrix_residual": ratio(err, norm_a),
        "output_residual": output_residual(a, a_hat, v),
        "error_abs": err,
        "ey_floor": ratio(floor, norm_a),
        "ey_floor_abs": floor,
        "ey_ratio": err / floor if floor > RATIO_UNDEFINED * max(norm_a, 1e-300) else None,
        "floor_flagged": floor < FLOOR_FLAG * norm_a,
        "rank_a": rank_a,
        "rank_a_hat": numerical_rank(singular_values(a_hat), rank_tol),
        "stable_rank_a": stable_rank(sigma),
        "leverage_defined": leverage_defined,
        "coherence": coherence(lev, k_lev) if leverage_defined else None,
        "block_coherence": block_coherence(lev, query_clusters(q, k_lev)) if leverage_defined else None,
        "leverage_top_share": leverage_top_share(lev, k_lev) if leverage_defined else None,
    }
    out |= locality(a_hat) | locality(a, suffix="_exact")
    if target is not None:
        out["target_residual"] = matrix_residual(*target)
        out["target_output_residual"] = output_residual(*target, v)
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


#: per-head values that are bookkeeping, not quantities to summarise by a median
NOT_SUMMARISED = ("error_abs", "ey_floor_abs", "floor_flagged", "leverage_defined")


def pooled_ratio(rows: list[dict[str, float | int | bool | None]]) -> float | None:
    """Σ‖A − Â‖_F / Σ floor over the rows whose floor is not flagged (None when none is left)."""
    kept = [r for r in rows if not r.get("floor_flagged") and r.get("ey_floor_abs")]
    den = sum(_number(r, "ey_floor_abs") for r in kept)
    return sum(_number(r, "error_abs") for r in kept) / den if kept and den > 0 else None


def _number(row: dict[str, float | int | bool | None], key: str) -> float:
    """`row[key]` as a float; a row without it is a bug in the caller (a KeyError or TypeError, as before)."""
    value = row[key]
    if value is None:
        raise TypeError(f"{key} is None in {row}")
    return float(value)


def summary_metrics(rows: list[dict[str, float | int | bool | None]]) -> dict[str, float | int | None]:
    """Median of every numeric quantity over `rows` (None values ignored); the ratio to the floor as the
    median over unflagged rows and the pooled Σerr/Σfloor; how many rows were flagged."""
    keys = {key for row in rows for key in row if key not in NOT_SUMMARISED}
    out: dict[str, float | int | None] = {}
    for key in sorted(keys):
        values = [float(v) for row in rows if isinstance(v := row.get(key), int | float)]
        out[key] = median(values)
    unflagged = [r for r in rows if not r.get("floor_flagged")]
    out["ey_ratio"] = median([float(v) for r in unflagged if (v := r.get("ey_ratio")) is not None])
    out["ey_ratio_pooled"] = pooled_ratio(rows)
    out["floor_flagged"] = sum(bool(r.get("floor_flagged")) for r in rows)
    out["leverage_undefined"] = sum(r.get("leverage_defined") is False for r in rows)
    out["count"] = len(rows)
    return out
