"""WildCat's cheaper training step (issue 31, item 3) against the operator as it was (`tests/wildcat_previous.py`):
the same pivots, values and gradients at fp64 rounding, in fp32 as accurate as before; the compiled RPCholesky loop
against the eager one (the same pivots, fp64 and fp32) and the attention the same on both kernels; the temperature's
gradient through the maximal rows against autograd's through every row; the per-sequence key sums through gradcheck."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lra_bench.registry import build_attention, build_selector
from models.attention.numerics import max_row_norm
from models.attention.wildcat import WildcatAttention
from models.attention.wildcat_sums import KeySums, Links, extents
from models.kernels import rpcholesky_pivots
from models.landmarks.rpcholesky import rpcholesky
from tests.test_pivot_loops import M, features, ragged_mask
from tests.wildcat_previous import previous_operator

B, H, N, D = 5, 2, 40, 8

needs_kernel = pytest.mark.skipif(rpcholesky_pivots.kernel() is None, reason="the kernel cannot be built here")


def make(**kw: Any) -> WildcatAttention:
    attn = build_attention(
        "wildcat", head_dim=D, num_heads=H, seq_len=N, num_landmarks=M, selector=build_selector("rpcholesky"), **kw
    )
    assert isinstance(attn, WildcatAttention)
    return attn.eval()  # a fixed draw per input: both operators see the same uniforms


def ragged() -> torch.Tensor:
    """Trailing pads of several lengths, a sequence with a hole, one full."""
    mask = torch.arange(N)[None, :] < torch.tensor([N, 31, 17, 26, 12])[:, None]
    mask[3, 5:9] = False
    return mask


def recorded_run(attn: WildcatAttention, operator: Any, dtype: torch.dtype) -> tuple[list[torch.Tensor], ...]:
    """Output and gradients of a fixed loss w.r.t. q, k, v, and the coreset the operator drew."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for _ in range(3))
    mask = ragged()
    drawn: list[torch.Tensor] = []
    pivots = attn.selector.pivots

    def record(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        idx, valid = pivots(*args, **kwargs)
        drawn.extend([idx, valid])
        return idx, valid

    attn.selector.pivots = record  # type: ignore[method-assign]
    try:
        out = operator(q, k, v * mask[:, None, :, None], mask)
    finally:
        del attn.selector.pivots
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    return [out.detach(), *grads], drawn


CONFIGS = [{}, {"num_bins": 2}, {"tau": 1.5}, {"center_keys": False}, {"clamp_output": True}]


@pytest.mark.parametrize("knobs", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_the_operator_matches_the_previous_one(knobs: dict[str, Any]) -> None:
    """fp64: the same pivots bit for bit (the coreset is drawn on the features as they were computed), outputs and
    gradients at fp64 rounding. fp32: the same pivots, and as close to the fp64 operator as the previous fp32
    operator is (the r×r core of a short sequence is ill-conditioned, so both sit well above fp32's epsilon)."""
    attn = make(kernel="eager", **knobs)
    clamp = bool(knobs.get("clamp_output", False))

    def previous(*args: torch.Tensor) -> torch.Tensor:
        return previous_operator(attn, *args, clamp)

    got, got_pivots = recorded_run(attn, attn, torch.float64)
    truth, truth_pivots = recorded_run(attn, previous, torch.float64)
    got32, got32_pivots = recorded_run(attn, attn, torch.float32)
    was32, was32_pivots = recorded_run(attn, previous, torch.float32)
    assert len(got_pivots) == 2
    for pivots in (truth_pivots, got32_pivots, was32_pivots):
        for g_, w_ in zip(got_pivots, pivots):
            assert torch.equal(g_, w_)
    for g_, g32, w32, w_ in zip(got, got32, was32, truth):
        assert torch.isfinite(w_).all()
        scale = float(w_.abs().max())
        torch.testing.assert_close(g_, w_, rtol=1e-10, atol=1e-10 * scale)
        error, was = (float((x.double() - w_).abs().max()) for x in (g32, w32))
        assert error <= 5 * was + 1e-5 * scale, (error, was, scale)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("num_bins", [1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_compiled_pivots_are_the_eager_loops(dtype: torch.dtype, num_bins: int, seed: int) -> None:
    """Ragged padding (a sequence without a real token, some shorter than m), a hole, duplicated keys (pivots whose
    residual falls to the tolerance: invalid slots) and bins: the same pivots and validity."""
    mask = ragged_mask(seed)
    z = features(seed).to(dtype)
    b, h, n, _ = z.shape
    eligible = mask[:, None, :].expand(b, h, n)
    u = torch.rand(b, h, M, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    bins = None if num_bins == 1 else (torch.arange(n) * num_bins // n).expand(b, h, n)
    got = rpcholesky_pivots.pivots(z, eligible, u, 1e-5, bins, num_bins)
    want = rpcholesky(z, eligible, M, u, 1e-5, bins, num_bins)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert want[1].any() and not want[1].all()


@needs_kernel
def test_wildcat_is_the_same_on_both_kernels() -> None:
    """fp32, training mode (the stream's draws): the same pivots, so the same values and gradients bit for bit; the
    compiled loop's products are counted as the eager loop's are."""
    runs = []
    for kernel in ("fused", "eager"):
        torch.manual_seed(0)
        attn = make(kernel=kernel).train()
        runs.append(recorded_run(attn, attn, torch.float32))
    (got, got_pivots), (want, want_pivots) = runs
    for g_, w_ in zip([*got_pivots, *got], [*want_pivots, *want]):
        assert torch.equal(g_, w_)


def test_an_unknown_kernel_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="attn.kernel='compiled': expected one of fused, eager"):
        make(kernel="compiled")


def test_the_maximal_row_norm_has_autograds_value_and_gradient() -> None:
    """Ties at the maximum (autograd splits the gradient evenly among them), pads and a scale: the value bit for
    bit, the gradient at rounding."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 11, 4, generator=g, dtype=torch.float64)
    x[0, 0, 7] = x[0, 0, 2] = 3 * x[0, 0, 2]  # a tie at the maximum
    x[1, :, 9] = 10.0  # the largest row is a pad: not counted
    real = torch.ones(3, 1, 11, 1, dtype=torch.float64)
    real[1, :, 8:] = 0.0
    weight = torch.randn(3, 2, generator=g, dtype=torch.float64)
    for args in ((None, 1.0), (real, 0.7)):
        leaf = x.clone().requires_grad_()
        got = max_row_norm(leaf, *args)
        (got_grad,) = torch.autograd.grad((got * weight).sum(), leaf)
        rows = leaf * args[1] if args[0] is None else leaf * args[1] * args[0]
        want = rows.norm(dim=-1).amax(-1)
        (want_grad,) = torch.autograd.grad((want * weight).sum(), leaf)
        assert torch.equal(got.detach(), want.detach())
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)
        assert got_grad[0, 0, 2].abs().sum() > 0 and got_grad[0, 0, 7].abs().sum() > 0


@pytest.mark.parametrize("binned", [False, True])
def test_the_key_sums_pass_gradcheck(binned: bool) -> None:
    """A full sequence, one with trailing pads, one with a hole, one without a real key; an invalid slot; bins."""
    b, h, n, d, r, e = 4, 2, 9, 3, 4, 2
    g = torch.Generator().manual_seed(0)
    zs, keys = (0.5 * torch.randn(b, h, m, d, generator=g, dtype=torch.float64) for m in (r, n))
    hsq = 0.5 * zs.pow(2).sum(-1)
    v = torch.randn(b, h, n, e, generator=g, dtype=torch.float64)
    real = torch.ones(b, 1, n, dtype=torch.bool)
    real[1, :, 6:] = False
    real[2, :, 3:5] = False
    real[3] = False
    valid = torch.ones(b, h, r, dtype=torch.bool)
    valid[0, 1, 2] = False
    bin_k = (torch.arange(n) * 2 // n).expand(b, h, n) if binned else None
    bin_s = torch.tensor([0, 0, 1, 1]).expand(b, h, r) if binned else None
    assert extents(real) == [9, 6, 9, 0]

    def sums(zs: torch.Tensor, keys: torch.Tensor, hsq: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """X·[V | 1]·e^M: the shift M is a constant of the graph, so the sums' derivative is that of their product
        with e^M (what the operator's ratio sees: M cancels there), whatever M the perturbed inputs give."""
        shift, out = KeySums.apply(zs, keys, hsq, v, Links(valid, real, bin_s, bin_k), extents(real))
        return out * shift.exp()

    inputs = tuple(t.clone().requires_grad_() for t in (zs, keys, hsq, v))
    assert torch.autograd.gradcheck(sums, inputs)
