"""Pivoted-QR landmarks: greedy residual-norm column pivoting (Businger–Golub) of A = softmax(QKᵀ) on a row
sketch — randomized QRCP.

ℓ real query rows S are drawn uniformly (seeded); their rows A_S = softmax(Q_S Kᵀ) (ℓ×N) are exact and cost
O(ℓ·N·D) — the N×N matrix never exists. Greedy pivoting on the residual E (E⁽⁰⁾ = A_S):
    j = argmax_j ‖E_{:,j}‖₂ over real, unchosen columns;   q = E_{:,j}/‖E_{:,j}‖;   E ← (I − qqᵀ) E,
by modified Gram–Schmidt in fp32 with the new direction re-orthogonalised twice against the basis so far
(E itself is never formed: see `greedy_pivots`).
It stops at m pivots or when the largest residual column norm falls to τ·‖A_S‖_F (then the remaining slots
are invalid landmarks). Padded columns are never chosen. The landmarks are the pivot tokens; the sketch rows
travel with them (`PivotedLandmarks.rows`) so that the residual-pivoted attention fits its coefficients on
the same sketch. Selectors receive q and k already scaled so that q·kᵀ are the attention logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models import kernels
from models.cost import Flops, Params
from models.kernels import pivoted_qr as pivoted_qr_kernel
from models.knobs import follows_run_seed, knobs
from models.landmarks.base import Landmarks, gather_tokens, length_groups
from models.landmarks.kmeans import exact_fp32
from models.landmarks.uniform import DataDrivenTokenSelector, sample_real_tokens, token_landmarks

KERNELS = ("fused", "eager")


@dataclass
class PivotedLandmarks(Landmarks):
    """Token landmarks plus the sketch rows they were chosen on (`rows`, `rows_valid`: `[B, H, ℓ]`)."""

    rows: torch.Tensor | None = None
    rows_valid: torch.Tensor | None = None


def sketch_size(sketch_rows: int, m: int, n: int) -> int:
    """ℓ: `sketch_rows` if given, else 2m (oversampling ×2); never more than N."""
    return max(1, min(n, int(sketch_rows) if sketch_rows else 2 * m))


def sketch_rows_softmax(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, rows_valid: torch.Tensor
) -> torch.Tensor:
    """Exact rows `rows [B, H, ℓ]` of softmax(q kᵀ) with padded keys at 0 and invalid rows at 0 → `[B, H, ℓ, N]`."""
    logits = gather_tokens(q, rows) @ k.transpose(-1, -2)
    logits = logits.masked_fill(~mask.unsqueeze(-2), float("-inf"))
    a = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return a * rows_valid.unsqueeze(-1).to(a.dtype)


def greedy_pivots(a: torch.Tensor, mask: torch.Tensor, m: int, tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Businger–Golub column pivoting of `a [B, H, ℓ, N]` (fp32) by modified Gram–Schmidt.

    The residual E = (I − QQᵀ)A is never formed: with W = QᵀA kept row by row, the candidate norms are
    downdated, ‖E_{:,j}‖² = ‖a_j‖² − Σ_k W_kj² (fp64, as LAPACK's geqp3 does), and only the pivot's residual
    column a_j − Q W[:, j] is formed (O(ℓk)) and re-orthogonalised twice against Q. One ℓ×N mat-vec per
    pivot. The stopping test uses the pivot's exact residual norm (downdated norms drift by ~1e-7‖a_j‖²):
    a pivot is valid while it exceeds max(τ, 1e-6)·‖a‖_F. Padded and chosen columns are never eligible.
    Returns pivot indices and validity `[B, H, m]`.

    Runs on groups of sequences of similar length, each cut after its last eligible column (`length_groups`):
    every step's mat-vec qᵀA re-reads the whole ℓ×N sketch (memory-bound) and trailing padding, never eligible,
    is ~40% of it on ListOps. A sequence's pivots do not depend on the others' or on those columns (‖a‖_F is
    taken on the full width), so they are the full-width pivots."""
    b, h, ell, n = a.shape
    col_sq = a.double().pow(2).sum(-2)  # ‖a_j‖², [B, H, N]
    floor_sq = (max(float(tol), 1e-6) ** 2) * col_sq.sum(-1)  # τ²‖a‖_F², [B, H]
    eligible = mask.expand(b, h, n)
    groups = length_groups(eligible, m)
    if len(groups) == 1 and groups[0][1] == n:
        return _greedy_steps(a, col_sq, floor_sq, eligible, m)
    idx = a.new_zeros(b, h, m, dtype=torch.long)
    ok = a.new_zeros(b, h, m, dtype=torch.bool)
    for rows, width in groups:
        idx[rows], ok[rows] = _greedy_steps(
            a[rows, :, :, :width], col_sq[rows, :, :width], floor_sq[rows], eligible[rows, :, :width], m
        )
    return idx, ok


def _greedy_steps(
    a: torch.Tensor, col_sq: torch.Tensor, floor_sq: torch.Tensor, eligible: torch.Tensor, m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pivot loop of `greedy_pivots` on all of `a`'s columns (`col_sq`, `floor_sq` given)."""
    b, h, ell, n = a.shape
    steps = min(m, n)
    resid_sq = col_sq.clone()
    eligible = eligible.clone()
    basis = a.new_zeros(b, h, ell, steps)  # Q (first t columns filled)
    proj = a.new_zeros(b, h, steps, n)  # W = QᵀA (first t rows filled)
    active = torch.ones(b, h, dtype=torch.bool, device=a.device)
    picks, valid = [], []
    for t in range(steps):
        q_t, w_t = basis[..., :t], proj[..., :t, :]
        j = resid_sq.masked_fill(~eligible, -1.0).argmax(dim=-1)
        col = a.gather(-1, j[..., None, None].expand(b, h, ell, 1))  # a_j, [B, H, ℓ, 1]
        if t:
            col = col - q_t @ w_t.gather(-1, j[..., None, None].expand(b, h, t, 1))
            col = col - q_t @ (q_t.transpose(-1, -2) @ col)
        norm = col.norm(dim=-2, keepdim=True)
        active = active & (norm.squeeze(-1).squeeze(-1).double().pow(2) > floor_sq)
        qv = col / norm.clamp_min(1e-30)
        if t:  # second pass: Gram–Schmidt alone loses orthogonality
            qv = qv - q_t @ (q_t.transpose(-1, -2) @ qv)
            qv = qv / qv.norm(dim=-2, keepdim=True).clamp_min(1e-30)
        qv = qv * active[..., None, None].to(qv.dtype)
        w = qv.transpose(-1, -2) @ a  # [B, H, 1, N]: qᵀA = qᵀE since q ⟂ Q
        resid_sq = (resid_sq - w.squeeze(-2).double().pow(2)).clamp_min(0.0)
        basis[..., t : t + 1] = qv
        proj[..., t : t + 1, :] = w
        eligible = eligible.scatter(-1, j.unsqueeze(-1), False)
        picks.append(j)
        valid.append(active)
    idx = torch.stack(picks, -1) if picks else a.new_zeros(b, h, 0, dtype=torch.long)
    ok = torch.stack(valid, -1) if valid else a.new_zeros(b, h, 0, dtype=torch.bool)
    if idx.shape[-1] < m:  # fewer columns than m: pad with invalid slots
        pad = m - idx.shape[-1]
        idx = torch.cat([idx, idx.new_zeros(b, h, pad)], -1)
        ok = torch.cat([ok, ok.new_zeros(b, h, pad)], -1)
    return torch.where(ok, idx, torch.zeros_like(idx)), ok


@dataclass
class PivotedQRConfig:
    """Greedy residual-norm column pivoting (randomized QRCP) of softmax(QKᵀ) on a row sketch; token landmarks."""

    name: str = "pivoted_qr"
    tol: float = 1.0e-3  # τ: stop when the largest residual column norm ≤ τ·‖A_S‖_F
    sketch_rows: int = 0  # ℓ query rows in the sketch; 0 = 2·m
    kernel: str = "fused"  # fused (CPU: the sketch and the pivot loop compiled, per sequence and head) | eager
    seed: int = follows_run_seed()  # for the row sketch


class SketchedSelector(DataDrivenTokenSelector):
    """A selector that scores keys on a row sketch of softmax(QKᵀ): its generator only draws the sketch's query
    rows (`sketch_rows` of them, 0 = 2·m; see `sketch_size`)."""

    def configure(self, cfg: Any) -> None:
        super().configure(cfg)
        self.sketch_rows = int(cfg.sketch_rows)


class PivotedQRSelector(SketchedSelector):
    config = PivotedQRConfig

    def configure(self, cfg: PivotedQRConfig) -> None:
        super().configure(cfg)
        if cfg.kernel not in KERNELS:
            raise ValueError(f"selector.kernel={cfg.kernel!r}: expected one of {', '.join(KERNELS)}")
        self.tol, self.kernel = float(cfg.tol), cfg.kernel

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        """`fused`: the sketch and the pivot loop through the compiled kernel where it applies
        (`models.kernels.pivoted_qr`): the same pivots unless two residuals tie within fp32 rounding."""
        ell = sketch_size(self.sketch_rows, m, q.shape[-2])
        rows, rows_valid = sample_real_tokens(self, mask, q.shape[1], ell)
        with exact_fp32(q.device):
            qf, kf = q.detach().float(), k.detach().float()
            if self.kernel == "fused" and kernels.applies("pivoted_qr", qf):
                idx, valid = pivoted_qr_kernel.pivots(gather_tokens(qf, rows), kf, mask, rows_valid, m, self.tol)
            else:
                idx, valid = greedy_pivots(sketch_rows_softmax(qf, kf, mask, rows, rows_valid), mask, m, self.tol)
        lm = token_landmarks(q, k, idx, valid)
        return PivotedLandmarks(lm.queries, lm.keys, lm.valid, lm.indices, rows=rows, rows_valid=rows_valid)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        ell = sketch_size(knobs(PivotedQRConfig, params).sketch_rows, m, n)
        # ℓ exact rows of A (Q_S Kᵀ); m greedy steps on the ℓ×n residual: the rank-1 projection (qᵀE, then
        # q(qᵀE): 4ℓn; the column norms are elementwise) and two re-orthogonalisations against the basis (8ℓt at step t)
        greedy = m * 4.0 * ell * n + 4.0 * ell * m * m
        return Flops(0.0, 2.0 * ell * n * d + greedy)
