"""Performer's compiled features (`models/kernels/shifted_exp.cpp`) against the eager `ShiftedExp` they replace where
the encoder's chain is compiled (the attention's implied matrix, for the diagnostics: its forward runs the blocked
core, `test_performer_core_kernel.py`): values and both gradients, dropped (pad) rows, a floor per row, any thread
count, and the implied matrix on both paths."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from models.attention.performer import ShiftedExp
from models.kernels import load, shifted_exp
from tests.kernel_paths import graph_has, on_one_and_two_threads

pytestmark = pytest.mark.skipif(load("shifted_exp") is None, reason="the compiled kernel cannot be built here")


def features_case(dtype: torch.dtype, n: int = 40, m: int = 37) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Projections `[2, 3, n, m]` (m = 37: a feature count that is no multiple of a vector), offsets at least each
    row's maximum (the exponent ≤ 0, as Performer's shift makes it) with +inf on the second sequence's last quarter of
    rows (pad keys), and a floor per row that is 0 on those rows."""
    gen = torch.Generator().manual_seed(21)
    proj = (3 * torch.randn(2, 3, n, m, dtype=dtype, generator=gen)).requires_grad_()
    offset = proj.detach().amax(-1, keepdim=True) + torch.rand(2, 3, n, 1, dtype=dtype, generator=gen)
    pads = n - n // 4
    offset[1, :, pads:] = float("inf")
    offset.requires_grad_()
    floor = torch.full((2, 1, n, 1), 1e-4, dtype=dtype)
    floor[1, :, pads:] = 0.0
    return proj, offset, floor


def features_and_grads(function: Any, proj: torch.Tensor, offset: torch.Tensor, floor: torch.Tensor) -> list[Any]:
    """The features by `function`, and their gradients with respect to the projections and the offsets."""
    out = function(proj, offset, floor)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(22))
    return [out, *torch.autograd.grad(out, (proj, offset), upstream)]


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_features_match_the_eager_form(dtype: torch.dtype, tol: float) -> None:
    """Features and the gradients of the projections and the offsets against `ShiftedExp`; a dropped row is its
    floor (0) and sends no gradient."""
    proj, offset, floor = features_case(dtype)
    ours = features_and_grads(shifted_exp.shifted_exp, proj, offset, floor)
    eager = features_and_grads(ShiftedExp.apply, proj, offset, floor)
    for got, want in zip(ours, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * max(1.0, float(want.detach().abs().max())))
    assert (
        torch.all(ours[0][1, :, 30:] == 0) and torch.all(ours[1][1, :, 30:] == 0) and torch.all(ours[2][1, :, 30:] == 0)
    )


def test_the_features_pass_gradcheck_and_ignore_the_thread_count() -> None:
    """torch's gradcheck in fp64 (projections and offsets); fp32 features and gradients bit for bit the same on 1 and
    2 threads."""
    proj, offset, floor = features_case(torch.float64, n=8, m=5)
    assert torch.autograd.gradcheck(lambda p, o: shifted_exp.CompiledShiftedExp.apply(p, o, floor), (proj, offset))
    proj, offset, floor = features_case(torch.float32)
    one, two = on_one_and_two_threads(lambda: features_and_grads(shifted_exp.shifted_exp, proj, offset, floor))
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


@pytest.mark.parametrize("reference", [False, True])
def test_performers_implied_matrix_is_the_same_on_both_paths(reference: bool) -> None:
    """The operator the attention applies (the diagnostics' `implied_matrix`: ours, and the Nyströmformer reference's
    settings: ε in the features, logit-0 pad keys, one projection shared by the heads, logits over d) with its
    features compiled and eager, at fp32 rounding, the kernel's node exactly on the compiled path."""
    from lra_bench.registry import build_attention

    knobs = dict(feature_eps=1e-4, pad_keys="zero_logit", shared_heads=True, logit_scale="d") if reference else {}
    attention = build_attention("performer", head_dim=8, num_heads=2, seq_len=50, num_features=16, **knobs).eval()
    gen = torch.Generator().manual_seed(41)
    q, k = (torch.randn(2, 2, 50, 8, generator=gen, requires_grad=True) for _ in range(2))
    keys = torch.ones(2, 50, dtype=torch.bool)
    keys[1, 30:] = False
    results = []
    for compiled in (True, False):
        attention.compiled = compiled
        matrix = attention.implied_matrix(q, k, keys)
        assert graph_has(matrix, "CompiledShiftedExp") is compiled
        results.append(matrix)
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)
