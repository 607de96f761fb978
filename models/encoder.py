"""The LRA encoder: token + learned position embeddings, pre-LN transformer blocks, pooling.

Matches the Nyströmformer/Skyformer LRA model (2 layers, dim 64, FFN 128, 2 heads, dropout 0.1) when built
with the `nystromformer` protocol. The attention operator is injected by a factory so that every block gets
its own instance (selectors may hold per-layer state, e.g. GPA's codebook).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from models.attention.base import Attention
from models.dropout import Dropout

POOLINGS = ("mean", "mean_legacy", "cls")


class MultiHeadAttention(nn.Module):
    """Projections around an `Attention` operator. Pads never carry values and never receive outputs."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, attention: Attention, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim)
        self.attention = attention
        self.out = nn.Linear(num_heads * head_dim, dim)
        self.dropout = Dropout(dropout)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`x [B, N, dim]` → q, k, v `[B, H, N, D]`, each contiguous.

        One copy of the whole projection into head-major memory, because every attention's batched matmuls
        need `[B·H, N, D]` and would otherwise copy q, k and v one by one (some twice: a scaled or masked view
        keeps the token-major strides). The values are the same bit for bit (every registered attention's loss
        and gradients, `tests/test_cpu_layout.py`); the faithful ListOps step 0.908 → 0.881 s and an evaluation
        batch 0.303 → 0.295 s for nystrom, side by side in one process on one idle thread."""
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).contiguous()
        q, k, v = qkv.unbind(0)  # (indexing qkv[i] would zero-fill a whole [3, …] gradient per projection)
        return q, k, v

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.project(x)
        if mask is not None:
            v = v * mask[:, None, :, None].to(v.dtype)
        ctx = self.attention(q, k, v, mask)
        if mask is not None:
            ctx = ctx * mask[:, None, :, None].to(ctx.dtype)
        b, _, n, _ = ctx.shape
        return self.dropout(self.out(ctx.transpose(1, 2).reshape(b, n, -1)))


class Block(nn.Module):
    """Pre-LN transformer block: x + Attn(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, dim: int, ffn_dim: int, attn: MultiHeadAttention, dropout: float) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), attn
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim), nn.GELU(), Dropout(dropout), nn.Linear(ffn_dim, dim), Dropout(dropout)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        return x + self.ffn(self.norm2(x))


def pool(x: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """`mean` averages real tokens; `mean_legacy` is the Nyströmformer and Skyformer code's MEAN pooling: pad
    outputs zeroed, then the mean over all N positions, so the sum of the real tokens is divided by the padded
    length (mlpen/Nystromformer@5689313 LRA/code/model.py:99 and model_wrapper.py:11); `cls` takes position 0
    (the encoder prepends a CLS token)."""
    if pooling == "cls":
        return x[:, 0]
    if mask is None:
        return x.mean(dim=1)
    weights = mask.to(x.dtype).unsqueeze(-1)
    if pooling == "mean_legacy":
        return (x * weights).mean(dim=1)
    if pooling == "mean":
        return (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)
    raise ValueError(f"model.pooling={pooling!r}: expected one of {POOLINGS}")


class Encoder(nn.Module):
    """Token ids `[B, N]` (+ mask) → pooled representation `[B, dim]`."""

    @staticmethod
    def total_length(seq_len: int, pooling: str) -> int:
        """The length every attention sees: the sequence plus the CLS token that `cls` pooling prepends."""
        return seq_len + int(pooling == "cls")

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        dim: int,
        depth: int,
        num_heads: int,
        head_dim: int,
        ffn_dim: int,
        attention_factory: Callable[[int], Attention],
        dropout: float = 0.1,
        pooling: str = "mean",
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"model.pooling={pooling!r}: expected one of {POOLINGS}")
        self.pooling = pooling
        self.use_cls = pooling == "cls"
        total_len = self.total_length(seq_len, pooling)
        self.token_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Embedding(total_len, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim)) if self.use_cls else None
        self.drop = Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(
                dim,
                ffn_dim,
                MultiHeadAttention(dim, num_heads, head_dim, attention_factory(total_len), dropout),
                dropout,
            )
            for _ in range(depth)
        )
        attentions = [cast(Block, block).attn.attention for block in self.blocks]
        for attention in attentions[1:]:  # what a variant shares across layers is the first block's (`share_with`)
            attention.share_with(attentions[0])
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.token_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)

    def embed(self, ids: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.token_emb(ids)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
            if mask is not None:
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        positions = torch.arange(x.shape[1], device=ids.device)
        return self.drop(x + self.pos_emb(positions)), mask

    def features(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-position outputs `[B, N (+1 with CLS), dim]` after the final norm, and the mask they go with —
        what a sequence classifier pools and what a language-model head reads token by token."""
        x, mask = self.embed(ids, mask)
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x), mask

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x, mask = self.features(ids, mask)
        return pool(x, mask, self.pooling)
