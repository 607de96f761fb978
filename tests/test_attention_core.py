"""`full` and `nystrom`: agreement with naive references, padding invariance, gradients, parity."""

from __future__ import annotations

import math

import pytest
import torch

from lra_bench.registry import ATTENTIONS, build_attention, build_selector
from models.attention.numerics import iterative_pinv


def qkv(b=2, h=2, n=16, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def naive_softmax_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(scores, -1) @ v


def nystrom(n: int, m: int, **kw):
    params = dict(num_landmarks=m, pinv="exact", conv_kernel=0) | kw
    sel = build_selector("segment_means")
    return build_attention("nystrom", head_dim=8, num_heads=2, seq_len=n, selector=sel, **params).double()


def test_full_equals_naive_softmax() -> None:
    q, k, v = qkv()
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 10:] = False
    attn = build_attention("full", head_dim=8, num_heads=2, seq_len=16)
    out = attn(q, k, v, mask)
    ref = naive_softmax_attention(q, k, v, mask)
    assert torch.allclose(out, ref, atol=1e-10)
    implied = attn.implied_matrix(q, k, mask)
    assert torch.allclose((implied @ v)[1, :, :10], ref[1, :, :10], atol=1e-10)


def test_nystrom_with_every_token_a_landmark_is_exact() -> None:
    q, k, v = qkv(n=16)
    out = nystrom(16, 16)(q, k, v, None)
    assert torch.allclose(out, naive_softmax_attention(q, k, v), atol=2e-5)  # fp32 core


def test_nystrom_with_every_real_token_a_landmark_is_exact_under_padding() -> None:
    q, k, v = qkv(n=16)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[0, 12:] = False
    out = nystrom(16, 16)(q, k, v * mask[:, None, :, None], mask)
    ref = naive_softmax_attention(q, k, v, mask)
    assert torch.allclose(out[0, :, :12], ref[0, :, :12], atol=2e-5)
    assert torch.allclose(out[1], ref[1], atol=2e-5)


@pytest.mark.parametrize("name", ["full", "nystrom"])
def test_extra_padding_does_not_change_real_outputs(name: str) -> None:
    q, k, v = qkv(n=12)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    pad = lambda x: torch.cat([x, torch.randn(2, 2, 20, 8, dtype=x.dtype)], dim=2)  # noqa: E731
    big_mask = torch.cat([mask, torch.zeros(2, 20, dtype=torch.bool)], dim=1)
    if name == "full":
        attn = build_attention("full", head_dim=8, num_heads=2, seq_len=32).double()
    else:
        attn = nystrom(32, 4, pinv="iterative")
    small = attn(q, k, v * mask[:, None, :, None], mask)
    big = attn(pad(q), pad(k), pad(v) * big_mask[:, None, :, None], big_mask)
    assert torch.allclose(small[0], big[0, :, :12], atol=1e-8)
    assert torch.allclose(small[1, :, :9], big[1, :, :9], atol=1e-8)


def reference_iterative_pinv(a: torch.Tensor, iters: int) -> torch.Tensor:
    """The formula of algorithms.md §2 written out independently, per matrix (no batching tricks)."""
    out = torch.empty_like(a)
    for idx in range(a.shape[0]):
        m = a[idx]
        z = m.T / (m.abs().sum(0).max() * m.abs().sum(1).max())
        eye = torch.eye(m.shape[0], dtype=m.dtype)
        for _ in range(iters):
            az = m @ z
            z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
        out[idx] = z
    return out


def test_iterative_pinv_parity_and_convergence() -> None:
    g = torch.Generator().manual_seed(1)
    a = torch.softmax(torch.randn(3, 6, 6, generator=g), -1)
    assert torch.allclose(iterative_pinv(a, 6), reference_iterative_pinv(a, 6), atol=1e-5)
    z = iterative_pinv(a, 30)
    assert torch.allclose(z, torch.linalg.pinv(a), atol=1e-3)


def test_nystrom_matches_reference_formula() -> None:
    """Xiong et al. Eq. 15 with segment-mean landmarks of d^-1/4-scaled q, k and 6 pinv iterations."""
    q, k, v = qkv(n=16, seed=3)
    attn = nystrom(16, 4, pinv="iterative", pinv_iterations=6)
    out = attn(q, k, v, None)
    s = q.shape[-1] ** -0.25
    qs, ks = q * s, k * s
    ql = qs.reshape(2, 2, 4, 4, 8).mean(-2)
    kl = ks.reshape(2, 2, 4, 4, 8).mean(-2)
    k1 = torch.softmax(qs @ kl.transpose(-1, -2), -1)
    k2 = torch.softmax(ql @ kl.transpose(-1, -2), -1)
    k3 = torch.softmax(ql @ ks.transpose(-1, -2), -1)
    z = reference_iterative_pinv(k2.reshape(4, 4, 4), 6).reshape(2, 2, 4, 4)
    assert torch.allclose(out, k1 @ (z @ (k3 @ v)), atol=1e-5)


def test_conv_skip_and_core_precision_under_autocast() -> None:
    q, k, v = (x.float() for x in qkv(n=32))
    attn = build_attention(
        "nystrom", head_dim=8, num_heads=2, seq_len=32, selector=build_selector("segment_means"), num_landmarks=4
    )
    assert attn.conv is not None and attn.conv.kernel_size == (35, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kern = attn.kernels(q.bfloat16(), k.bfloat16(), None)
        out = attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), None)
    assert kern.core_inv.dtype == torch.float32
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("name", ["full", "nystrom"])
def test_gradients_are_finite(name: str) -> None:
    q, k, v = (x.float().requires_grad_() for x in qkv(n=16))
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[0, 5:] = False
    sel = build_selector("segment_means") if name == "nystrom" else None
    kw = {"num_landmarks": 4} if name == "nystrom" else {}
    attn = build_attention(name, head_dim=8, num_heads=2, seq_len=16, selector=sel, **kw)
    attn(q, k, v, mask).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert q.grad.abs().sum() > 0


def test_registry_errors_name_the_valid_choices() -> None:
    with pytest.raises(KeyError, match="attn='nope' is not known; valid: .*full.*nystrom"):
        build_attention("nope", head_dim=8, num_heads=2, seq_len=16)
    assert {"full", "nystrom"} <= set(ATTENTIONS.names())
    with pytest.raises(ValueError, match="takes no selector"):
        build_attention("full", head_dim=8, num_heads=2, seq_len=16, selector=build_selector("segment_means"))
