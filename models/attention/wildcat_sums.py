"""WildCat's key-side sums X·[V | 1], one sequence at a time over its keys up to its last real one, forward and
backward in one autograd Function.

X is the r × N matrix exp(z_s·z_k − ‖z_s‖²/2 − M) (the Nyström right factor G_SK·D, scaled by one shift e^{−M} per
head that cancels in WildCat's ratio; `models/attention/wildcat.py`), zero on pads, invalid coreset slots and, with
bins, other bins' keys. Why its own Function: ListOps' sequences end in ~40% pads, exactly 0 in every sum, so the sums
run per sequence on its real extent; autograd through per-sequence (or per-group) slices of the key features and
values allocates a zero gradient of the whole tensor for every slice and adds them up — three to four passes over
[B, H, N, D] per slice, most of WildCat's backward (`_key_sums` had run per group of 8 sequences this way). Here
the backward writes each sequence's gradient into its own rows once. Each sequence's sums are the full-width ones
over fewer terms (the trailing pads' are exactly 0): fp32 rounding (tested against the full-width formula)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def extents(real: torch.Tensor) -> list[int]:
    """Each sequence's last real position + 1 (0 without one), from `real [B, 1, N]` bool: where its sums end."""
    pos = torch.arange(1, real.shape[-1] + 1, device=real.device)
    return [int(e) for e in (real[:, 0] * pos).amax(-1).tolist()]


@dataclass
class Links:
    """Which (coreset slot, key) pairs X keeps: valid slots `valid [B, H, r]`, real keys `real [B, 1, N]` bool and,
    with bins, only a slot's own bin (`bin_s [B, H, r]`, `bin_k [B, H, N]`)."""

    valid: torch.Tensor
    real: torch.Tensor
    bin_s: torch.Tensor | None = None
    bin_k: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:
        """All of them `[B, H, r, N]` (what the full-width formula masks with)."""
        link = self.valid[..., :, None] & self.real[..., None, :]
        if self.bin_s is not None and self.bin_k is not None:
            link = link & (self.bin_s[..., :, None] == self.bin_k[..., None, :])
        return link

    def of_sequence(self, i: int, w: int) -> torch.Tensor | None:
        """The keys of sequence i up to w that a valid slot may still not take `[H | 1, r | 1, w]` (holes, other
        bins); None where there are none (invalid slots are dropped by their −∞ row bias)."""
        real = self.real[i, :, :w]  # [1, w]
        if self.bin_s is None or self.bin_k is None:
            return None if bool(real.all()) else real.unsqueeze(0)
        return real.unsqueeze(0) & (self.bin_s[i].unsqueeze(-1) == self.bin_k[i, :, None, :w])


class KeySums(torch.autograd.Function):
    """`(shift [B, H, 1, 1], X·[V | 1] [B, H, r, E + 1])` from `zs [B, H, r, D]` (the coreset's features, already
    times 1/τ so that zs·k̃ᵀ = z_s·zᵀ), `keys [B, H, N, D]` (k̃), `hsq [B, H, r]` (‖z_s‖²/2), `v [B, H, N, E]`, the
    pairs kept (`Links`) and the sequences' `extents`. The shift M (the maximum logit per head, 0 where none) is a
    constant of the graph."""

    @staticmethod
    def forward(
        ctx: Any, zs: torch.Tensor, keys: torch.Tensor, hsq: torch.Tensor, v: torch.Tensor, links: Links, ends: list
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, r, _ = zs.shape
        out = v.new_zeros(b, h, r, v.shape[-1] + 1)
        shift = v.new_zeros(b, h, 1, 1)
        row_shift = hsq.masked_fill(~links.valid, float("inf")).unsqueeze(-1)  # [B, H, r, 1]; −∞ rows when invalid
        weights: list[torch.Tensor | None] = []
        sides: list[torch.Tensor | None] = []
        for i, w in enumerate(ends):
            if w == 0:
                weights.append(None)
                sides.append(None)
                continue
            logits = (zs[i] @ keys[i, :, :w].transpose(-1, -2)).sub_(row_shift[i])  # [H, r, w], as the full width
            link = links.of_sequence(i, w)
            if link is not None:
                logits.masked_fill_(~link, float("-inf"))
            top = logits.amax(dim=(-1, -2), keepdim=True).nan_to_num_(0.0, neginf=0.0)  # [H, 1, 1]
            x = logits.sub_(top).exp_()
            ones = links.real[i, :, :w].to(v.dtype).unsqueeze(-1).expand(h, w, 1)
            rhs = torch.cat([v[i, :, :w], ones], dim=-1)
            out[i] = x @ rhs
            shift[i] = top
            weights.append(x)
            sides.append(rhs)
        ctx.save_for_backward(zs, keys)
        ctx.weights, ctx.sides, ctx.ends = weights, sides, ends
        ctx.mark_non_differentiable(shift)
        return shift, out

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        zs, keys = ctx.saved_tensors
        e = grad.shape[-1] - 1
        need_zs, need_keys, need_hsq, need_v = ctx.needs_input_grad[:4]
        g_zs = torch.zeros_like(zs) if need_zs else None
        g_keys = torch.empty_like(keys) if need_keys else None
        g_hsq = zs.new_zeros(zs.shape[:-1]) if need_hsq else None
        g_v = keys.new_empty(*keys.shape[:-1], e) if need_v else None
        for i, w in enumerate(ctx.ends):
            if g_keys is not None:
                g_keys[i, :, w:].zero_()
            if g_v is not None:
                g_v[i, :, w:].zero_()
            x, rhs = ctx.weights[i], ctx.sides[i]
            if x is None:
                continue
            g_logits = (grad[i] @ rhs.transpose(-1, -2)).mul_(x)  # [H, r, w]
            if g_zs is not None:
                g_zs[i] = g_logits @ keys[i, :, :w]
            if g_keys is not None:
                g_keys[i, :, :w] = g_logits.transpose(-1, -2) @ zs[i]
            if g_hsq is not None:
                g_hsq[i] = -g_logits.sum(-1)
            if g_v is not None:
                g_v[i, :, :w] = x.transpose(-1, -2) @ grad[i, ..., :e]
        return g_zs, g_keys, g_hsq, g_v, None, None
