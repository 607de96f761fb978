"""Build a classifier from plain settings (no Hydra and no registry here: the harness passes resolved dicts and
a factory that makes each block's attention)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from models.attention.base import Attention
from models.encoder import UNSET_KERNELS, Encoder
from models.heads import Classifier, DualClassifier, TaskNetwork

#: makes the attention of one block: `(layer index, sequence length incl. a CLS token) -> Attention`
AttentionFactory = Callable[[int, int], Attention]


def build_classifier(
    *,
    vocab_size: int,
    seq_len: int,
    num_classes: int,
    dual: bool,
    model: dict[str, Any],
    make_attention: AttentionFactory,
) -> TaskNetwork:
    """`model`: dim, depth, num_heads, head_dim, ffn_dim, dropout, pooling, head_hidden, interaction, kernels.
    `make_attention` is called once per block, in order (every block gets its own instance: selectors may hold
    per-layer state, e.g. GPA's codebook)."""
    num_heads, head_dim = int(model["num_heads"]), int(model["head_dim"])
    layers = iter(range(int(model["depth"])))

    encoder = Encoder(
        vocab_size=vocab_size,
        seq_len=seq_len,
        dim=int(model["dim"]),
        depth=int(model["depth"]),
        num_heads=num_heads,
        head_dim=head_dim,
        ffn_dim=int(model["ffn_dim"]),
        attention_factory=lambda total_len: make_attention(next(layers), total_len),
        dropout=float(model.get("dropout", 0.1)),
        pooling=str(model.get("pooling", "mean")),
        kernels=str(model.get("kernels", UNSET_KERNELS)),
    )
    hidden = int(model.get("head_hidden", model["ffn_dim"]))
    if dual:
        return DualClassifier(encoder, int(model["dim"]), hidden, num_classes, str(model.get("interaction", "nli")))
    return Classifier(encoder, int(model["dim"]), hidden, num_classes)
