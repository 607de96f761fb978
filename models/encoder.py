"""The LRA encoder: token + learned position embeddings, pre-LN transformer blocks, pooling.

Matches the Nyströmformer/Skyformer LRA model (2 layers, dim 64, FFN 128, 2 heads, dropout 0.1) when built
with the `nystromformer` protocol. The attention operator is injected by a factory so that every block gets
its own instance (selectors may hold per-layer state, e.g. GPA's codebook).

`kernels` (`model.kernels`) chooses how the chain around the matmuls runs: `eager` one torch operator at a time,
`fused` through the compiled kernel `models.kernels.fused_encoder` (on a CPU, in fp32/fp64, outside autocast, where it
is built; elsewhere the eager form): the same parameters, the same arithmetic at fp32 rounding, the dropout masks
from the kernel's own seeded stream. `auto` (the default) is `fused` where the kernel runs and `eager` elsewhere,
without a word: a run settles it (`kernels_that_run`) and records the path it took. The attentions follow it
(`Attention.compiled`): one with compiled passes of its own (Nyström's convolution skip) takes them with the chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from models.attention.base import Attention
from models.dropout import Dropout
from models.kernels import fused_encoder

POOLINGS = ("mean", "mean_legacy", "cls")
#: the values of `model.kernels`
KERNELS = ("auto", "fused", "eager")
#: those that take the compiled chain wherever it runs
COMPILED = ("auto", "fused")
#: what a config without `model.kernels` ran (written before the key existed): its checkpoints rebuild as they ran
UNSET_KERNELS = "eager"


#: the trainer precisions whose tensors the fused chain takes: fp32 or fp64, no autocast (`fused_encoder.applies`)
FUSED_PRECISIONS = ("32-true", "32", "64-true", "64")


def kernels_that_run(kernels: str, device: str, precision: str) -> tuple[str, str | None]:
    """The `model.kernels` a run on `device` (`cpu`, `cuda`, …) at trainer precision `precision` computes with, and
    why, where that is not `kernels`. Why at configuration time: the per-call test (`fused`) runs the eager chain
    wherever the kernel does not apply, so a run asked for `fused` on a GPU, under autocast, or without a compiler
    would compute eager yet be recorded (and fingerprinted, and ranked) as fused. `auto` is whichever runs, and
    needs no why: it asked for nothing more."""
    if kernels not in COMPILED:
        return kernels, None
    why = None
    if device != "cpu":
        why = f"the fused chain is a CPU kernel and this run is on {device}"
    elif str(precision) not in FUSED_PRECISIONS:
        why = f"trainer.precision={precision} is not fp32 or fp64 outside autocast, all the kernel takes"
    elif fused_encoder.kernel() is None:
        why = "the kernel could not be built on this machine"
    if why is None:
        return "fused", None
    return "eager", why if kernels == "fused" else None


def fused(kernels: str, x: torch.Tensor) -> bool:
    """Whether a module with `model.kernels=kernels` runs `x`'s chain through the compiled kernel."""
    return kernels in COMPILED and fused_encoder.applies(x)


def active_p(dropout: nn.Dropout) -> float:
    """The dropout a fused call applies: the module's p in training, 0 in evaluation."""
    return float(dropout.p) if dropout.training else 0.0


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, unbiased: bool = False) -> torch.Tensor:
        """The block's attention sublayer on `x [B, N, dim]`. `unbiased=True` is the fused path's form
        (`unbiased_output`), asked for through the module call all the same, so that a forward hook (the
        diagnostics probe's) sees the sublayer's input on either path."""
        if unbiased:
            return self.unbiased_output(x, mask)
        q, k, v = self.project(x)
        if mask is not None:
            v = v * mask[:, None, :, None].to(v.dtype)
        ctx = self.attention(q, k, v, mask)
        if mask is not None:
            ctx = ctx * mask[:, None, :, None].to(ctx.dtype)
        b, _, n, _ = ctx.shape
        return self.dropout(self.out(ctx.transpose(1, 2).reshape(b, n, -1)))

    def unbiased_output(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The fused path's `forward` up to the output projection's bias (the caller adds it with the dropout and
        the residual in one pass): the qkv bias and v's mask in the head split, the context's mask in the merge."""
        q, k, v = fused_encoder.split_heads(
            fused_encoder.product(x, self.qkv.weight), self.qkv.bias, mask, self.num_heads
        )
        ctx = self.attention(q, k, v, mask)
        return fused_encoder.product(fused_encoder.merge_heads(ctx, mask), self.out.weight)


class Block(nn.Module):
    """Pre-LN transformer block: x + Attn(LN(x)), then x + FFN(LN(x))."""

    def __init__(
        self, dim: int, ffn_dim: int, attn: MultiHeadAttention, dropout: float, kernels: str = UNSET_KERNELS
    ) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), attn
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim), nn.GELU(), Dropout(dropout), nn.Linear(ffn_dim, dim), Dropout(dropout)
        )
        self.kernels = kernels

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if fused(self.kernels, x):
            return self.fused_forward(x, mask)[0]
        x = x + self.attn(self.norm1(x), mask)
        return x + self.ffn(self.norm2(x))

    def fused_forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        normed: torch.Tensor | None = None,
        next_norm: nn.LayerNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` through the compiled chain: each linear layer's bias joins the pass after its product (GELU and
        dropout, or dropout and the residual add), and each residual add makes the layer norm that reads its output
        in the same pass (`fused_encoder.bias_dropout_add_norm`). `normed`: this block's `norm1(x)`, made so by the
        pass before (`Encoder.features`); `next_norm`: the norm after this block, whose output is returned beside x
        (None: x alone)."""
        attn = self.attn
        fc1, drop1, fc2, drop2 = (
            cast(nn.Linear, self.ffn[0]),
            cast(nn.Dropout, self.ffn[2]),
            cast(nn.Linear, self.ffn[3]),
            cast(nn.Dropout, self.ffn[4]),
        )
        normed = self.norm1(x) if normed is None else normed
        x, normed = fused_encoder.bias_dropout_add_norm(
            x, attn(normed, mask, unbiased=True), attn.out.bias, active_p(attn.dropout), self.norm2
        )
        h = fused_encoder.bias_gelu_dropout(fused_encoder.product(normed, fc1.weight), fc1.bias, active_p(drop1))
        y, p = fused_encoder.product(h, fc2.weight), active_p(drop2)
        if next_norm is None:
            return fused_encoder.bias_dropout_add(x, y, fc2.bias, p), None
        return fused_encoder.bias_dropout_add_norm(x, y, fc2.bias, p, next_norm)


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
        kernels: str = UNSET_KERNELS,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"model.pooling={pooling!r}: expected one of {POOLINGS}")
        if kernels not in KERNELS:
            raise ValueError(f"model.kernels={kernels!r}: expected one of {KERNELS}")
        self.pooling, self.kernels = pooling, kernels
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
                kernels,
            )
            for _ in range(depth)
        )
        attentions = [cast(Block, block).attn.attention for block in self.blocks]
        for attention in attentions[1:]:  # what a variant shares across layers is the first block's (`share_with`)
            attention.share_with(attentions[0])
        for attention in attentions:
            attention.compiled = kernels in COMPILED
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.token_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)

    def tokens(self, ids: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The token embeddings, the CLS token first where `cls` pooling prepends it, and the mask they go with."""
        x = self.token_emb(ids)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
            if mask is not None:
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        return x, mask

    def features(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-position outputs `[B, N (+1 with CLS), dim]` after the final norm, and the mask they go with —
        what a sequence classifier pools and what a language-model head reads token by token."""
        x, mask = self.tokens(ids, mask)
        if fused(self.kernels, x):  # every residual add with the layer norm after it (`Block.fused_forward`)
            norms = [cast(Block, block).norm1 for block in self.blocks] + [self.norm]
            position = self.pos_emb.weight[: x.shape[1]]  # the position add and the dropout in the same pass
            x, first = fused_encoder.bias_dropout_add_norm(None, x, position, active_p(self.drop), norms[0])
            normed: torch.Tensor | None = first
            for block, next_norm in zip(self.blocks, norms[1:]):
                x, normed = cast(Block, block).fused_forward(x, mask, normed, next_norm)
            assert normed is not None  # each block was given the norm after it
            return normed, mask
        x = self.drop(x + self.pos_emb(torch.arange(x.shape[1], device=ids.device)))
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x), mask

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x, mask = self.features(ids, mask)
        return pool(x, mask, self.pooling)
