"""Local attention's compiled core (`models/kernels/local_attention.cpp`) against the eager blocked form it replaces
where the encoder's chain is compiled: values and all three gradients, padding, rows with no key in their band, the
causal band, any thread count, and the encoder choosing it exactly where `model.kernels` compiles the chain."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from models.kernels import load, local_attention
from models.kernels.flash_attention import key_bias
from tests.kernel_paths import compiled_in_encoder, on_one_and_two_threads

pytestmark = pytest.mark.skipif(load("local_attention") is None, reason="the compiled kernel cannot be built here")


def local_case(n: int, window: int, causal: bool, dtype: torch.dtype) -> tuple[Any, list[torch.Tensor], torch.Tensor]:
    """Local attention (2 heads of 8), q, k, v `[2, 2, n, 8]`, and a key mask: the second sequence ends in pads, the
    first has a run of 2w + 5 pads inside it, so the queries in that run's middle have no real key in their band."""
    from lra_bench.registry import build_attention

    attention = build_attention("local", head_dim=8, num_heads=2, seq_len=n, window=window).to(dtype)
    attention.causal = causal
    gen = torch.Generator().manual_seed(11)
    qkv = [torch.randn(2, 2, n, 8, dtype=dtype, generator=gen, requires_grad=True) for _ in range(3)]
    keys = torch.ones(2, n, dtype=torch.bool)
    keys[1, n - n // 3 :] = False
    keys[0, n // 4 : n // 4 + 2 * window + 5] = False
    return attention, qkv, keys


def output_and_grads(attention: Any, qkv: list[torch.Tensor], keys: torch.Tensor, compiled: bool) -> list[torch.Tensor]:
    """The attention on the path `compiled` names, and its gradients with respect to q, k and v."""
    attention.compiled = compiled
    out = attention(*qkv, keys)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(12))
    return [out, *torch.autograd.grad(out, qkv, upstream)]


# (n, window, causal): blocks of 32 queries ending in a part block (300 = 9·32 + 12) under a window wider than a block;
# a window narrower than a block; the causal band on a length that is no multiple of a block
CASES = [(300, 40, False), (100, 3, False), (77, 10, True)]


@pytest.mark.parametrize(("n", "window", "causal"), CASES)
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_local_kernel_matches_the_eager_form(n: int, window: int, causal: bool, dtype: torch.dtype, tol: float):
    """Values and the gradients of q, k and v against the eager blocked form (unfolded windows, mask bias, ATen's
    softmax); the queries without a real key in their band are zero on both paths."""
    attention, qkv, keys = local_case(n, window, causal, dtype)
    ours, eager = output_and_grads(attention, qkv, keys, True), output_and_grads(attention, qkv, keys, False)
    for got, want in zip(ours, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * max(1.0, float(want.detach().abs().max())))
    assert "LocalWindowAttention" in type(ours[0].grad_fn).__name__  # the compiled path ran
    middle = n // 4 + window + 2  # no real key within `window` on either side
    assert torch.all(eager[0][0, :, middle] == 0) and torch.all(ours[0][0, :, middle] == 0)
    assert torch.all(ours[1][0, :, middle] == 0)  # and no gradient reaches its query


def test_the_local_kernel_passes_gradcheck_and_ignores_the_thread_count() -> None:
    """torch's gradcheck in fp64 on q, k and v (pads and an empty band included); the fp32 output and gradients bit
    for bit the same on 1 and 2 threads."""
    _, qkv, keys = local_case(40, 3, False, torch.float64)
    bias = key_bias(keys, 2, 40, torch.float64)
    band = local_attention.LocalWindowAttention.apply
    assert torch.autograd.gradcheck(lambda q, k, v: band(q, k, v, bias, 3, 3), qkv)
    attention, qkv, keys = local_case(300, 40, False, torch.float32)
    one, two = on_one_and_two_threads(lambda: output_and_grads(attention, qkv, keys, True))
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_the_encoder_runs_local_attention_compiled_exactly_where_its_chain_is() -> None:
    """`model.kernels` says how the whole network computes: the compiled chain (auto, fused) takes local attention's
    compiled core with it, the eager chain keeps the eager blocked form."""
    from lra_bench.registry import build_attention

    def local(layer: int, n: int) -> Any:
        return build_attention("local", head_dim=8, num_heads=2, seq_len=n, window=4)

    node = "LocalWindowAttention"
    assert compiled_in_encoder("fused", local, node) and compiled_in_encoder("auto", local, node)
    assert not compiled_in_encoder("eager", local, node)
