"""Nyström attention (Nyströmformer, Xiong et al. 2021) with any landmark selector.

    Â V = softmax(Q K̃ᵀ/√d) · pinv(softmax(Q̃ K̃ᵀ/√d)) · (softmax(Q̃ Kᵀ/√d) V),   evaluated right to left,

plus an optional depthwise convolution of V along the sequence (kernel 35 in the LRA config). As in the
reference code, Q and K are each scaled by d^(-1/4) before landmarks are taken, so landmarks are means of
the scaled vectors. Every kernel masks padding: padded keys in softmax(Q̃Kᵀ), invalid landmarks in the other
two (their core rows/columns become the identity so they drop out of the product exactly). The m×m core
and its pseudo-inverse are always fp32, even under autocast (fp64 when the inputs are fp64, as in the
approximation study). The core solve (`pinv`): `iterative` (Nyströmformer's, the default), `stable` (the
reference: `numerics.stable_pinv`, exact when the landmarks determine A) or `exact` (fp32 pinv with a 1e-4
cut-off, kept as before). Subclasses (GPA, …) reuse `kernels()`.

The reference code (mlpen/Nystromformer@5689313 LRA/code/attention_nystrom.py:30-60) is
`attn=nystrom selector.over=padded attn.pinv_init=original`: landmarks the means of n/m-position blocks of the
padded sequence with pads as zeros, all valid (so no kernel masks a landmark, as there), the batch-wide init of its
6-step pseudo-inverse; equal on every real position (tests/test_nystrom_reference.py). At pad positions the
reference's queries are zeroed, ours are not: only those rows of the output differ, and the encoder zeroes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from models.attention.landmark import LandmarkAttention
from models.attention.numerics import (
    core_precision,
    exact_pinv,
    fp32_core,
    iterative_pinv,
    landmark_weights,
    masked_softmax,
    stable_pinv,
)
from models.cost import Flops, Params, conv_flops, pinv_flops
from models.kernels import depthwise_conv, fused_encoder
from models.knobs import knobs
from models.landmarks.base import Landmarks

PINVS = ("iterative", "stable", "exact")


@dataclass
class NystromConfig:
    """Nyströmformer (Xiong et al. 2021): landmarks from any selector (default segment means), iterative pinv."""

    name: str = "nystrom"
    num_landmarks: Any = 64  # int, or "log2" for ⌈log₂ n⌉
    pinv: str = "iterative"  # iterative (Nyströmformer's Newton–Schulz steps) | stable (numerics.stable_pinv)
    #                          | exact (fp32 SVD pinv with cut-off 1e-4·σ₁: neither exact nor stable, kept as before)
    pinv_iterations: int = 6  # Newton–Schulz steps of the iterative pinv
    pinv_init: str = "per_matrix"  # or "original" (batch-wide norms, as the reference code)
    conv_kernel: int = 35  # depthwise conv skip on V; 0 disables it


@dataclass
class NystromKernels:
    """The three Nyström factors: `left [B,H,N,m]`, `core_inv [B,H,m,m]` (fp32), `right [B,H,m,N]`."""

    left: torch.Tensor
    core_inv: torch.Tensor
    right: torch.Tensor
    landmarks: Landmarks


class NystromAttention(LandmarkAttention):
    config: ClassVar[type | None] = NystromConfig  # (GPA's subclass has its own)
    default_selector = "segment_means"

    def configure(self, cfg: NystromConfig) -> None:
        super().configure(cfg)
        if cfg.pinv not in PINVS:
            raise ValueError(f"attn.pinv={cfg.pinv!r}: expected one of {', '.join(PINVS)}")
        self.pinv = cfg.pinv
        self.pinv_iterations = cfg.pinv_iterations
        self.pinv_init = cfg.pinv_init
        self.conv = None
        if kernel := cfg.conv_kernel:
            h = self.num_heads
            self.conv = nn.Conv2d(h, h, (kernel, 1), padding=(kernel // 2, 0), groups=h, bias=False)

    def invert_core(self, core: torch.Tensor) -> torch.Tensor:
        if self.pinv == "stable":
            return stable_pinv(core)
        if self.pinv == "exact":
            return exact_pinv(core)
        return iterative_pinv(core, self.pinv_iterations, self.pinv_init)

    def kernels(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> NystromKernels:
        scale = q.shape[-1] ** -0.25
        q, k = q * scale, k * scale
        lm = self.select_landmarks(q, k, mask)
        valid = lm.valid[..., None, :]  # [B, H, 1, m]
        left = landmark_weights(q, lm.keys, lm.valid)
        key_valid = None if mask is None else mask[:, None, None, :]
        right = masked_softmax(lm.queries @ k.transpose(-1, -2), key_valid)
        with fp32_core(q.device):
            pair = lm.valid[..., :, None] & lm.valid[..., None, :]
            core = masked_softmax(core_precision(lm.queries) @ core_precision(lm.keys).transpose(-1, -2), valid)
            eye = torch.eye(core.shape[-1], device=core.device, dtype=core.dtype)
            core = torch.where(pair, core, eye)
            core_inv = self.invert_core(core).to(core.dtype)
        return NystromKernels(left=left, core_inv=core_inv, right=right, landmarks=lm)

    def skip(self, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        """The convolution skip of `v` (None without one): through the compiled kernel `models.kernels.depthwise_conv`
        where the encoder's chain is compiled (`compiled`), in place on the head-major values with the mask folded in
        (the values below at fp32 rounding); else the eager form below."""
        if self.conv is None:
            return None
        weight = self.conv.weight.view(self.num_heads, -1)  # [H, k]
        if self.compiled and fused_encoder.applies(v) and depthwise_conv.applies(v, weight):  # where the chain runs
            return depthwise_conv.depthwise_conv(v, mask, weight)  # compiled too (`models.encoder.fused`)
        # The same depthwise (k×1) convolution of each head's V along the sequence, run as an H·D-channel depthwise conv
        # on the token-major layout [B, N, H·D] (channels-last): AVX-512 vectorises over 64 channels instead of 2 —
        # forward + backward 135 → 40 ms at B=32, H=2, N=2048, D=32 on one CPU thread (`python -m
        # lra_bench.bench.step`), the same forward values; the weight gradient sums the D copies of a head's kernel in
        # another order (fp32 rounding level).
        b, h, n, d = v.shape
        tokens = v.transpose(1, 2)  # [B, N, H, D], a view
        if mask is not None:
            tokens = tokens * mask[:, :, None, None].to(v.dtype)
        x = tokens.reshape(b, n, 1, h * d).permute(0, 3, 1, 2)  # [B, H·D, N, 1] in channels-last memory
        channels = self.conv.weight.repeat_interleave(d, dim=0)  # [H·D, 1, k, 1]: head h's kernel on its D channels
        y = nn.functional.conv2d(x, channels, padding=self.conv.padding, groups=h * d)
        return y.permute(0, 2, 3, 1).reshape(b, n, h, d).transpose(1, 2)  # [B, H, N, D] (token-major memory)

    def forward(self, q, k, v, mask):
        kern = self.kernels(q, k, mask)
        context = kern.right @ v  # [B, H, m, D]
        with fp32_core(q.device):
            context = (kern.core_inv @ context.to(kern.core_inv.dtype)).to(v.dtype)
        out = kern.left @ context
        skip = self.skip(v, mask)
        return out if skip is None else out + skip

    def implied_matrix(self, q, k, mask):
        kern = self.kernels(q, k, mask)
        wide = kern.core_inv.dtype
        mat = kern.left.to(wide) @ kern.core_inv @ kern.right.to(wide)
        if mask is not None:
            mat = mat * mask[:, None, :, None]
        return mat

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        m = int(m or 0)
        cfg = knobs(NystromConfig, params)  # GPA's config shares these knobs (it derives from NystromConfig)
        kernels = 2 * n * m * d * 2 + 2 * m * m * d  # QK̃ᵀ, Q̃Kᵀ, Q̃K̃ᵀ
        apply = 2 * m * n * d + 2 * m * m * d + 2 * n * m * d  # right·V, core⁺·(…), left·(…)
        pinv = pinv_flops(m, cfg.pinv, cfg.pinv_iterations)
        return Flops(kernels + apply + pinv + conv_flops(n, d, cfg.conv_kernel))
