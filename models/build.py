"""Build a classifier from plain settings (no Hydra here: `lra_bench` passes resolved dicts)."""

from __future__ import annotations

import itertools
from typing import Any

from torch import nn

from models.attention import attention_params, build_attention
from models.attention.base import Attention
from models.encoder import Encoder
from models.heads import Classifier, DualClassifier
from models.landmarks import build_selector


def offset_seed(kwargs: dict[str, Any], layer: int) -> dict[str, Any]:
    if isinstance(kwargs.get("seed"), int):
        kwargs["seed"] = kwargs["seed"] + 1000 * layer
    return kwargs


def build_classifier(
    *,
    vocab_size: int,
    seq_len: int,
    num_classes: int,
    dual: bool,
    model: dict[str, Any],
    attn: dict[str, Any],
    selector: dict[str, Any] | None,
) -> nn.Module:
    """`model`: dim, depth, num_heads, head_dim, ffn_dim, dropout, pooling, head_hidden, interaction.
    `attn`/`selector`: the config nodes (with `name`) of the attention and its selector (or None)."""
    num_heads, head_dim = int(model["num_heads"]), int(model["head_dim"])
    attn_name = attn["name"]
    params = attention_params(attn_name, attn)

    layer = itertools.count()

    def make_attention(total_len: int) -> Attention:
        """Called once per block, in order. Seeded components get `seed + 1000·layer` so layers draw
        different landmarks/features while a run stays reproducible from its one `seed`."""
        index = next(layer)
        sel = None
        if selector is not None:
            sel_kwargs = offset_seed({k: v for k, v in selector.items() if k != "name"}, index)
            sel = build_selector(selector["name"], **sel_kwargs)
        return build_attention(
            attn_name,
            head_dim=head_dim,
            num_heads=num_heads,
            seq_len=total_len,
            selector=sel,
            **offset_seed(dict(params), index),
        )

    encoder = Encoder(
        vocab_size=vocab_size,
        seq_len=seq_len,
        dim=int(model["dim"]),
        depth=int(model["depth"]),
        num_heads=num_heads,
        head_dim=head_dim,
        ffn_dim=int(model["ffn_dim"]),
        attention_factory=make_attention,
        dropout=float(model.get("dropout", 0.1)),
        pooling=str(model.get("pooling", "mean")),
    )
    hidden = int(model.get("head_hidden", model["ffn_dim"]))
    if dual:
        return DualClassifier(encoder, int(model["dim"]), hidden, num_classes, str(model.get("interaction", "nli")))
    return Classifier(encoder, int(model["dim"]), hidden, num_classes)
