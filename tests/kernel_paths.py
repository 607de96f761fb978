"""Helpers of the compiled kernels' tests: the same call on one torch thread and on two (no kernel's result may depend
on the thread count), and the attention module a one-block encoder built with a given `model.kernels` holds (the
encoder decides which path an attention computes on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def on_one_and_two_threads(compute: Callable[[], list[torch.Tensor]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`compute()` on 1 thread, then on 2; the caller's thread count restored afterwards."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = compute()
        torch.set_num_threads(2)
        two = compute()
    finally:
        torch.set_num_threads(threads)
    return one, two


def encoder_attention(kernels: str, make_attention: Callable[[int, int], Any]) -> Any:
    """The attention of a one-block classifier (dim 16, 2 heads of 8, 64 tokens) built with `model.kernels=kernels`."""
    from models.build import build_classifier
    from models.encoder import Block

    model = build_classifier(
        vocab_size=20,
        seq_len=64,
        num_classes=5,
        dual=False,
        model={"dim": 16, "depth": 1, "num_heads": 2, "head_dim": 8, "ffn_dim": 32, "kernels": kernels},
        make_attention=make_attention,
    )
    return next(m for m in model.modules() if isinstance(m, Block)).attn.attention
