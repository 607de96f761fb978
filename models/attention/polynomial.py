"""Exact polynomial-kernel attention through symmetric tensor features — linear in n.

Chu, Alman, Miller, Narayanan, Sellke & Song (NeurIPS 2024): among entrywise f, only polynomials keep
f(QKᵀ) low rank, and ⟨q, k⟩^p = ⟨q^{⊗p}, k^{⊗p}⟩ factorises exactly. With x = q·k/√d (q and k each scaled by
d^(-1/4)) this module computes, exactly,

    f(x) = x^p  (homogeneous)   or   (1 + x)^p  (inhomogeneous),
    out_i = Σ_j f(x_ij) v_j / (bias + Σ_j f(x_ij)),

as φ(Q) (φ(K)ᵀ [V | 1]) with the symmetric-tensor features φ(x)_α = √(p!/∏m_a!)·∏_a x_a^{m_a} over
multisets α of size p — C(d+p−1, p) features (528 for d = 32, p = 2), C(d+p, p) inhomogeneous (one extra
coordinate 1). Cost O(N·F·D): cheaper than softmax whenever F < N. The degree must be even so that the
normaliser is positive; `bias` (PolySketchFormer's 1.0) keeps rows whose weights all vanish finite. Padded
keys are removed by zeroing their rows of [V | 1] (needed for the inhomogeneous map, where φ(0) ≠ 0). The whole
core runs in fp32: x^p overflows half precision quickly. Degrees above 2 warn about the feature count. On a CPU,
degree 2 runs on a compiled core (`models.kernels.polynomial_features`) that never makes an [n, F] tensor.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections import Counter
from dataclasses import dataclass

import torch

from models.attention.base import Attention
from models.attention.numerics import fp32_core
from models.cost import Flops, Params, width_memory
from models.kernels import polynomial_features
from models.knobs import knobs

KINDS = ("homogeneous", "inhomogeneous")
KERNELS = ("fused", "eager")


@dataclass
class PolynomialConfig:
    """Exact degree-p polynomial-kernel attention through symmetric tensor features (linear in n)."""

    name: str = "polynomial"
    degree: int = 2  # p, even
    kind: str = "homogeneous"  # homogeneous ⟨q,k⟩^p | inhomogeneous (1 + ⟨q,k⟩)^p
    bias: float = 1.0  # added to the normaliser
    qk_norm: bool = False  # l2-normalise q and k first (bounded entries, |x| ≤ 1/√d)
    kernel: str = "fused"  # fused (CPU, degree 2: the features and the core compiled, blocked in cache) | eager


def symmetric_features(dim: int, degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index multisets `[F, p]` and weights √(p!/∏m!) `[F]` with Σ_α w_α² ∏ x_α ∏ y_α = ⟨x, y⟩^p."""
    combos = list(itertools.combinations_with_replacement(range(dim), degree))
    index = torch.tensor(combos, dtype=torch.long).reshape(len(combos), degree)
    weights = []
    for combo in combos:
        mult = math.factorial(degree)
        for count in Counter(combo).values():
            mult //= math.factorial(count)
        weights.append(math.sqrt(mult))
    return index, torch.tensor(weights, dtype=torch.float32)


class PolynomialAttention(Attention):
    config = PolynomialConfig
    approximates = "polynomial-kernel attention, exactly"
    upper: torch.Tensor
    index: torch.Tensor
    weights: torch.Tensor

    @classmethod
    def feature_dim(cls, d: int, params: Params) -> int:
        """The exact symmetric-tensor feature dimension C(d' + p − 1, p), d' = d (+1 when inhomogeneous)."""
        cfg = knobs(PolynomialConfig, params)
        dim = d + (cfg.kind == "inhomogeneous")
        return math.comb(dim + int(cfg.degree) - 1, int(cfg.degree))

    def configure(self, cfg: PolynomialConfig) -> None:
        degree, kind = cfg.degree, cfg.kind
        if kind not in KINDS:
            raise ValueError(f"attn.kind={kind!r}: expected one of {', '.join(KINDS)}")
        if int(degree) < 2 or int(degree) % 2:
            raise ValueError(
                f"attn.degree={degree}: expected an even degree >= 2 (odd degrees make the normaliser sign-indefinite)"
            )
        if cfg.kernel not in KERNELS:
            raise ValueError(f"attn.kernel={cfg.kernel!r}: expected one of {', '.join(KERNELS)}")
        self.degree, self.kind, self.bias, self.qk_norm = int(degree), kind, float(cfg.bias), bool(cfg.qk_norm)
        self.kernel = cfg.kernel
        dim = self.head_dim + (kind == "inhomogeneous")
        index, weights = symmetric_features(dim, self.degree)
        if self.degree > 2:
            warnings.warn(
                f"attn=polynomial degree={self.degree}: {len(weights)} features per head (head_dim={self.head_dim}); "
                "memory and time grow as C(d+p-1, p) — cheaper than softmax only while that is below n",
                stacklevel=3,
            )
        upper = torch.triu_indices(dim, dim, offset=1)
        self.register_buffer("upper", upper[0] * dim + upper[1], persistent=False)  # degree 2's i < j pairs
        self.register_buffer("index", index, persistent=False)
        self.register_buffer("weights", weights, persistent=False)

    @property
    def num_features(self) -> int:
        return int(self.weights.shape[0])

    def rank_budget(self, seq_len: int) -> int:
        """The rank of the implied matrix is at most the feature count (diagnostics' Eckart–Young m)."""
        return min(self.num_features, seq_len)

    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        """`x [..., D]` as the features take it: l2-normalised under `qk_norm`, scaled by d^(-1/4), and with the
        leading 1 coordinate of the inhomogeneous map."""
        if self.qk_norm:
            x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        x = x * x.shape[-1] ** -0.25
        if self.kind == "inhomogeneous":
            x = torch.cat([torch.ones_like(x[..., :1]), x], dim=-1)
        return x

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """φ(x) `[..., F]` for `x [..., D]` (fp32), after the d^(-1/4) scaling (and the 1 coordinate)."""
        return self.lifted(self.scaled(x))

    def lifted(self, x: torch.Tensor) -> torch.Tensor:
        """φ of an already `scaled` x."""
        if self.degree == 2 and self._fused(x):  # the same features, one compiled pass per row
            return polynomial_features.DegreeTwoFeatures.apply(x)
        if self.degree == 2:  # the same features, faster on CPU: [x_i², √2·x_i·x_j (i < j)] from one outer product
            outer = (x.unsqueeze(-1) * (math.sqrt(2.0) * x).unsqueeze(-2)).flatten(-2)
            return torch.cat([x * x, outer[..., self.upper]], dim=-1)
        phi = x[..., self.index[:, 0]]
        for a in range(1, self.degree):
            phi = phi * x[..., self.index[:, a]]
        return phi * self.weights

    def _fused(self, x: torch.Tensor) -> bool:
        """Whether the degree-2 features go through the compiled kernel: `kernel: fused`, a CPU tensor of fp32 or
        fp64, and the kernel built on this machine."""
        if self.kernel != "fused" or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
            return False
        return polynomial_features.kernel() is not None

    def _factors(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None):
        phi_q, phi_k = self.features(q.float()), self.features(k.float())
        if mask is not None:
            phi_k = phi_k * mask[:, None, :, None]
        return phi_q, phi_k

    def forward(self, q, k, v, mask):
        with fp32_core(q.device):
            xq, xk = self.scaled(q.float()), self.scaled(k.float())
            values = torch.cat([v.float(), torch.ones_like(v[..., :1], dtype=torch.float32)], dim=-1)
            if mask is not None:  # padded keys drop out through [V | 1]: F (528) times cheaper than masking φ(K)
                values = values * mask[:, None, :, None].to(values.dtype)
            if self.degree == 2 and self._fused(xq):  # the same product, the features' gradients never written out
                both = polynomial_features.DegreeTwoAttention.apply(xq, xk, values)
            else:
                # [V | 1]ᵀ φ(K), [D+1, F], rather than φ(K)ᵀ [V | 1]: the gradient of φ(K) then comes out in its
                # own row-major layout (no transposing copy of an [n, F] tensor), and likewise φ(Q)'s below
                summary = values.transpose(-1, -2) @ self.lifted(xk)
                both = self.lifted(xq) @ summary.transpose(-1, -2)
            out = both[..., :-1] / (self.bias + both[..., -1:]).clamp_min(1e-30)
        return out.to(v.dtype)

    def implied_matrix(self, q, k, mask):
        with fp32_core(q.device):
            phi_q, phi_k = self._factors(q, k, mask)
            weights = phi_q @ phi_k.transpose(-1, -2)
            mat = weights / (self.bias + weights.sum(-1, keepdim=True)).clamp_min(1e-30)
        if mask is not None:
            mat = mat * mask[:, None, :, None]
        return mat

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        f = cls.feature_dim(d, params)
        return Flops(4.0 * n * f * (d + 1))  # φ(K)ᵀ[V | 1] and φ(Q)·(…); building φ is elementwise

    @classmethod
    def memory(cls, n: int, m: int | None, d: int, mode: str, params: Params) -> float:
        return width_memory(n, float(cls.feature_dim(d, params)), d, mode)
