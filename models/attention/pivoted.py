"""Residual-pivoted landmark attention: exact columns of A at pivot keys, ridge coefficients on a row sketch.

Source idea (arXiv 2607.26863, no code): greedy pivoted QR picks keys J (|J| ≤ r_max, stopping at
τ·‖A‖_F); C = A[:, J]; T = (CᵀC + λI)⁻¹ CᵀA; output C (T V) in place of AV. CᵀA V needs AV — the exact
output — so T is fitted on a row sketch S of ℓ query rows, whose rows of A are exact and cheap (sketched least
squares, e.g. Woodruff, "Sketching as a Tool for Numerical Linear Algebra", 2014, §2):
T V = (C_SᵀC_S + λI)⁻¹ C_Sᵀ (A_S V).

Exact columns A[:, J] = exp(q_i·k_J − lse_i) need every row's log-sum-exp over all keys. Two modes:

* `columns: exact` (default): C = A[:, J] with lse from query blocks (`block_size`): O(N²D) time but
  O(N·block) memory, including the backward pass (a custom autograd function recomputes each block). The
  default because it is never worse than uniform Nyström on the planted inputs (tests/test_landmark_attention.py),
  which the kernel mode is not.
* `columns: kernel` (sub-quadratic, opt-in): work on the unnormalised kernel
  E_ij = exp(q_i·k_j − c_i) (any per-row shift c_i cancels): E ≈ E[:, J] T with T fitted on the sketch rows
  (where E_S is exact), then renormalise with the same factorisation,
      out_i = E_iJ (T V) / E_iJ (T 1),
  the denominator clamped from below by Σ_{j∈J} E_ij (a true lower bound of the row sum, so never ≤ 0).
  Cost O(N·r·D + ℓ·N·D + r³). Unstable: the output is the exact-columns output divided by the fitted row sum
  A_iJ·T·1, and for a row the sketch fits badly that sum is small — measured on planted inputs (n = 512,
  5 seeds) output errors of 1.2–5.2 where exact columns give 0.2–0.6, and worse than uniform Nyström at
  m = 8 and 32. Fitting T on normalised sketch rows, or a sampled or clamped row sum, did not remove it.

Pivots come from the selector (`pivoted_qr` by default; any token selector works, cluster means do not —
`lra_bench.config.validate` says so). When the selector supplies its sketch rows (pivoted_qr does) they are reused,
else the attention draws ℓ real rows uniformly with its own seeded generator. λ is relative:
λ = ridge·mean(diag C_SᵀC_S) (our choice: scale-free). Everything runs in fp32 (autocast off): the
work is O(N·r) and the ridge solve must be fp32 anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from models.attention.landmark import LandmarkAttention
from models.attention.numerics import fp32_core
from models.cost import Flops, Params
from models.kernels import row_logsumexp
from models.kernels.flash_attention import key_bias
from models.knobs import follows_run_seed, knobs
from models.landmarks.base import gather_tokens, length_groups
from models.landmarks.pivoted_qr import sketch_size
from models.landmarks.uniform import UniformConfig, UniformSelector

COLUMNS = ("kernel", "exact")
KERNELS = ("fused", "eager")


@dataclass
class PivotedConfig:
    """Residual-pivoted landmark attention: exact columns at pivoted keys, ridge coefficients on a row sketch."""

    name: str = "pivoted"
    num_landmarks: Any = 64  # r_max (int or "log2"); the selector's τ may stop earlier
    ridge: float = 1.0e-4  # λ relative to mean(diag C_SᵀC_S)
    sketch_rows: int = 0  # ℓ, used only when the selector supplies no sketch; 0 = 2·r
    columns: str = "exact"  # exact (blockwise log-sum-exp: O(n²) time, O(n) memory) | kernel (sub-quadratic,
    #                         renormalised by a fitted row sum: unstable, see models/attention/pivoted.py)
    block_size: int = 1024  # query block for the exact log-sum-exp (eager kernel)
    kernel: str = "fused"  # fused (CPU: the exact log-sum-exp in the compiled blockwise kernel) | eager
    seed: int = follows_run_seed()  # own row sketch


class BlockwiseLSE(torch.autograd.Function):
    """lse_i = log Σ_j exp(q_i·k_j) over real keys, in query blocks: O(N·block) memory forward and backward."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, key_valid: torch.Tensor, block: int) -> torch.Tensor:
        out = []
        for start in range(0, q.shape[-2], block):
            logits = q[..., start : start + block, :] @ k.transpose(-1, -2)
            out.append(torch.logsumexp(logits.masked_fill(~key_valid, float("-inf")), dim=-1))
        lse = torch.cat(out, dim=-1)
        ctx.save_for_backward(q, k, key_valid, lse)
        ctx.block = block
        return lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, key_valid, lse = ctx.saved_tensors
        grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)
        grad = torch.where(torch.isfinite(lse), grad, torch.zeros_like(grad))
        for start in range(0, q.shape[-2], ctx.block):
            sl = slice(start, start + ctx.block)
            logits = q[..., sl, :] @ k.transpose(-1, -2)
            probs = torch.exp(logits - lse[..., sl, None]).masked_fill(~key_valid, 0.0).nan_to_num(0.0)
            weighted = probs * grad[..., sl, None]
            grad_q[..., sl, :] = weighted @ k
            grad_k += weighted.transpose(-1, -2) @ q[..., sl, :]
        return grad_q, grad_k, None, None


def sketch_output(q_s: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """A_S V, the sketch rows' exact attention output (`q_s [B, H, ℓ, D]`, scores q·k unscaled: the caller scaled
    both), through torch's fused attention: the same values as `masked_softmax(q_s kᵀ) @ v` at fp32 rounding,
    without the [B, H, ℓ, N] weights, their mask and softmax passes forward and backward (a third less time for
    this part at ℓ = 128, N = 2048 on one core). A sequence without a real key attends to every key (a finite
    output; its sketch rows are invalid, and the caller zeroes them)."""
    keys = key_valid | ~key_valid.any(-1, keepdim=True)
    return F.scaled_dot_product_attention(q_s, kf, vf, attn_mask=keys, scale=1.0)


class PivotedAttention(LandmarkAttention):
    config = PivotedConfig
    default_selector = "pivoted_qr"

    #: C = A[:, J] needs landmarks that are tokens (checked by lra_bench.config.validate)
    needs_token_landmarks = True
    memory_width = 4.0  # sketch rows ℓ = 2m, the residual copy, the columns

    def configure(self, cfg: PivotedConfig) -> None:
        super().configure(cfg)
        if cfg.columns not in COLUMNS:
            raise ValueError(f"attn.columns={cfg.columns!r}: expected one of {', '.join(COLUMNS)}")
        self.ridge, self.sketch_rows = float(cfg.ridge), int(cfg.sketch_rows)
        if cfg.kernel not in KERNELS:
            raise ValueError(f"attn.kernel={cfg.kernel!r}: expected one of {', '.join(KERNELS)}")
        self.columns, self.block_size, self.kernel = cfg.columns, int(cfg.block_size), cfg.kernel
        self.row_sampler = UniformSelector(UniformConfig(seed=cfg.seed))

    def _operator(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Â v for any right-hand side `v [B, H, N, E]` (E = D in forward, E = N for the implied matrix)."""
        scale = q.shape[-1] ** -0.25
        lm = self.select_landmarks(q * scale, k * scale, mask)  # last_rank: pivots kept before the stopping rule
        if lm.indices is None:
            raise ValueError(
                f"attn=pivoted needs token landmarks; selector {type(self.selector).__name__} returns cluster means"
            )
        rows, rows_valid = getattr(lm, "rows", None), getattr(lm, "rows_valid", None)
        if rows is None or rows_valid is None:
            ell = sketch_size(self.sketch_rows, lm.count, q.shape[-2])
            sketch = self.row_sampler(q, k, mask, ell)
            rows, rows_valid = sketch.indices, sketch.valid
        with fp32_core(q.device):
            qf, kf, vf = q.float() * scale, k.float() * scale, v.float()
            key_valid = (
                torch.ones(q.shape[0], 1, 1, q.shape[-2], dtype=torch.bool, device=q.device)
                if mask is None
                else mask[:, None, None, :]
            )
            lm_valid = lm.valid.unsqueeze(-2)  # [B, H, 1, r]
            k_j = gather_tokens(kf, lm.indices)
            q_s = gather_tokens(qf, rows)
            row_ok = rows_valid.unsqueeze(-1).to(qf.dtype)  # [B, H, ℓ, 1]
            if self.columns == "kernel":
                sketch_logits = (q_s @ kf.transpose(-1, -2)).masked_fill(~key_valid, float("-inf"))
                shift_s = sketch_logits.amax(-1, keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
                e_s = torch.exp(sketch_logits - shift_s) * row_ok  # exact sketch rows of E, [B, H, ℓ, N]
                c_s = torch.exp(q_s @ k_j.transpose(-1, -2) - shift_s) * lm_valid * row_ok
                logits_j = (qf @ k_j.transpose(-1, -2)).masked_fill(~lm_valid, float("-inf"))
                shift = logits_j.amax(-1, keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
                cols = torch.exp(logits_j - shift) * lm_valid  # E[:, J], [B, H, N, r]
                rhs = torch.cat([e_s @ vf, e_s.sum(-1, keepdim=True)], dim=-1)
                coef = self._ridge_solve(c_s, rhs, lm.valid)  # T [V | 1]
                both = cols @ coef
                den = torch.maximum(both[..., -1:], cols.sum(-1, keepdim=True)).clamp_min(1e-30)
                out = both[..., :-1] / den
            else:
                lse = self._row_lse(qf, kf, key_valid)  # [B, H, N]
                lse = lse.nan_to_num(0.0, neginf=0.0)
                cols = torch.exp(qf @ k_j.transpose(-1, -2) - lse.unsqueeze(-1)) * lm_valid  # A[:, J]
                c_s = gather_tokens(cols, rows) * row_ok
                out = cols @ self._ridge_solve(c_s, sketch_output(q_s, kf, vf, key_valid) * row_ok, lm.valid)
        return out.to(v.dtype)

    def _row_lse(self, qf: torch.Tensor, kf: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        """The exact columns' normaliser, on groups of sequences of similar length with each group's keys cut after
        its last real one (`length_groups`). Why: this O(N²D) sum, forward and backward, is most of the step, and
        ~40% of ListOps' keys are trailing pads whose exp(−inf) terms add exactly 0 — cutting them changes only
        the summation lengths (fp32 rounding), and halved the time of the sum (3.5 → 1.8 s per layer)."""
        n = kf.shape[-2]
        groups = length_groups(key_valid[:, 0], 1)  # [B, 1, N]
        if len(groups) == 1 and groups[0][1] == n:
            return self._group_lse(qf, kf, key_valid)
        parts = [self._group_lse(qf[rows], kf[rows, :, :width], key_valid[rows, ..., :width]) for rows, width in groups]
        order = torch.cat([rows for rows, _ in groups])
        return torch.cat(parts)[order.argsort()]

    def _group_lse(self, qf: torch.Tensor, kf: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        """Row log-sum-exp over the real keys: the compiled blockwise kernel on a CPU where it is built (`kernel:
        fused`), else `BlockwiseLSE` in query blocks of `block_size` (the same sums at fp32 rounding)."""
        if self.kernel == "fused" and qf.device.type == "cpu" and row_logsumexp.kernel() is not None:
            bias = key_bias(key_valid[:, 0, 0, :], qf.shape[0], kf.shape[-2], qf.dtype)
            return row_logsumexp.RowLogSumExp.apply(qf, kf, bias)
        return BlockwiseLSE.apply(qf, kf, key_valid, self.block_size)

    def _ridge_solve(self, c_s: torch.Tensor, rhs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(C_SᵀC_S + λI)⁻¹ C_Sᵀ rhs, with invalid landmarks' rows/columns set to the identity."""
        gram = c_s.transpose(-1, -2) @ c_s
        diag = gram.diagonal(dim1=-2, dim2=-1)
        lam = self.ridge * (diag.sum(-1) / valid.sum(-1).clamp_min(1)).clamp_min(1e-30)
        eye = torch.eye(gram.shape[-1], device=gram.device, dtype=gram.dtype)
        gram = gram + lam[..., None, None] * eye + torch.diag_embed((~valid).to(gram.dtype))
        return torch.linalg.solve(gram, c_s.transpose(-1, -2) @ rhs)

    def forward(self, q, k, v, mask):
        return self._operator(q, k, v, mask)

    def implied_matrix(self, q, k, mask):
        return self.operator_matrix(q, k, mask, torch.float32)

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        r = int(m or 0)
        cfg = knobs(PivotedConfig, params)
        ell = sketch_size(cfg.sketch_rows, r, n)
        # kernel mode: exact sketch rows E_S (ℓ×n) and E_S·V, C_S = E_S[:, J], E[:, J] for all rows, the ridge
        # solve (Gram, right-hand side, LU) and C (T [V | 1]). `columns: exact` adds the O(n²d) log-sum-exp.
        diff: float = 2 * ell * n * d + 2 * ell * r * d + 2 * n * r * d + 2 * ell * n * d
        diff += 2 * ell * r * r + 2 * ell * r * (d + 1) + (2 / 3) * r**3 + 2 * r * r * (d + 1) + 2 * n * r * (d + 1)
        if cfg.columns == "exact":
            diff += 4.0 * n * n * d  # blockwise lse (forward) + the exact sketch rows' softmax
        return Flops(diff)
