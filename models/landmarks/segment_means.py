"""Segment means (Nyströmformer's landmarks), over the *real* tokens (the default) or the padded sequence.

`over="real"` (the default): each real token gets its rank r among the real tokens of its sequence; token r goes
to segment ⌊r·m / n_real⌋. With no padding and m | n this is exactly Nyströmformer's reshape-and-mean; with padding
it never dilutes a mean with pad zeros (mlpen does) and never wastes landmarks on an all-pad tail (lucidrains masks
them instead). A sequence with fewer real tokens than m leaves some segments empty: those landmarks are marked
invalid.

`over="padded"`: the reference code's landmarks (mlpen/Nystromformer@5689313 LRA/code/attention_nystrom.py:30-37):
m fixed blocks of n/m consecutive positions of the *padded* sequence (n its full length), each landmark the mean
of its block with pads counted as zeros (the reference zeroes pad queries and keys before the means) — so a block
holding pads gives a shrunken landmark and an all-pad block a zero landmark, and every landmark is valid (takes
weight in every kernel, as in the reference, where nothing masks them). The reference's reshape needs m | n; other
lengths are extended with pads to a multiple of m (`padded_block_means`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.cost import Flops, Params
from models.landmarks.base import Landmarks, LandmarkSelector, cluster_landmarks, gradient_d_major

#: `selector.over`: what the m segments divide
OVERS = ("real", "padded")


def segment_assignment(mask: torch.Tensor, m: int) -> torch.Tensor:
    """`mask [B, 1, N]` → segment id `[B, 1, N]` of each token (pads get id 0 but carry no weight)."""
    real = mask.long()
    rank = real.cumsum(-1) - 1
    n_real = real.sum(-1, keepdim=True).clamp_min(1)
    return (rank.clamp_min(0) * m) // n_real


class BlockMeans(torch.autograd.Function):
    """Means of `m` blocks of consecutive positions of `x [B, H, m·size, D]` (torch's own `mean`, so the same values),
    the gradient written row-major or D-major (`d_major`: `[B, H, D, N]` in memory, returned as its transposed view).

    Why: torch's mean backward sends the landmarks' gradient expanded over each block, which the unflatten's backward
    copies row-major from the layout it arrived in (6 ms a call at B = 32, H = 2, N = 2048, D = 32, m = 64 on one
    Zen 5 thread, from a D-major one), and the Nyström kernels' gradient of the same q or k is added to it in the
    layout `gradient_d_major` names. Here it is written once, in that layout. The values are the same bit for bit:
    each element is the landmark's gradient divided by the block size, as torch's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, m: int, d_major: bool) -> torch.Tensor:
        ctx.size, ctx.d_major = x.shape[-2] // m, d_major
        return x.unflatten(-2, (m, ctx.size)).mean(-2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        b, h, m, d = grad.shape
        share = grad / ctx.size
        if not ctx.d_major:  # [B, H, m, size, D] written row-major
            return share.unsqueeze(-2).expand(b, h, m, ctx.size, d).reshape(b, h, m * ctx.size, d), None, None
        spread = share.transpose(-1, -2).unsqueeze(-1).expand(b, h, d, m, ctx.size).reshape(b, h, d, m * ctx.size)
        return spread.transpose(-1, -2), None, None


def padded_block_means(x: torch.Tensor, mask: torch.Tensor, m: int, d_major: bool = False) -> torch.Tensor:
    """Means of `x [B, H, N, D]` over m blocks of ⌈N/m⌉ consecutive positions, pads (`mask [B, 1, N]` False) as
    zeros: the reference's `(x * mask).reshape(B, H, m, N // m, D).mean(-2)` when m | N. The reference cannot run
    other lengths; here the sequence is extended with zeros (pads) to m·⌈N/m⌉ first, so any length runs and a length
    the reference runs gives its numbers. `d_major`: the gradient's layout (`BlockMeans`)."""
    n = x.shape[-2]
    size = -(-n // m)
    zeroed = x * mask[..., None].to(x.dtype)
    if size * m != n:
        zeroed = torch.nn.functional.pad(zeroed, (0, 0, 0, size * m - n))
    means: torch.Tensor = BlockMeans.apply(zeroed, m, d_major)
    return means


@dataclass
class SegmentMeansConfig:
    """Nyströmformer's landmarks: means of m contiguous segments of the real tokens (or of the padded sequence)."""

    name: str = "segment_means"
    over: str = "real"  # real: m segments of the real tokens, empty ones invalid (ours) | padded: m blocks of n/m
    #                     positions of the padded sequence, pads as zeros, all valid (the reference code's)


class SegmentMeans(LandmarkSelector):
    config = SegmentMeansConfig

    def configure(self, cfg: Any) -> None:
        if cfg.over not in OVERS:
            raise ValueError(f"selector.over={cfg.over!r}: expected one of {', '.join(OVERS)}")
        self.over: str = cfg.over

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        if self.over == "padded":
            valid = torch.ones(*q.shape[:2], m, dtype=torch.bool, device=q.device)
            queries = padded_block_means(q, mask, m, gradient_d_major("queries", m, q.device))
            keys = padded_block_means(k, mask, m, gradient_d_major("keys", m, k.device))
            return Landmarks(queries=queries, keys=keys, valid=valid)
        return cluster_landmarks(q, k, mask, segment_assignment(mask, m).expand(q.shape[:3]), m)

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        return Flops(0.0, 2.0 * n * d)  # one add per element of q and of k (its backward is as many adds again)
