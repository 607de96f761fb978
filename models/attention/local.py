"""Local (sliding-window) attention: exact softmax restricted to the `w` tokens on each side of every query.

    out_i = Σ_{j : |i − j| ≤ w, j real} softmax_j(q_i · k_j / √d) v_j      (causal: also j ≤ i)

It is the locality baseline beside the methods: how much accuracy a model that can only see `w` tokens per layer
reaches (its receptive field after L layers is L·w tokens on each side; with `model.pooling=cls` the classifier
reads the CLS token at position 0, whose window covers the first w tokens per layer). Miralles-González et al.
2025 ("On the locality bias and results in the Long Range Arena", arXiv 2501.14850) argue that most LRA accuracy
comes from such short-range dependencies; this attention measures that claim for each task and protocol.

Computed in blocks: the queries are cut into blocks of c = max(w, `MIN_BLOCK`) tokens, and each block scores the
c + 2w keys its window can reach (an `unfold` view of the keys padded by w on both sides), so time and memory are
O(n·(c + 2w)) = O(n·w) and no n × n tensor exists. Which of those c × (c + 2w) scores are inside the band does not
depend on the block (key t of a block is in row r's window iff 0 ≤ t − r ≤ 2w), so one band pattern serves every
block; padded keys and the positions past the sequence end are masked through the same padded key mask. With
w ≥ n the band holds every key and the call is exact attention (`full`'s SDPA path, O(n) memory).

Where the encoder's chain is compiled (`model.kernels` auto | fused: `compiled`), the band runs through the compiled
kernel `models.kernels.local_attention` instead: each block of queries scores only its key range in cache, with no
unfolded windows, mask tensors or folded-back gradients — the same values at fp32 rounding
(`tests/test_local_kernel.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.attention.base import Attention
from models.attention.full import causal_key_mask, key_mask
from models.attention.numerics import masked_attention, masked_softmax
from models.cost import Flops, Params, fused_memory, width_memory
from models.kernels import fused_encoder, local_attention
from models.knobs import knobs

#: the smallest query block: below it the per-block matmuls get too small to run at the machine's matmul rate, and
#: a block of c ≥ w tokens costs c + 2w ≤ 3·max(w, MIN_BLOCK) scores per query, still O(w) for w ≥ MIN_BLOCK
MIN_BLOCK = 32


@dataclass
class LocalConfig:
    """Local attention: exact softmax within `window` tokens on each side of every query (the locality
    baseline)."""

    name: str = "local"
    window: int = 64  # w: each token attends to the keys at most w positions away on each side


def block_size(window: int, n: int) -> int:
    """Queries per block: at least the window (so a block's keys are its own and one window on each side)."""
    return max(1, min(n, max(window, MIN_BLOCK)))


def band(c: int, window: int, causal: bool, device: torch.device) -> torch.Tensor:
    """`[c, c + 2w]` bool: key t of a block lies in the window of the block's query r (t − r ∈ [0, 2w]; causal:
    t − r ∈ [0, w], i.e. the key is not after the query)."""
    offset = torch.arange(c + 2 * window, device=device)[None, :] - torch.arange(c, device=device)[:, None]
    return (offset >= 0) & (offset <= (window if causal else 2 * window))


class LocalAttention(Attention):
    config = LocalConfig
    supports_causal = True

    def configure(self, cfg: LocalConfig) -> None:
        window = cfg.window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"attn.window={window!r}: must be a positive integer (tokens on each side)")
        self.window = window

    def covers(self, n: int) -> bool:
        """Whether the window reaches every key of an n-token sequence (then the call is exact attention)."""
        return self.window >= n - 1

    def forward(self, q, k, v, mask):
        n = q.shape[-2]
        if self.covers(n):
            keys = causal_key_mask(mask, n, q.device) if self.causal else key_mask(mask)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        if self.compiled and fused_encoder.applies(q) and local_attention.applies(q):  # where the chain runs
            return local_attention.local_attention(q, k, v, mask, self.window, self.causal)
        batch, heads, _, d = q.shape
        w, c = self.window, block_size(self.window, n)
        blocks = math.ceil(n / c)
        tail = blocks * c - n
        # 1/√d on the queries (d columns), not on the scores (c + 2w columns per query): the same logits at fp32
        # rounding, one pass fewer over the largest tensor, forward and backward
        q_blocks = F.pad(q * (1.0 / math.sqrt(d)), (0, 0, 0, tail)).view(batch, heads, blocks, c, d)
        span = c + 2 * w  # [w left | c own | w right] keys per block, an unfold view of the padded keys
        k_blocks = F.pad(k, (0, 0, w, tail + w)).unfold(-2, span, c)  # [B, H, blocks, D, span]
        v_blocks = F.pad(v, (0, 0, w, tail + w)).unfold(-2, span, c)
        real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if mask is None else mask
        key_real = F.pad(real, (w, tail + w), value=False).unfold(-1, span, c)  # [B, blocks, span]
        valid = band(c, w, self.causal, q.device) & key_real[:, None, :, None, :]  # [B, 1, blocks, c, span]
        scores = q_blocks @ k_blocks  # [B, H, blocks, c, span]
        out = masked_attention(scores, valid, v_blocks.transpose(-1, -2))
        return out.reshape(batch, heads, blocks * c, d)[:, :, :n]

    def implied_matrix(self, q, k, mask):
        n = q.shape[-2]
        positions = torch.arange(n, device=q.device)
        offset = positions[None, :] - positions[:, None]  # j − i
        inside = (offset.abs() <= self.window) & ((offset <= 0) if self.causal else True)
        keys = inside[None, None] if mask is None else inside[None, None] & mask[:, None, None, :]
        weights = masked_softmax((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), keys)
        return weights if mask is None else weights * mask[:, None, :, None]

    @classmethod
    def flops(cls, n: int, m: int | None, d: int, params: Params) -> Flops:
        keys = min(n, 2 * int(knobs(LocalConfig, params).window) + 1)  # the keys a query needs
        return Flops(4.0 * n * keys * d)  # QKᵀ and AV inside the band

    @classmethod
    def memory(cls, n: int, m: int | None, d: int, mode: str, params: Params) -> float:
        window = int(knobs(LocalConfig, params).window)
        if window >= n - 1:
            return fused_memory(n, d, mode)  # the window holds the sequence: SDPA
        return width_memory(n, block_size(window, n) + 2 * window, d, mode)  # scores/weights per block of queries
