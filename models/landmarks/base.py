"""The landmark-selector interface and the masked cluster-mean helper every selector shares.

A selector maps queries and keys `[B, H, N, D]` plus a padding mask `[B, N]` (True = real token) to `m`
landmark queries and keys. Landmarks may be cluster means (segment means, k-means) or tokens (uniform,
pivoted QR); in the second case `indices` names the tokens so that exact columns of A can be formed.
Padding never becomes, or contributes to, a landmark: a landmark without any real token behind it is
reported invalid in `valid`, and every attention masks invalid landmarks out of all its kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from models.cost import Flops, Params
from models.cpu import below_vector_width
from models.knobs import NamedByConfig


@dataclass
class Landmarks:
    """Landmark queries/keys `[B, H, m, D]`, validity `[B, H, m]` and, for token landmarks, indices `[B, H, m]`."""

    queries: torch.Tensor
    keys: torch.Tensor
    valid: torch.Tensor
    indices: torch.Tensor | None = None

    @property
    def count(self) -> int:
        return self.queries.shape[-2]


def resolve_num_landmarks(m: int | str, seq_len: int) -> int:
    """`m` is an integer or `"log2"` (⌈log₂ n⌉, GPA's default); never more than the sequence length."""
    if isinstance(m, str):
        if m != "log2":
            raise ValueError(f"num_landmarks={m!r}: expected a positive integer or 'log2'")
        value = max(1, math.ceil(math.log2(max(seq_len, 2))))
    else:
        value = int(m)
    if value < 1:
        raise ValueError(f"num_landmarks={m!r}: expected a positive integer or 'log2'")
    return min(value, seq_len)


def broadcast_mask(mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """A `[B, N]` bool mask (None = all real) as `[B, 1, N]`-broadcastable bool on q's device."""
    if mask is None:
        return torch.ones(q.shape[0], 1, q.shape[2], dtype=torch.bool, device=q.device)
    return mask[:, None, :].to(device=q.device, dtype=torch.bool)


#: sequences per group in `length_groups`: few enough that a group's pivot state stays in cache, many enough that
#: the per-step Python overhead of a greedy pivot loop (one call per group) stays small
LENGTH_GROUP = 8


def length_groups(eligible: torch.Tensor, minimum: int = 1, size: int = LENGTH_GROUP) -> list[tuple[torch.Tensor, int]]:
    """Batch rows grouped by extent, for a pivot loop that runs per group on the leading columns only.

    `eligible [B, H, N]` bool (the positions a pivot may take). A row's extent is its last eligible position + 1;
    rows are sorted by extent (stably) into groups of `size`, each with its width: the group's largest extent,
    at least `min(minimum, N)` (a loop of `minimum` steps sees as many columns as on the full width). Returns
    `(batch rows, width)` pairs. Why: the greedy pivot loops (`rpcholesky`, `greedy_pivots`) re-read an N-wide
    state at each of their m steps, and trailing padding — about 40% of ListOps' columns — is never eligible;
    a pivot loop that drops only ineligible columns at the end computes the same pivots.
    """
    b, n = eligible.shape[0], eligible.shape[-1]
    pos = torch.arange(1, n + 1, device=eligible.device)
    extent = (eligible.reshape(b, -1, n) * pos).amax(dim=(1, 2)).cpu()  # 0 where nothing is eligible
    order = extent.argsort(stable=True)
    floor = max(1, min(int(minimum), n))
    groups = []
    for start in range(0, b, size):
        rows = order[start : start + size]
        groups.append((rows.to(eligible.device), max(floor, int(extent[rows].max()))))
    return groups


def gradient_d_major(role: str, m: int, device: torch.device) -> bool:
    """Whether the gradient of the `role` ("queries" | "keys") a landmark mean is taken of should be written D-major
    (`[B, H, D, N]` in memory): the layout of the landmark kernels' gradient of the same tensor, which autograd adds
    to it. Q̃Kᵀ sends the keys' D-major; `landmark_weights` sends the queries' D-major where it takes the short axis
    (`models.cpu.below_vector_width`), row-major otherwise.

    Why: a sum of two gradients in different layouts reads one of them against its layout, element by element across
    cache lines — ~4.8 ms per [32, 2, 2048, 32] add on one Zen 5 thread, ~1.1 in one layout."""
    return role == "keys" or below_vector_width(m, device)


class SlotSums(torch.autograd.Function):
    """`sums [B, H, S, D]`: the rows of `x [B, H, N, D]` summed into slot `slot [B, H, N]` (S slots) by one sequential
    `index_add` (deterministic on a CPU); its gradient is each row's slot's, a copy, written row-major or D-major
    (`d_major`: `[B, H, D, N]` in memory, returned as its transposed view; see `gradient_d_major`). The values are
    `index_add`'s own bit for bit either way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slot: torch.Tensor, slots: int, d_major: bool) -> torch.Tensor:
        b, h, n, d = x.shape
        ids = (slot + torch.arange(b * h, device=x.device).view(b, h, 1) * slots).reshape(-1)
        ctx.save_for_backward(slot, ids)
        ctx.d_major = d_major
        return x.new_zeros(b * h * slots, d).index_add(0, ids, x.reshape(-1, d)).view(b, h, slots, d)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        slot, ids = ctx.saved_tensors
        b, h, slots, d = grad.shape
        if not ctx.d_major:
            return grad.reshape(-1, d).index_select(0, ids).view(b, h, -1, d), None, None, None
        per_feature = grad.transpose(-1, -2).contiguous()  # [B, H, D, S]: small, read D-major by the gather
        index = slot[:, :, None, :].expand(b, h, d, slot.shape[-1])
        return torch.gather(per_feature, -1, index).transpose(-1, -2), None, None, None


def cluster_means(
    x: torch.Tensor, assignment: torch.Tensor, mask: torch.Tensor, m: int, d_major: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked means of `x [B, H, N, D]` over `m` clusters given integer `assignment [B, H, N]`.

    Returns the means and the per-cluster real-token counts `[B, H, m]` (0 = empty cluster, mean 0). Never N×N
    in memory. On a CPU the sums are one `index_add` (`SlotSums`; pads go to a discarded slot per sequence and head):
    sequential, hence deterministic, and 75 → 3 ms forward + backward at B=32, H=2, N=2048, m=64 on one thread; its
    gradient row-major, or D-major with `d_major` (`gradient_d_major`).
    On an accelerator `index_add` uses atomics (run-to-run nondeterministic sums), so there the sums are a
    one-hot `[B, H, m, N]` matmul: deterministic on every device and differentiable in `x`. The two differ at
    fp32 rounding level (summation order).
    """
    real = mask.expand(assignment.shape)
    if x.device.type == "cpu":
        b, h, _, _ = x.shape
        slot = torch.where(real, assignment.long(), m)  # [B, H, N]; slot m collects the pads
        sums = SlotSums.apply(x, slot, m + 1, d_major)[..., :m, :]
        ones = torch.ones(slot.shape, dtype=x.dtype, device=x.device)
        counts = x.new_zeros(b, h, m + 1).scatter_add_(-1, slot, ones)[..., :m]  # whole numbers: exact
    else:
        onehot = torch.nn.functional.one_hot(assignment.long(), m).to(x.dtype)  # [B, H, N, m]
        onehot = onehot * real.to(x.dtype).unsqueeze(-1)
        counts = onehot.sum(dim=-2)  # [B, H, m]
        sums = onehot.transpose(-1, -2) @ x  # [B, H, m, D]
    means = sums / counts.clamp_min(1.0).unsqueeze(-1)
    return means, counts


def cluster_landmarks(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, assignment: torch.Tensor, m: int
) -> Landmarks:
    """Differentiable query and key means over the clusters of `assignment [B, H, N]`; empty = invalid. Each sends
    its gradient in the layout of the landmark kernels' gradient of the same tensor (`gradient_d_major`)."""
    q_l, counts = cluster_means(q, assignment, mask, m, gradient_d_major("queries", m, q.device))
    k_l, _ = cluster_means(k, assignment, mask, m, gradient_d_major("keys", m, k.device))
    return Landmarks(queries=q_l, keys=k_l, valid=counts > 0)


class LandmarkSelector(NamedByConfig, nn.Module):
    """Base class: subclasses implement `select`. Held as a submodule so state (buffers) checkpoints."""

    #: the `selector=` option name, `config.name` (`NamedByConfig`); a class with its own `name` is registered
    name: ClassVar[str] = ""
    #: the config dataclass (`models.knobs`): `name` plus one field per knob, each default written there only; the
    #: constructor takes an instance of it (`cfg`), `flops` reads it, `conf/selector/<name>.yaml` is generated
    config: ClassVar[type | None] = None
    #: True when the landmarks are tokens of the sequence (so `Landmarks.indices` is set).
    token_landmarks: bool = False

    def __init__(self, cfg: Any = None) -> None:
        """`cfg`: the selector's `config` instance (its defaults when None), handed to `configure`. The one
        constructor of every selector, so that a selector states only what its knobs set up."""
        super().__init__()
        if cfg is None and self.config is not None:
            cfg = self.config()
        self.configure(cfg)

    def configure(self, cfg: Any) -> None:
        """Take the knobs from `cfg`, the `config` instance (a selector without knobs has nothing to take)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, m: int) -> Landmarks:
        return self.select(q, k, broadcast_mask(mask, q), m)

    def select(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, m: int) -> Landmarks:
        """`mask` is `[B, 1, N]` bool here. Return `m` landmarks."""
        raise NotImplementedError

    @classmethod
    def flops(cls, n: int, m: int, d: int, params: Params) -> Flops:
        """FLOPs of choosing m landmarks per (batch · head) (`models.cost`); every selector declares it."""
        raise NotImplementedError(f"selector={cls.name or cls.__name__} declares no FLOP count (`flops`)")


def gather_tokens(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows `indices [B, H, m]` of `x [B, H, N, D]` → `[B, H, m, D]`."""
    return torch.gather(x, 2, indices.unsqueeze(-1).expand(*indices.shape, x.shape[-1]))
