"""The spectral mixer's compiled tanh affinity (`models/kernels/tanh_affinity.cpp`) against the eager columns
`tanh(dots / T) · valid · mask` it replaces where the encoder's chain is compiled: its tanh against fp64 (an
independent oracle), values and gradient (masked entries exactly 0), any thread count, the whole attention on both
paths, and the encoder choosing the kernel exactly where `model.kernels` compiles the chain."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from models.kernels import load, tanh_affinity
from tests.kernel_paths import compiled_in_encoder, on_both_paths, on_one_and_two_threads

pytestmark = pytest.mark.skipif(load("tanh_affinity") is None, reason="the compiled kernel cannot be built here")

TEMPERATURE = 0.5


def columns_case(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dots `[2, 3, 40, 37]` over tanh's range (both branches, saturated entries), valid `[2, 3, 37]` with some
    landmarks left out, mask `[2, 40]` whose second sequence ends in pads."""
    gen = torch.Generator().manual_seed(51)
    dots = torch.randn(2, 3, 40, 37, dtype=dtype, generator=gen) * 2.0
    dots[0, 0, 0, :4] = torch.tensor([0.0, 1e-6, 30.0, -30.0], dtype=dtype)
    valid = torch.rand(2, 3, 37, generator=gen) > 0.2
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 25:] = False
    return dots.requires_grad_(), valid, mask


def eager(dots: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The eager columns, as `SpectralAttention.columns` computes them without the kernel."""
    cols = torch.tanh(dots / TEMPERATURE) * valid.unsqueeze(-2)
    return cols if mask is None else cols * mask[:, None, :, None]


def compiled(dots: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return tanh_affinity.masked_tanh(dots, TEMPERATURE, valid, mask)


def with_grad(function: Any, dots: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
    upstream = torch.randn(dots.shape, dtype=dots.dtype, generator=torch.Generator().manual_seed(52))
    out = function(dots, valid, mask)
    return [out, *torch.autograd.grad(out, dots, upstream)]


def test_its_tanh_is_within_two_ulp_of_fp64() -> None:
    """The kernel's fp32 tanh (Cephes' polynomial below 0.625, (1 − e)/(1 + e) above) against fp64's, on a dense grid
    over [−20, 20] and tiny arguments: relative error under 2 float eps everywhere, tanh(0) = 0, ±1 when saturated,
    odd."""
    x = torch.cat([torch.linspace(-20, 20, 400_001), torch.logspace(-30, 0, 20_001), torch.tensor([0.625, 1e3])])
    dots = torch.cat([x, -x]).view(1, 1, 1, -1)
    cols = compiled(dots, torch.ones(1, 1, dots.shape[-1], dtype=torch.bool), None).view(-1)
    want = torch.tanh(dots.view(-1).double() * (1 / TEMPERATURE))
    error = (cols.double() - want).abs() / want.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert float(error.max()) < 2 * torch.finfo(torch.float32).eps
    assert torch.equal(cols[: x.numel()], -cols[x.numel() :])
    assert float(compiled(torch.zeros(1, 1, 1, 1), torch.ones(1, 1, 1, dtype=torch.bool), None)) == 0.0
    assert cols[x.numel() - 1] == 1.0 and cols[-1] == -1.0


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-6)])
@pytest.mark.parametrize("masked", [True, False])
def test_the_kernel_matches_the_eager_columns(dtype: torch.dtype, tol: float, masked: bool) -> None:
    """Values and the dots' gradient against the eager division, tanh and mask products; a left-out landmark's column
    and a pad's row exactly 0, with no gradient."""
    dots, valid, mask = columns_case(dtype)
    mask_or_none = mask if masked else None
    ours, want = with_grad(compiled, dots, valid, mask_or_none), with_grad(eager, dots, valid, mask_or_none)
    for got, expected in zip(ours, want, strict=True):
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    dropped = ~valid[..., None, :] | (~mask[:, None, :, None] if masked else torch.zeros((), dtype=torch.bool))
    dropped = dropped.expand(dots.shape)
    assert dropped.any() and torch.all(ours[0][dropped] == 0) and torch.all(ours[1][dropped] == 0)


def test_the_kernel_passes_gradcheck_and_ignores_the_thread_count() -> None:
    """torch's gradcheck in fp64; fp32 values and gradient bit for bit the same on 1 and 2 threads."""
    gen = torch.Generator().manual_seed(54)
    dots = (torch.randn(2, 2, 9, 5, dtype=torch.float64, generator=gen) * 1.5).requires_grad_()
    valid = torch.tensor([True, False, True, True, True]).expand(2, 2, 5)
    mask = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    assert torch.autograd.gradcheck(tanh_affinity.MaskedTanh.apply, (dots, TEMPERATURE, valid, mask))
    dots, valid, mask = columns_case(torch.float32)
    one, two = on_one_and_two_threads(lambda: with_grad(compiled, dots, valid, mask))
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_spectral_computes_the_same_attention_on_both_paths() -> None:
    """The whole outlier-spectral attention, its columns compiled and eager, at fp32 rounding (the same landmarks)."""
    from lra_bench.registry import build_attention, build_selector

    attention = build_attention(
        "spectral", head_dim=8, num_heads=2, seq_len=64, selector=build_selector("uniform"), num_landmarks=16
    ).eval()
    compiled_path, eager_path = on_both_paths(attention, 64, "MaskedTanh")
    for got, want in zip(compiled_path, eager_path, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(want.detach().abs().max())))


def test_the_encoder_computes_spectrals_columns_compiled_exactly_where_its_chain_is() -> None:
    """`model.kernels` says how the whole network computes: the compiled chain (auto, fused) takes the compiled tanh
    affinity with it, the eager chain keeps ATen's division, tanh and products."""
    from lra_bench.registry import build_attention, build_selector

    def spectral(layer: int, n: int) -> Any:
        return build_attention(
            "spectral", head_dim=8, num_heads=2, seq_len=n, selector=build_selector("uniform"), num_landmarks=8
        )

    node = "MaskedTanh"
    assert compiled_in_encoder("fused", spectral, node) and compiled_in_encoder("auto", spectral, node)
    assert not compiled_in_encoder("eager", spectral, node)
