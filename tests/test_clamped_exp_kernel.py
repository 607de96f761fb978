"""Skyformer's compiled Gaussian kernel (`models/kernels/clamped_exp.cpp`) against `torch.exp(s.clamp_max(0))`, which
it replaces where the encoder's chain is compiled: values and gradient (clamped and left-out entries, the kink at 0,
subnormals flushed), any thread count, the whole attention on both paths, and the encoder choosing the kernel exactly
where `model.kernels` compiles the chain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from models.kernels import clamped_exp, load
from tests.kernel_paths import compiled_in_encoder, on_both_paths, on_one_and_two_threads

pytestmark = pytest.mark.skipif(load("clamped_exp") is None, reason="the compiled kernel cannot be built here")


def logits_case(dtype: torch.dtype) -> torch.Tensor:
    """`[2, 3, 40, 37]` logits: mostly ≤ 0 and spread over exp's range, some positive (clamped: no gradient), some
    exactly 0 (the clamp passes the gradient there), a left-out row (−10⁴: exactly 0)."""
    gen = torch.Generator().manual_seed(31)
    logits = -torch.rand(2, 3, 40, 37, dtype=dtype, generator=gen) * 80
    logits[0, 0, 0, :5] = torch.tensor([0.5, 2.0, 0.0, 0.0, 1e-3], dtype=dtype)
    logits[1, 2, 7] -= 1e4
    return logits.requires_grad_()


def kernel_and_grad(
    function: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor, upstream: torch.Tensor
) -> list[torch.Tensor]:
    """The kernel by `function` and the logits' gradient."""
    out = function(logits)
    return [out, *torch.autograd.grad(out, logits, upstream)]


def eager(logits: torch.Tensor) -> torch.Tensor:
    return torch.exp(logits.clamp_max(0.0))


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_kernel_matches_the_eager_form(dtype: torch.dtype, tol: float) -> None:
    """Values and the logits' gradient against the eager clamp and exp: 1 and no gradient above 0, the gradient
    passed at 0, a left-out row exactly 0 with no gradient."""
    logits = logits_case(dtype)
    upstream = torch.randn(logits.shape, dtype=dtype, generator=torch.Generator().manual_seed(32))
    ours, want = kernel_and_grad(clamped_exp.clamped_exp, logits, upstream), kernel_and_grad(eager, logits, upstream)
    for got, expected in zip(ours, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    assert torch.equal(ours[1][0, 0, 0, :5] == 0, torch.tensor([True, True, False, False, True]))
    assert torch.all(ours[0][1, 2, 7] == 0) and torch.all(ours[1][1, 2, 7] == 0)


def test_the_backward_flushes_subnormal_products_to_zero() -> None:
    """A gradient times a kernel value near exp(−87) is subnormal in fp32: eager computes it (slowly), the kernel
    gives 0 — an error below the smallest normal float."""
    logits = torch.full((4, 64), -87.0, requires_grad=True)
    upstream = torch.full((4, 64), 0.25)
    ours, want = kernel_and_grad(clamped_exp.clamped_exp, logits, upstream), kernel_and_grad(eager, logits, upstream)
    tiny = torch.finfo(torch.float32).tiny
    assert torch.all((want[1] != 0) & (want[1].abs() < tiny))  # subnormal on the eager path
    assert torch.all(ours[1] == 0) and torch.equal(ours[0], want[0])


def test_the_kernel_passes_gradcheck_and_ignores_the_thread_count() -> None:
    """torch's gradcheck in fp64 away from the kink; fp32 values and gradient bit for bit the same on 1 and 2
    threads."""
    logits = -torch.rand(3, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(33)) * 5 - 0.1
    logits[0, :10] += 6.0  # positive: clamped
    assert torch.autograd.gradcheck(clamped_exp.ClampedExp.apply, (logits.requires_grad_(),))
    logits = logits_case(torch.float32)
    upstream = torch.randn(logits.shape, generator=torch.Generator().manual_seed(34))
    one, two = on_one_and_two_threads(lambda: kernel_and_grad(clamped_exp.clamped_exp, logits, upstream))
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_skyformer_computes_the_same_attention_on_both_paths() -> None:
    """The whole attention, its Gaussian kernels compiled and eager, at fp32 rounding (the same landmarks: the
    sampler's stream is the same)."""
    from lra_bench.registry import build_attention

    attention = build_attention("skyformer", head_dim=8, num_heads=2, seq_len=64, num_landmarks=16).eval()
    compiled, eager_path = on_both_paths(attention, 64, "ClampedExp")
    for got, want in zip(compiled, eager_path, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(want.detach().abs().max())))


def test_the_encoder_computes_skyformers_kernel_compiled_exactly_where_its_chain_is() -> None:
    """`model.kernels` says how the whole network computes: the compiled chain (auto, fused) takes the compiled
    Gaussian kernel with it, the eager chain keeps the clamp and exp."""
    from lra_bench.registry import build_attention

    def skyformer(layer: int, n: int) -> Any:
        return build_attention("skyformer", head_dim=8, num_heads=2, seq_len=n, num_landmarks=8)

    node = "ClampedExp"
    assert compiled_in_encoder("fused", skyformer, node) and compiled_in_encoder("auto", skyformer, node)
    assert not compiled_in_encoder("eager", skyformer, node)
