"""WildCat attention against the paper's formula written out densely in fp64, its exact case (every key in the
coreset), its denominator guard, padding, gradients (finite differences), FLOP count and its place in the study."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lra_bench.registry import build_attention, build_selector
from models.landmarks.rpcholesky import RHO, key_features

B, H, D = 2, 2, 8


def make(selector: str = "rpcholesky", n: int = 32, selector_kw=None, **kw):
    sel = build_selector(selector, **(selector_kw or {}))
    return build_attention("wildcat", head_dim=kw.pop("d", D), num_heads=H, seq_len=n, selector=sel, **kw).eval()


def qkv(n: int, seed: int = 0, scale: float = 1.0, d: int = D, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    return (scale * q).to(dtype), (scale * k).to(dtype), v.to(dtype)


def softmax_attention(q, k, v, mask=None):
    logits = (q @ k.transpose(-1, -2)).double() / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(logits, -1) @ v.double()


def paper_formula(q, k, v, idx, tau="auto", center=True):
    """One head, fp64, the exp matrices written out: W = exp((β/τ²)K_SK_Sᵀ)⁻¹ exp((β/τ²)K_SKᵀ), Â = exp(βQK_Sᵀ)W.
    Returns (Â V, Â 1, Σ_{s∈S} exp(βq·k_s)) — the numerator, the estimated and the partial row sums."""
    q, k, v = q.double(), k.double(), v.double()
    beta = q.shape[-1] ** -0.5
    kc = k - k.mean(0, keepdim=True) if center else k
    tau2 = RHO * kc.norm(dim=-1).max() / q.norm(dim=-1).max() if tau == "auto" else tau**2
    ks = kc[idx]
    w = torch.linalg.solve(torch.exp(beta / tau2 * ks @ ks.T), torch.exp(beta / tau2 * ks @ kc.T))
    left = torch.exp(beta * q @ ks.T)
    a_hat = left @ w
    return a_hat @ v, a_hat.sum(-1, keepdim=True), left.sum(-1, keepdim=True)


def rpcholesky_pivots(module, q, k, mask=None):
    """The coreset the module draws (eval mode: a fixed function of the input), recomputed from its selector."""
    s = q.shape[-1] ** -0.25
    real = torch.ones(q.shape[0], 1, q.shape[2], dtype=torch.bool) if mask is None else mask[:, None, :]
    z, _ = key_features(q.float() * s, k.float() * s, real, module.tau, module.center_keys)
    return module.selector.pivots(z, real, module.rank_budget(q.shape[-2]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bins", [1, 2])
def test_every_key_in_the_coreset_is_exact_softmax(dtype: torch.dtype, bins: int) -> None:
    n = 16
    q, k, v = qkv(n, dtype=dtype)
    module = make(n=n, num_landmarks=n, num_bins=bins)
    idx, valid = rpcholesky_pivots(module, q, k) if bins == 1 else (None, None)
    if valid is not None:
        assert valid.all(), "every key is a pivot"
    atol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(module(q, k, v, None).double(), softmax_attention(q, k, v), rtol=0, atol=atol)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, 11:] = False
    out = module(q, k, v * mask[:, None, :, None], mask).double()
    ref = softmax_attention(q, k, v, mask)
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=atol)
    torch.testing.assert_close(out[1, :, :11], ref[1, :, :11], rtol=0, atol=atol)


@pytest.mark.parametrize(("tau", "center"), [("auto", True), (1.5, True), ("auto", False)])
def test_matches_the_paper_formula_on_its_rpcholesky_coreset(tau, center) -> None:
    n, r = 40, 10
    q, k, v = qkv(n, seed=1)
    module = make(n=n, num_landmarks=r, tau=tau, center_keys=center)
    idx, valid = rpcholesky_pivots(module, q, k)
    assert valid.all()
    out = module(q, k, v, None)
    for b in range(B):
        for h in range(H):
            num, est, part = paper_formula(q[b, h], k[b, h], v[b, h], idx[b, h], tau, center)
            assert (est > part).all(), "a benign input: the guard does not act"
            torch.testing.assert_close(out[b, h].double(), num / est, rtol=1e-4, atol=1e-5)


def test_denominator_guard_uses_the_exact_partial_row_sum() -> None:
    """Nyström weights can be negative: on this input (found by search) some rows have Â1 < 0. Those rows are
    divided by Σ_{s∈S} exp(βq·k_s) ≤ A1 instead; every other row by Â1 itself."""
    n, d, r = 24, 4, 5
    q, k, v = qkv(n, seed=9, scale=2.0, d=d, dtype=torch.float64)
    module = make("hash", n=n, num_landmarks=r, d=d)
    idx = build_selector("hash")(q, k, None, r).indices
    out = module(q, k, v, None)
    assert torch.isfinite(out).all()
    negative = below = 0
    for b in range(B):
        for h in range(H):
            num, est, part = paper_formula(q[b, h], k[b, h], v[b, h], idx[b, h])
            negative += int((est <= 0).sum())
            below += int((est < part).sum())
            torch.testing.assert_close(out[b, h], num / torch.maximum(est, part), rtol=1e-6, atol=1e-8)
    assert negative > 0 and below > negative, "the input has rows with Â1 ≤ 0 and rows with 0 < Â1 < partial sum"


def test_gradients_match_finite_differences() -> None:
    """fp64, eval mode (a fixed coreset draw): autograd through the kernel, the stable solve, the guard and τ."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 7, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    module = make(n=7, num_landmarks=3, d=4)
    mask = torch.tensor([[True] * 6 + [False]])
    assert torch.autograd.gradcheck(lambda a, b, c: module(a, b, c * mask[:, None, :, None], mask), (q, k, v))


@pytest.mark.parametrize("bins", [1, 3])
def test_real_outputs_ignore_padding_and_batch_mates(bins: int) -> None:
    n, r = 30, 9
    q, k, v = qkv(n, seed=4)
    module = make(n=n + 10, num_landmarks=r, num_bins=bins)
    ref = module(q, k, v, None)
    extra = qkv(10, seed=5)
    q2, k2, v2 = (torch.cat([a, b], dim=2) for a, b in zip((q, k, v), extra))
    mask = torch.zeros(B, n + 10, dtype=torch.bool)
    mask[:, :n] = True
    out = module(q2, k2, v2 * mask[:, None, :, None], mask)
    torch.testing.assert_close(out[:, :, :n], ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(module(q.flip(0), k.flip(0), v.flip(0), None), ref.flip(0))


def test_clamp_output_keeps_the_values_range() -> None:
    n, d = 24, 4
    q, k, v = qkv(n, seed=9, scale=2.0, d=d)  # the guard's input: some rows' estimates leave the hull of V
    free = make("hash", n=n, num_landmarks=5, d=d)(q, k, v, None)
    clamped = make("hash", n=n, num_landmarks=5, d=d, clamp_output=True)(q, k, v, None)
    lo, hi = v.amin(-2, keepdim=True), v.amax(-2, keepdim=True)
    assert ((free < lo) | (free > hi)).any(), "the unclamped estimate leaves the range somewhere"
    assert ((clamped >= lo) & (clamped <= hi)).all()
    inside = (free >= lo) & (free <= hi)
    assert torch.equal(clamped[inside], free[inside])


def test_configuration_errors_are_one_clear_line() -> None:
    with pytest.raises(ValueError, match=r"attn.tau='warm': expected 'auto' or a positive number"):
        make(tau="warm")
    with pytest.raises(ValueError, match=r"attn.num_bins=2 needs selector=rpcholesky"):
        make("uniform", num_bins=2)
    with pytest.raises(ValueError, match=r"selector.tau=2.0.*set attn.tau"):
        make(selector_kw={"tau": 2.0})
    make(tau=2.0, selector_kw={"tau": 2.0})  # the same kernel: fine
    q, k, v = qkv(16)
    with pytest.raises(ValueError, match=r"attn.num_bins=5 exceeds the coreset size r=4"):
        make(n=16, num_landmarks=4, num_bins=5)(q, k, v, None)
    with pytest.raises(ValueError, match="needs token landmarks"):
        make("segment_means")(q, k, v, None)


def test_hand_flops_match_the_flop_counter() -> None:
    """Every product the hand count names is one torch sees, forward and backward (the r×r pseudo-inverse's SVD is
    invisible to torch's counter: the hand count carries it as an estimate, subtracted here)."""
    from lra_bench.bench.costs import Point, attention_flops
    from lra_bench.bench.worker import count_flops
    from models.cost import pinv_flops

    n, r, d = 128, 16, 8
    module = build_attention(
        "wildcat", head_dim=d, num_heads=2, seq_len=n, selector=build_selector("rpcholesky"), num_landmarks=r
    )
    q, k, v, g = (torch.randn(1, 2, n, d, requires_grad=True) for _ in range(4))
    hand = attention_flops(Point("wildcat", batch=1, heads=2, n=n, m=r, d=d, selector="rpcholesky"))
    assert hand is not None
    for mode in ("forward", "forward_backward"):
        counted = count_flops(module, mode, q, k, v, None, g)
        pinv = 2 * pinv_flops(r, "exact", 0)  # two heads
        assert counted == pytest.approx(hand.for_mode(mode) - pinv, rel=1e-6), mode


def test_study_includes_wildcat_and_the_selector(tmp_path: Path) -> None:
    from tests.test_approx import TINY, run_approx

    args = [a for a in TINY if not a.startswith(("selectors=", "attns=", "seeds="))]
    data = run_approx(
        tmp_path, [*args, "seeds=[0]", "selectors=[rpcholesky,uniform]", "attns=[wildcat]", "model.enabled=false"]
    )
    rows = [r for r in data["rows"] if r["label"] in ("wildcat/rpcholesky", "rpcholesky")]
    assert {r["label"] for r in rows} == {"wildcat/rpcholesky", "rpcholesky"}
    assert all(r["status"] == "ok" and r["ey_ratio"] >= 1 - 1e-6 for r in rows), rows
    assert {r["m"] for r in rows} == {4, 8}
