"""What each method costs, counted by hand: FLOPs and a memory estimate per attention name.

Convention (the one behind "achieved rate"): matrix products count 2 FLOPs per multiply–add; elementwise work
(exp, softmax, scaling, masking) is not counted, except the few additions that *are* a step's whole work
(segment or cluster means), counted 1 per add. The count is what the algorithm needs, not what a particular
implementation happens to execute (fused kernels that recompute, one-hot matmuls that stand in for a scatter):
the bench also records `torch.utils.flop_counter` counts of the real code beside it, so the two can be
compared. Backward of a differentiable matrix product costs two products, so backward = 2 × the
differentiable forward FLOPs; landmark selection that runs under `no_grad` has no backward.

`attention_flops(name, ...)` returns None for a name without an entry here ("unknown" in the report) — a new
attention gets a line in `ATTENTION_FLOPS` (and, if it is not linear in n, `ATTENTION_MEMORY`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Params = dict[str, Any]


@dataclass(frozen=True)
class Flops:
    """FLOPs per call: `differentiable` forward work, `selection` (no-grad) forward work, and `backward`
    (default 2 × differentiable; less where a factor is a constant, e.g. Performer's random projection)."""

    differentiable: float
    selection: float = 0.0
    backward: float | None = None

    @property
    def forward(self) -> float:
        return self.differentiable + self.selection

    @property
    def backward_flops(self) -> float:
        return 2.0 * self.differentiable if self.backward is None else self.backward

    @property
    def forward_backward(self) -> float:
        return self.forward + self.backward_flops

    def for_mode(self, mode: str) -> float:
        return self.forward if mode == "forward" else self.forward_backward

    def __add__(self, other: Flops) -> Flops:
        return Flops(
            self.differentiable + other.differentiable,
            self.selection + other.selection,
            self.backward_flops + other.backward_flops,
        )

    def scaled(self, factor: float) -> Flops:
        return Flops(self.differentiable * factor, self.selection * factor, self.backward_flops * factor)


# Per (batch·head) forward FLOPs; `bh` multiplies in `attention_flops`. n tokens, m landmarks, d head dim.


def _full(n: int, m: int | None, d: int, p: Params) -> Flops:
    return Flops(4.0 * n * n * d)  # QKᵀ and AV


def _pinv(m: int, p: Params) -> float:
    if p.get("pinv", "iterative") == "iterative":
        return 8.0 * int(p.get("pinv_iterations", 6)) * m**3  # 4 m×m products per Newton–Schulz step
    return 24.0 * m**3  # fp32 SVD-based pinv: an order-of-magnitude estimate, not a count


def _conv(n: int, d: int, p: Params) -> float:
    return 2.0 * int(p.get("conv_kernel", 0) or 0) * n * d  # depthwise conv of V along the sequence


def _nystrom(n: int, m: int | None, d: int, p: Params) -> Flops:
    m = int(m or 0)
    kernels = 2 * n * m * d * 2 + 2 * m * m * d  # QK̃ᵀ, Q̃Kᵀ, Q̃K̃ᵀ
    apply = 2 * m * n * d + 2 * m * m * d + 2 * n * m * d  # right·V, core⁺·(…), left·(…)
    return Flops(kernels + apply + _pinv(m, p) + _conv(n, d, p))


def _spectral(n: int, m: int | None, d: int, p: Params) -> Flops:
    s = int(m or 0)
    dz = 2 * d if p.get("tokens", "qk") == "qk" else d  # affinity on [q; k] (2d) or on one of them
    # C = tanh(Z Z_Sᵀ), W = tanh(Z_S Z_Sᵀ); μ = diag(UᵀWU) and P = U diag(1/μ) Uᵀ (differentiable, 2 s³ each);
    # out = C (P (Cᵀ V)). The eigendecomposition itself runs without grad (≈ 9 s³, an estimate).
    diff = 2 * n * s * dz + 2 * s * s * dz + 4.0 * s**3 + 2 * n * s * d + 2 * s * s * d + 2 * n * s * d
    return Flops(diff, 9.0 * s**3)


def _skyformer(n: int, m: int | None, d: int, p: Params) -> Flops:
    m = int(m or p.get("num_landmarks", 128))
    # κ(Q, X_S), κ(X_S, K), κ(X_S, X_S) (Gaussian kernels: one product each), pinv, right-to-left apply
    return Flops(8.0 * n * m * d + 4.0 * m * m * d + _pinv(m, p))


def _pivoted(n: int, m: int | None, d: int, p: Params) -> Flops:
    r = int(m or 0)
    ell = max(1, min(n, int(p.get("sketch_rows", 0) or 0) or 2 * r))
    # kernel mode: exact sketch rows E_S (ℓ×n) and E_S·V, C_S = E_S[:, J], E[:, J] for all rows, the ridge
    # solve (Gram, right-hand side, LU) and C (T [V | 1]). `columns: exact` adds the O(n²d) log-sum-exp.
    diff = 2 * ell * n * d + 2 * ell * r * d + 2 * n * r * d + 2 * ell * n * d
    diff += 2 * ell * r * r + 2 * ell * r * (d + 1) + (2 / 3) * r**3 + 2 * r * r * (d + 1) + 2 * n * r * (d + 1)
    if p.get("columns", "exact") == "exact":
        diff += 4.0 * n * n * d  # blockwise lse (forward) + the exact sketch rows' softmax
    return Flops(diff)


def _wildcat(n: int, m: int | None, d: int, p: Params) -> Flops:
    r = int(m or 0)
    # the r×r Gaussian core Z_S Z_Sᵀ and its pseudo-inverse, G_SK = Z_S Zᵀ, G_SK·[V | 1], core⁺·(…), exp(Q K_Sᵀ),
    # left·(…) and left·e^{h_S} (the coreset's partial row sums, the denominator guard). The coreset itself is the
    # selector's (counted there). `num_bins` masks the same dense products (no saving in our implementation).
    diff = 2 * r * r * d + 2 * r * n * d + 2 * r * n * (d + 1) + 2 * r * r * (d + 1)
    diff += 2 * n * r * d + 2 * n * r * (d + 1) + 2 * n * r
    # the SVD-based pseudo-inverse: forward an estimate (`_pinv`), backward torch's formula, 8 r×r products
    return Flops(diff) + Flops(_pinv(r, {"pinv": "exact"}), backward=16.0 * r**3)


def _poly_features(d: int, p: Params) -> int:
    dim = d + (p.get("kind", "homogeneous") == "inhomogeneous")
    return math.comb(dim + int(p.get("degree", 2)) - 1, int(p.get("degree", 2)))


def _polynomial(n: int, m: int | None, d: int, p: Params) -> Flops:
    f = _poly_features(d, p)
    return Flops(4.0 * n * f * (d + 1))  # φ(K)ᵀ[V | 1] and φ(Q)·(…); building φ is elementwise


def _linformer(n: int, m: int | None, d: int, p: Params) -> Flops:
    k = int(p.get("proj_dim", 256))
    return Flops(8.0 * n * k * d)  # E·K, F·V, Q·(EK)ᵀ, softmax(…)·(FV)


def _performer(n: int, m: int | None, d: int, p: Params) -> Flops:
    r = int(p.get("num_features", 256))
    proj, mix = 4.0 * n * r * d, 4.0 * n * r * (d + 1)  # Q·Wᵀ and K·Wᵀ; φ(K)ᵀ[V | 1] and φ(Q)·(…)
    return Flops(proj + mix, backward=proj + 2.0 * mix)  # W is a constant: one backward product each


ATTENTION_FLOPS: dict[str, Callable[[int, int | None, int, Params], Flops]] = {
    "full": _full,
    "sdpa_math": _full,
    "sdpa_flash": _full,
    "sdpa_efficient": _full,
    "nystrom": _nystrom,
    "gpa": _nystrom,  # Nyström with another selector: the selector's cost is added separately
    "spectral": _spectral,
    "skyformer": _skyformer,
    "pivoted": _pivoted,
    "polynomial": _polynomial,
    "linformer": _linformer,
    "performer": _performer,
    "wildcat": _wildcat,
}


def _segment_means(n: int, m: int, d: int, p: Params) -> Flops:
    return Flops(0.0, 2.0 * n * d)  # one add per element of q and of k (its backward is as many adds again)


def _uniform(n: int, m: int, d: int, p: Params) -> Flops:
    return Flops(0.0)


def _lloyd(n: int, m: int, d: int, iterations: int) -> float:
    return iterations * (2.0 * n * m * d + n * d)  # distances (one matmul) + cluster sums (adds)


def _seeding(n: int, m: int, d: int, p: Params) -> float:
    """Greedy k-means++: m steps of 2 + ⌊ln m⌋ candidate distance columns, per restart (segment means: 1 pass)."""
    if p.get("init", "kmeans++") == "segment_means":
        return float(n * d)
    restarts = max(1, int(p.get("restarts", 1)))
    if p.get("init", "kmeans++") == "random":
        return 0.0
    return restarts * m * (2 + int(math.log(max(m, 1)))) * 2.0 * n * d


def _kmeans(n: int, m: int, d: int, p: Params) -> Flops:
    # seeding, Lloyd iterations at their cap (an upper bound: Lloyd stops once every sequence/head converged),
    # per restart, the final assignment, then q and k means over the clusters
    its = int(p.get("max_iterations", 100))
    restarts = 1 if p.get("init", "kmeans++") == "segment_means" else max(1, int(p.get("restarts", 1)))
    return Flops(0.0, _seeding(n, m, d, p) + restarts * _lloyd(n, m, d, its) + 2.0 * n * m * d + 2.0 * n * d)


def _gpa_codebook(n: int, m: int, d: int, p: Params) -> Flops:
    # steady state: assign every token to the codebook (one matmul) + q and k means; the refresh (Lloyd on the
    # pooled batch, warm-started from the codebook, at its iteration cap: an upper bound) runs once every
    # `refresh_every` passes and is counted amortised (the first refresh's seeding once, not counted)
    every = max(1, int(p.get("refresh_every", 50)))
    its = int(p.get("max_iterations", 100))
    local = int(p.get("local_iterations", 0))
    return Flops(0.0, 2.0 * n * m * d + 2.0 * n * d + _lloyd(n, m, d, its) / every + _lloyd(n, m, d, local))


def _kmeans_pp(n: int, m: int, d: int, p: Params) -> Flops:
    return Flops(0.0, 2.0 * n * m * d)  # m D²-sampling steps, one distance column each


def _sketch_rows(m: int, n: int, p: Params) -> int:
    return max(1, min(n, int(p.get("sketch_rows", 0) or 0) or 2 * m))


def _pivoted_qr(n: int, m: int, d: int, p: Params) -> Flops:
    ell = _sketch_rows(m, n, p)
    # ℓ exact rows of A (Q_S Kᵀ); m greedy steps on the ℓ×n residual: the rank-1 projection (qᵀE, then
    # q(qᵀE): 4ℓn; the column norms are elementwise) and two re-orthogonalisations against the basis (8ℓt at step t)
    greedy = m * 4.0 * ell * n + 4.0 * ell * m * m
    return Flops(0.0, 2.0 * ell * n * d + greedy)


def _rpcholesky(n: int, m: int, d: int, p: Params) -> Flops:
    # m steps, each one kernel column (Z z_j: 2nd) and its residual against the factor so far (F F[j]ᵀ: 2n·t at
    # step t); the centring, the draws (a cumulative sum) and the downdates are elementwise
    return Flops(0.0, 2.0 * n * d * m + n * m * (m - 1.0))


def _leverage(n: int, m: int, d: int, p: Params) -> Flops:
    ell = _sketch_rows(m, n, p)
    # sketch rows, Gram A_S A_Sᵀ, Cholesky, solve against A_S, column-wise dot products
    return Flops(0.0, 2.0 * ell * n * d + 2.0 * ell * ell * n + ell**3 / 3 + 2.0 * ell * ell * n + 2.0 * ell * n)


SELECTOR_FLOPS: dict[str, Callable[[int, int, int, Params], Flops]] = {
    "segment_means": _segment_means,
    "uniform": _uniform,
    "hash": _uniform,  # evenly spaced positions: no arithmetic
    "kmeans": _kmeans,
    "gpa": _gpa_codebook,
    "kmeans_pp": _kmeans_pp,
    "pivoted_qr": _pivoted_qr,
    "leverage": _leverage,
    "rpcholesky": _rpcholesky,
}


def attention_flops(
    name: str,
    *,
    batch: int,
    heads: int,
    n: int,
    m: int | None,
    d: int,
    params: Params | None = None,
    selector: str | None = None,
    selector_params: Params | None = None,
) -> Flops | None:
    """Total FLOPs of one call (attention + its selector) for the batch, or None when either is uncounted."""
    fn = ATTENTION_FLOPS.get(name)
    if fn is None:
        return None
    total = fn(n, m, d, params or {})
    if selector is not None:
        sel = SELECTOR_FLOPS.get(selector)
        if sel is None or m is None:
            return None
        total = total + sel(n, int(m), d, selector_params or {})
    return total.scaled(batch * heads)


# Memory: bytes a call needs beyond its inputs, an *estimate* used only to skip configurations that would not
# fit (so it errs high). Names without an entry are extrapolated from their own measured smaller-n peaks.


def _mem_width(width: Callable[[int | None, Params], float]) -> Callable[[int, int | None, int, str, Params], float]:
    """Methods whose big tensors are n × w (w = landmarks, sketch rows, features): a few of them live at once."""

    def est(n: int, m: int | None, d: int, mode: str, p: Params) -> float:
        return (4.0 if mode == "forward" else 10.0) * n * width(m, p) + 8.0 * n * d

    return est


def _quadratic(n: int, m: int | None, d: int, mode: str, p: Params) -> float:
    return (2.0 if mode == "forward" else 4.0) * n * n  # scores + probabilities (+ their gradients)


def _linear(n: int, m: int | None, d: int, mode: str, p: Params) -> float:
    return 8.0 * (2.0 if mode != "forward" else 1.0) * n * d  # fused SDPA: output, log-sum-exp, (gradients)


_landmarks = _mem_width(lambda m, p: float(m or 0))
ATTENTION_MEMORY: dict[str, Callable[[int, int | None, int, str, Params], float]] = {
    "full": _linear,
    "sdpa_flash": _linear,
    "sdpa_efficient": _linear,
    "sdpa_math": _quadratic,
    "nystrom": _landmarks,
    "gpa": _landmarks,
    "spectral": _landmarks,
    "skyformer": _landmarks,
    "pivoted": _mem_width(lambda m, p: 4.0 * float(m or 0)),  # sketch rows ℓ = 2m, residual copy, columns
    "polynomial": _mem_width(lambda m, p: float(_poly_features(32, p))),
    "linformer": _mem_width(lambda m, p: float(p.get("proj_dim", 256))),
    "performer": _mem_width(lambda m, p: float(p.get("num_features", 256))),
    "wildcat": _mem_width(lambda m, p: 2.0 * float(m or 0)),  # G_SK, X, the left factor, the pivoting factor F
}


def memory_estimate(
    name: str,
    *,
    batch: int,
    heads: int,
    n: int,
    m: int | None,
    d: int,
    mode: str,
    params: Params | None = None,
    itemsize: int = 4,
) -> float | None:
    """Estimated peak bytes of one call beyond its inputs, or None when there is no formula for `name`."""
    fn = ATTENTION_MEMORY.get(name)
    if fn is None:
        return None
    return fn(n, m, d, mode, params or {}) * batch * heads * itemsize


def extrapolate_memory(history: list[tuple[int, float]], n: int) -> float | None:
    """Peak at `n` from measured (n, peak) pairs: the last two points' log-log slope, clipped to [1, 2]
    (slope 2 — quadratic — when only one point is known)."""
    pts = sorted((x, y) for x, y in history if y and y > 0 and x < n)
    if not pts:
        return None
    (n1, y1) = pts[-1]
    slope = 2.0
    if len(pts) >= 2:
        n0, y0 = pts[-2]
        slope = min(2.0, max(1.0, math.log(y1 / y0) / math.log(n1 / n0)))
    return y1 * (n / n1) ** slope
