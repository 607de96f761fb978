"""Performer (Choromanski et al. 2021): FAVOR+ positive orthogonal random features for the softmax kernel.

    exp(x·y) = E_w[φ(x) φ(y)],   φ(x) = exp(Wx − ‖x‖²/2) / √M,   out = φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1),

with W `[H, M, D]` (or one `[M, D]` shared by the heads) made of orthogonal Gaussian blocks with χ-distributed
row norms. W is a buffer (it checkpoints) drawn from the module's own seeded generator — never the global RNG —
and redrawn every `redraw_every` training forwards (0 = never). Eval never redraws. The core is fp32. For
stability the exponent is shifted by a per-row maximum for queries and by one maximum over all keys (and
features) of a (batch, head); the common factor 1/√M is left out (it cancels in the ratio, as the shifts do
when `feature_eps` is 0).

The knobs choose between this harness's Performer and the Nyströmformer reference's: see `PerformerAttention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.attention.base import Attention
from models.attention.numerics import fp32_core, transposed_product
from models.cost import Flops, Params
from models.kernels import fused_encoder, performer_core, shifted_exp
from models.knobs import follows_run_seed, knobs

LOGIT_SCALES = ("sqrt_d", "d")
PAD_KEYS = ("masked", "zero_logit")


@dataclass
class PerformerConfig:
    """Performer: FAVOR+ positive orthogonal random features, redrawn with a seeded generator."""

    name: str = "performer"
    num_features: int = 256  # M
    redraw_every: int = 1000  # training forwards between feature redraws; 0 = never (the Nyströmformer reference: 0)
    orthogonal: bool = True  # orthogonal Gaussian blocks (false: i.i.d. Gaussian rows)
    logit_scale: str = "sqrt_d"  # sqrt_d: estimates softmax(QKᵀ/√d) | d: softmax(QKᵀ/d), q and k scaled by
    # d^(-1/4) twice (the Nyströmformer reference: d)
    pad_keys: str = "masked"  # masked: pad keys get φ = 0 | zero_logit: pad keys and values zeroed, the keys kept
    # in the normaliser as logit-0 keys (the Nyströmformer reference: zero_logit)
    shared_heads: bool = False  # false: one projection per head | true: one [M, d] per layer, shared by the heads
    # (the Nyströmformer reference: true)
    feature_eps: float = 0.0  # ε inside each feature, φ = (exp(… − shift) + ε)/√M, shift = max of x·Wᵀ when ε > 0
    # (performer_pytorch's softmax_kernel; the Nyströmformer reference: 1e-4)
    seed: int = follows_run_seed()


class ShiftedExp(torch.autograd.Function):
    """`exp(proj − offset) + floor` for `proj [..., N, M]`, `offset [..., N, 1]` (‖x‖²/2 plus the detached shift;
    +inf drops a row) and `floor` (ε, broadcast; 0 on a dropped row), with gradients to `proj` and `offset`.

    Why a Function: the same arithmetic as the chain `exp((proj − ‖x‖²/2) − shift) + ε` (at fp32 rounding), in three
    memory passes over the [B, H, N, M] features forward (subtract, exp in place, add) and two backward (the
    product with the saved exponential, its row sum), where autograd's chain took about five each."""

    @staticmethod
    def forward(ctx: Any, proj: torch.Tensor, offset: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
        expo = (proj - offset).exp_()
        ctx.save_for_backward(expo)
        return expo + floor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (expo,) = ctx.saved_tensors
        grad_proj = grad * expo
        return grad_proj, -grad_proj.sum(-1, keepdim=True), None


def gaussian_features(
    generator: torch.Generator, heads: int, features: int, dim: int, orthogonal: bool
) -> torch.Tensor:
    """`[heads, features, dim]` random projection rows (orthogonal blocks with Gaussian-like norms)."""
    if not orthogonal:
        return torch.randn(heads, features, dim, generator=generator)
    blocks = []
    for _ in range(-(-features // dim)):
        gauss = torch.randn(heads, dim, dim, generator=generator)
        q, _ = torch.linalg.qr(gauss)
        blocks.append(q.transpose(-1, -2))
    rows = torch.cat(blocks, dim=1)[:, :features]
    norms = torch.randn(heads, features, dim, generator=generator).norm(dim=-1, keepdim=True)
    return rows * norms


class PerformerAttention(Attention):
    """FAVOR+ attention. Two modes, chosen by the knobs of `PerformerConfig` (each defaults to the first):

    * This harness's Performer (the defaults): q, k scaled by d^(-1/4) so that x·y is the softmax logit q·k/√d (the
      estimate is of softmax(QKᵀ/√d)); padded keys get φ = 0 (removed from numerator and normaliser); one projection
      per head; no ε in the features (the shifts, maxima of the whole exponent, cancel exactly).
    * The Nyströmformer paper's Performer baseline, mlpen/Nystromformer@5689313 LRA/code/attention_performer.py,
      which wraps performer_pytorch's `FastAttention(dim_heads=d, nb_features=M, causal=False, kernel_fn=ReLU())`
      (`generalized_attention` stays False, so the ReLU is never used: its FAVOR+ `softmax_kernel` runs):
      `logit_scale="d", pad_keys="zero_logit", shared_heads=True, feature_eps=1e-4, redraw_every=0`. The wrapper
      divides Q and K by d^(1/4) and `softmax_kernel` multiplies by its `data_normalizer` d^(-1/4) again, so x = q/√d
      and the estimate is of softmax(QKᵀ/d). The wrapper zeroes pad keys and values rather than removing them: a
      zeroed key has logit 0 and φ(0) ≠ 0, so it stays in the normaliser φ(q)·Σφ(k) and adds nothing to the
      numerator. `softmax_kernel` computes φ(x) = M^(-1/2)·(exp(x·Wᵀ − ‖x‖²/2 − s) + 1e-4), ε inside, and with ε the
      shift s no longer cancels, so it is performer_pytorch's: the detached max of x·Wᵀ alone (per query row over
      features; per (batch, head) over keys and features — pad keys included — as performer_pytorch has computed it
      since late 2021; the early-2021 releases took one max, not detached, over the whole key tensor). W is
      `gaussian_orthogonal_random_matrix(M, d, scaling=0)`: one `[M, d]` matrix per attention module, broadcast over
      the heads, never redrawn (FastAttention redraws only when an outer wrapper asks; the reference never does).
      `linear_attention` divides without a clamp; the clamp here (1e-30) cannot act once ε > 0.

    `implied_matrix` is the operator `forward` applies to V: with `pad_keys="zero_logit"` its rows are normalised
    over all N keys (pads included, as the forward's normaliser is) and its pad columns are then zeroed — the
    forward zeroes pad values itself — so a real row sums to less than 1 by the pad keys' share of the normaliser,
    and `implied_matrix @ v` equals the forward for any v. Pad rows are zero in both modes.

    Orthogonal blocks come from an unsigned QR (as performer_pytorch's default `qr_uniform_q=False`), which is
    not Haar-distributed: in both modes the estimate keeps a small bias however large M is (i.i.d. rows do not).

    Where the encoder's chain is compiled (`compiled`, `model.kernels`), `forward` runs the whole core through
    `models.kernels.performer_core` (64 rows of projections and features at a time in cache; no `[B, H, N, M]`
    tensor) and the eager chain otherwise: the same values at fp32 rounding.
    """

    config = PerformerConfig
    #: `[H, M, D]`, or `[M, D]` with `shared_heads` (one matrix broadcast over the heads)
    projection: torch.Tensor
    passes: torch.Tensor
    rank_knob = "num_features"

    def configure(self, cfg: PerformerConfig) -> None:
        if int(cfg.num_features) < 1:
            raise ValueError(f"attn.num_features={cfg.num_features}: must be a positive integer")
        if cfg.logit_scale not in LOGIT_SCALES:
            raise ValueError(f"attn.logit_scale={cfg.logit_scale!r}: must be one of {', '.join(LOGIT_SCALES)}")
        if cfg.pad_keys not in PAD_KEYS:
            raise ValueError(f"attn.pad_keys={cfg.pad_keys!r}: must be one of {', '.join(PAD_KEYS)}")
        if not float(cfg.feature_eps) >= 0.0:
            raise ValueError(f"attn.feature_eps={cfg.feature_eps}: must be a non-negative number")
        self.num_features, self.redraw_every = int(cfg.num_features), int(cfg.redraw_every)
        self.orthogonal = bool(cfg.orthogonal)
        self.logit_scale, self.pad_keys = str(cfg.logit_scale), str(cfg.pad_keys)
        self.shared_heads, self.feature_eps = bool(cfg.shared_heads), float(cfg.feature_eps)
        self._generator = torch.Generator().manual_seed(int(cfg.seed))
        self.register_buffer("projection", self._draw())
        self.register_buffer("passes", torch.zeros((), dtype=torch.long))
        self._passes = 0

    def _draw(self) -> torch.Tensor:
        heads = 1 if self.shared_heads else self.num_heads
        rows = gaussian_features(self._generator, heads, self.num_features, self.head_dim, self.orthogonal)
        return rows[0] if self.shared_heads else rows

    def get_extra_state(self) -> dict[str, Any]:
        return {"generator": self._generator.get_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state and "generator" in state:
            self._generator.set_state(state["generator"].detach().to("cpu", torch.uint8))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._passes = int(self.passes)

    def rank_budget(self, seq_len: int) -> int:
        return min(self.num_features, seq_len)

    def _maybe_redraw(self) -> None:
        if not self.training:
            return
        self.passes += 1
        self._passes += 1
        if self.redraw_every and self._passes % self.redraw_every == 0:
            self.projection.copy_(self._draw())

    def _zero_logit_pads(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """`[B, 1, N, 1]` real-token weights when pad keys and values are zeroed (`pad_keys="zero_logit"`)."""
        if mask is None or self.pad_keys != "zero_logit":
            return None
        return mask[:, None, :, None].float()

    def _scaled(self, q, k, mask):
        """q and k in fp32 scaled so that x·y is the estimated logit, pad keys zeroed with `pad_keys="zero_logit"`."""
        scale = q.shape[-1] ** (-0.5 if self.logit_scale == "d" else -0.25)
        qf, kf = q.float() * scale, k.float() * scale
        keep = self._zero_logit_pads(mask)
        if keep is not None:
            kf = kf * keep  # pad keys become zero vectors: logit 0, φ(0) ≠ 0
        return qf, kf

    def _factors(self, q, k, mask):
        w = self.projection.float()
        w = w if self.shared_heads else w.unsqueeze(0)  # [M, D] (broadcast over batch and heads) or [1, H, M, D]
        qf, kf = self._scaled(q, k, mask)
        masked = mask is not None and self.pad_keys == "masked"
        proj_q, proj_k = qf @ w.transpose(-1, -2), kf @ w.transpose(-1, -2)  # [B, H, N, M]
        half_q, half_k = (qf * qf).sum(-1, keepdim=True) / 2, (kf * kf).sum(-1, keepdim=True) / 2  # ‖x‖²/2
        with torch.no_grad():  # the shifts are constants (detached): from row maxima of x·Wᵀ, one read pass each
            row_q, row_k = proj_q.amax(-1, keepdim=True), proj_k.amax(-1, keepdim=True)
            if not self.feature_eps:  # the max of the whole exponent x·Wᵀ − ‖x‖²/2 (‖x‖²/2 is constant in a row)
                row_q, row_k = row_q - half_q, row_k - half_k
            if masked:
                row_k = row_k.masked_fill(~mask[:, None, :, None], float("-inf"))
            k_shift = row_k.amax(-2, keepdim=True).nan_to_num(0.0, neginf=0.0)
        offset_q, offset_k = half_q + row_q, half_k + k_shift
        floor_q = floor_k = torch.tensor(float(self.feature_eps))
        if masked:  # a pad key's features are 0: exp(−inf), and no ε
            offset_k = offset_k.masked_fill(~mask[:, None, :, None], float("inf"))
            floor_k = floor_k * mask[:, None, :, None]
        return self._features(proj_q, offset_q, floor_q), self._features(proj_k, offset_k, floor_k)

    def _features(self, proj: torch.Tensor, offset: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
        """`exp(proj − offset) + floor` with its gradients: through the compiled kernel `models.kernels.shifted_exp`
        (one pass over the features each way) where the encoder's chain is compiled (`compiled`: `implied_matrix`'s;
        `forward` there runs the blocked core), else `ShiftedExp`."""
        if self.compiled and fused_encoder.applies(proj) and shifted_exp.applies(proj):
            return shifted_exp.shifted_exp(proj, offset, floor)
        features: torch.Tensor = ShiftedExp.apply(proj, offset, floor)
        return features

    def forward(self, q, k, v, mask):
        self._maybe_redraw()
        with fp32_core(q.device):
            vf = v.float()
            keep = self._zero_logit_pads(mask)
            if keep is not None:
                vf = vf * keep
            ones = torch.ones_like(v[..., :1], dtype=torch.float32)
            values = torch.cat([vf, ones], dim=-1)
            if self.compiled and fused_encoder.applies(vf) and performer_core.applies(vf):
                # with the encoder's compiled chain: the core blocked in cache, no [B, H, N, M] tensor made
                valid = mask if mask is not None and self.pad_keys == "masked" else None
                both = performer_core.blocked_favor(
                    *self._scaled(q, k, mask), values, self.projection.float(), valid, self.feature_eps
                )
            else:
                phi_q, phi_k = self._factors(q, k, mask)
                # φ(K)ᵀ[V | 1] with φ(K)'s gradient row-major, the layout of its exponential: as autograd sends it
                # (transposed), the features' backward multiplied the two element by element across layouts, the
                # slowest pass of the step, then copied it row-major for the projection's
                both = phi_q @ transposed_product(phi_k, values)
            out = both[..., :-1] / both[..., -1:].clamp_min(1e-30)
        return out.to(v.dtype)

    def implied_matrix(self, q, k, mask):
        with fp32_core(q.device):
            phi_q, phi_k = self._factors(q, k, mask)
            weights = phi_q @ phi_k.transpose(-1, -2)
            mat = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
        if mask is not None:
            mat = mat * mask[:, None, :, None]
            if self.pad_keys == "zero_logit":  # normalised over the pads too; their values are zeroed in forward
                mat = mat * mask[:, None, None, :]
        return mat

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        r = int(m or knobs(PerformerConfig, params).num_features)
        proj, mix = 4.0 * n * r * d, 4.0 * n * r * (d + 1)  # Q·Wᵀ and K·Wᵀ; φ(K)ᵀ[V | 1] and φ(Q)·(…)
        return Flops(proj + mix, backward=proj + 2.0 * mix)  # W is a constant: one backward product each
