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


def graph_has(out: torch.Tensor, node: str) -> bool:
    """Whether the autograd graph that made `out` holds a node whose name contains `node` (a kernel's Function
    called somewhere inside an attention)."""
    seen, frontier = set(), [out.grad_fn]
    while frontier:
        fn = frontier.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if node in type(fn).__name__:
            return True
        frontier.extend(next_fn for next_fn, _ in fn.next_functions)
    return False


def compiled_in_encoder(kernels: str, make_attention: Callable[[int, int], Any], node: str) -> bool:
    """Whether the attention of a one-block encoder built with `model.kernels=kernels` computes through the kernel
    whose autograd node is named `node` (on random q, k, v of 64 tokens)."""
    attention = encoder_attention(kernels, make_attention)
    q, k, v = (torch.randn(1, 2, 64, 8, requires_grad=True) for _ in range(3))
    return graph_has(attention(q, k, v, None), node)


def on_both_paths(attention: Any, n: int, node: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """An attention (2 heads of 8) on q, k, v `[2, 2, n, 8]` whose second sequence ends in pads (its last 2/5), with
    its `compiled` set and then not: each time the output and the gradients of q, k and v, having checked that the
    kernel (autograd node `node`) ran exactly on the compiled path."""
    gen = torch.Generator().manual_seed(41)
    qkv = [torch.randn(2, 2, n, 8, generator=gen, requires_grad=True) for _ in range(3)]
    keys = torch.ones(2, n, dtype=torch.bool)
    keys[1, n - 2 * n // 5 :] = False
    upstream = torch.randn(2, 2, n, 8, generator=gen)
    results = []
    for compiled in (True, False):
        attention.compiled = compiled
        out = attention(*qkv, keys)
        assert graph_has(out, node) is compiled
        results.append([out, *torch.autograd.grad(out, qkv, upstream)])
    return results[0], results[1]
