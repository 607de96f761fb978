"""The two greedy pivot loops (RPCholesky for WildCat, pivoted QR for residual-pivoted attention) against their
previous formulas, kept here as the oracles, in fp64: the length-grouped loops that drop trailing padding and
the subnormal-free log must pick exactly the same pivots, so the attentions built on them give the same values
and gradients (issue 31, item 3). Likewise the residual-pivoted attention's row log-sum-exp, now summed per group of
sequences over the keys up to the group's last real one, and WildCat's key-side sums X·[V | 1] (now per sequence over
its own keys), against the previous full-width sums: equal at rounding."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import models.landmarks.pivoted_qr as pivoted_qr
import models.landmarks.rpcholesky as rpcholesky_module
from lra_bench.registry import build_attention, build_selector
from models.attention.pivoted import BlockwiseLSE, PivotedAttention
from models.attention.wildcat import WildcatAttention
from models.attention.wildcat_sums import Links
from models.kernels import row_logsumexp
from models.kernels.flash_attention import key_bias
from models.landmarks.base import length_groups
from models.landmarks.pivoted_qr import greedy_pivots
from models.landmarks.rpcholesky import rpcholesky

B, H, N, D, M = 19, 2, 96, 8, 12


def oracle_rpcholesky(
    z: torch.Tensor,
    eligible: torch.Tensor,
    m: int,
    u: torch.Tensor,
    tol: float,
    bins: torch.Tensor | None = None,
    num_bins: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The previous `rpcholesky`, verbatim: full width, `~chosen & (resid > 0)`, log of the clamped zeros."""
    b, h, n, _ = z.shape
    half_sq = 0.5 * z.pow(2).sum(-1)
    resid = eligible.to(z.dtype)
    chosen = ~eligible
    factor = z.new_zeros(b, h, m, n)
    picks, valid = [], []
    for t in range(m):
        allowed = ~chosen & (resid > 0)
        if bins is not None:
            allowed = allowed & (bins == t % num_bins)
        logw = (resid.clamp_min(1e-38).log() + 2.0 * half_sq).masked_fill(~allowed, float("-inf"))
        top = logw.amax(-1, keepdim=True)
        has = torch.isfinite(top)
        cdf = torch.exp(logw - top.nan_to_num(0.0, neginf=0.0)).cumsum(-1)
        total = cdf[..., -1:].contiguous()
        j = torch.searchsorted(cdf, (u[..., t : t + 1] * total).contiguous(), right=True)
        j = torch.minimum(j, torch.searchsorted(cdf, total)).clamp_max(n - 1)
        z_j = z.gather(-2, j[..., None].expand(b, h, 1, z.shape[-1]))
        col = torch.exp((z @ z_j.transpose(-1, -2)).squeeze(-1) - half_sq - half_sq.gather(-1, j))
        if bins is not None:
            col = col * (bins == bins.gather(-1, j)).to(col.dtype)
        if t:
            f_j = factor[..., :t, :].gather(-1, j[..., None].expand(b, h, t, 1))
            col = col - (f_j.transpose(-1, -2) @ factor[..., :t, :]).squeeze(-2)
        g_j = col.gather(-1, j)
        ok = has & (g_j > tol)
        f = col * (ok.to(col.dtype) * g_j.clamp_min(tol).rsqrt())
        factor[..., t, :] = f
        resid = (resid - f.pow(2)).clamp_min(0.0)
        chosen = chosen | torch.zeros_like(chosen).scatter(-1, j, has)
        resid = resid.masked_fill(chosen, 0.0)
        picks.append(j.squeeze(-1))
        valid.append(ok.squeeze(-1))
    idx, ok_all = torch.stack(picks, -1), torch.stack(valid, -1)
    return torch.where(ok_all, idx, torch.zeros_like(idx)), ok_all


def oracle_greedy_pivots(a: torch.Tensor, mask: torch.Tensor, m: int, tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The previous `greedy_pivots`, verbatim: one loop over the whole batch at full width."""
    b, h, ell, n = a.shape
    steps = min(m, n)
    col_sq = a.double().pow(2).sum(-2)
    resid_sq = col_sq.clone()
    floor_sq = (max(float(tol), 1e-6) ** 2) * col_sq.sum(-1)
    eligible = mask.expand(b, h, n).clone()
    basis = a.new_zeros(b, h, ell, steps)
    proj = a.new_zeros(b, h, steps, n)
    active = torch.ones(b, h, dtype=torch.bool, device=a.device)
    picks, valid = [], []
    for t in range(steps):
        q_t, w_t = basis[..., :t], proj[..., :t, :]
        j = resid_sq.masked_fill(~eligible, -1.0).argmax(dim=-1)
        col = a.gather(-1, j[..., None, None].expand(b, h, ell, 1))
        if t:
            col = col - q_t @ w_t.gather(-1, j[..., None, None].expand(b, h, t, 1))
            col = col - q_t @ (q_t.transpose(-1, -2) @ col)
        norm = col.norm(dim=-2, keepdim=True)
        active = active & (norm.squeeze(-1).squeeze(-1).double().pow(2) > floor_sq)
        qv = col / norm.clamp_min(1e-30)
        if t:
            qv = qv - q_t @ (q_t.transpose(-1, -2) @ qv)
            qv = qv / qv.norm(dim=-2, keepdim=True).clamp_min(1e-30)
        qv = qv * active[..., None, None].to(qv.dtype)
        w = qv.transpose(-1, -2) @ a
        resid_sq = (resid_sq - w.squeeze(-2).double().pow(2)).clamp_min(0.0)
        basis[..., t : t + 1] = qv
        proj[..., t : t + 1, :] = w
        eligible = eligible.scatter(-1, j.unsqueeze(-1), False)
        picks.append(j)
        valid.append(active)
    idx, ok = torch.stack(picks, -1), torch.stack(valid, -1)
    if idx.shape[-1] < m:
        pad = m - idx.shape[-1]
        idx = torch.cat([idx, idx.new_zeros(b, h, pad)], -1)
        ok = torch.cat([ok, ok.new_zeros(b, h, pad)], -1)
    return torch.where(ok, idx, torch.zeros_like(idx)), ok


def ragged_mask(seed: int = 0) -> torch.Tensor:
    """`[B, N]`: trailing padding of many lengths (one sequence without a real token, some shorter than M, one
    full), and one sequence with holes, so that groups, widths and the no-eligible case all occur."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(M + 1, N + 1, (B,), generator=g)
    lengths[:4] = torch.tensor([0, 3, M - 1, N])
    mask = torch.arange(N)[None, :] < lengths[:, None]
    mask[5, 10:20] = False
    return mask


def features(seed: int = 0, duplicates: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = 0.6 * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    if duplicates:  # repeated keys: pivots whose residual falls to the tolerance (invalid slots)
        z[6, :, 40:60] = z[6, :, 30:31]
    return z


def test_length_groups_cover_every_row_once_with_its_extent() -> None:
    mask = ragged_mask()
    groups = length_groups(mask[:, None, :].expand(B, H, N), minimum=M, size=4)
    rows = torch.cat([r for r, _ in groups])
    assert sorted(rows.tolist()) == list(range(B))
    for r, width in groups:
        last = max((int(torch.nonzero(mask[i]).max()) + 1 if mask[i].any() else 0) for i in r.tolist())
        assert width == max(last, M)


@pytest.mark.parametrize("num_bins", [1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_rpcholesky_matches_previous_formula(num_bins: int, seed: int) -> None:
    mask = ragged_mask(seed)
    z = features(seed)
    eligible = mask[:, None, :].expand(B, H, N)
    u = torch.rand(B, H, M, generator=torch.Generator().manual_seed(seed + 7), dtype=torch.float64)
    bins = None
    if num_bins > 1:
        bins = (torch.arange(N) * num_bins // N).expand(B, H, N)
    got = rpcholesky(z, eligible, M, u, 1e-5, bins, num_bins)
    want = oracle_rpcholesky(z, eligible, M, u, 1e-5, bins, num_bins)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert want[1].any() and not want[1].all()  # valid and invalid slots both exercised


@pytest.mark.parametrize("tol", [0.0, 1e-3])
def test_greedy_pivots_match_previous_formula(tol: float) -> None:
    mask = ragged_mask(3)
    g = torch.Generator().manual_seed(3)
    logits = 3.0 * torch.randn(B, H, 2 * M, N, generator=g, dtype=torch.float64)
    a = torch.softmax(logits.masked_fill(~mask[:, None, None, :], float("-inf")), -1).nan_to_num(0.0)
    got = greedy_pivots(a, mask[:, None, :], M, tol)
    want = oracle_greedy_pivots(a, mask[:, None, :], M, tol)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert want[1].any() and not want[1].all()


@pytest.mark.parametrize("tol", [0.0, 1e-3])
def test_the_compiled_pivoted_qr_loop_picks_the_eager_loops_pivots(tol: float) -> None:
    """`selector.kernel=fused` (the sketch and the pivot loop compiled, per sequence and head) against the eager
    sketch and loop: the same pivots and validity in fp64 (the kernel called directly, as the eager functions are)
    and through the selector in fp32 (what training runs), on ragged rows (a sequence without a real token, one
    shorter than M, one with holes: invalid sketch rows and invalid slots occur), with 1 and 2 threads."""
    from models.kernels import pivoted_qr as kernel
    from models.landmarks.pivoted_qr import sketch_rows_softmax

    if kernel.kernel() is None:
        pytest.skip("compiled kernel not built here")
    mask = ragged_mask(4)[:, None, :]
    g = torch.Generator().manual_seed(4)
    q, k = (1.5 * torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(2))
    rows = torch.randint(0, N, (B, H, 2 * M), generator=g) % mask.sum(-1, keepdim=True).clamp_min(1)
    rows_valid = mask.any(-1, keepdim=True).expand(B, H, 2 * M).clone()
    rows_valid[1, :, -5:] = False
    want = greedy_pivots(sketch_rows_softmax(q, k, mask, rows, rows_valid), mask, M, tol)
    assert want[1].any() and not want[1].all()
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            got = kernel.pivots(pivoted_qr.gather_tokens(q, rows), k, mask, rows_valid, M, tol)
            assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
            picked = [
                build_selector("pivoted_qr", kernel=path, tol=tol, seed=1)(q.float(), k.float(), mask[:, 0], M)
                for path in ("fused", "eager")
            ]
            assert torch.equal(picked[0].valid, picked[1].valid) and torch.equal(picked[0].indices, picked[1].indices)
            assert torch.equal(picked[0].rows, picked[1].rows) and picked[0].valid.any()
    finally:
        torch.set_num_threads(threads)


#: the knobs (the attention's, the selector's) that route their pivots through the eager loop the oracles replace
#: (WildCat's compiled pivot loop is tested against that loop in tests/test_wildcat_operator.py, pivoted QR's above)
EAGER_PIVOTS = {"wildcat": ({"kernel": "eager"}, {}), "pivoted": ({}, {"kernel": "eager"})}


def run_attention(name: str, selector: str, seed: int) -> tuple[torch.Tensor, ...]:
    """fp64 output of `name` on ragged inputs and the gradients of a fixed loss w.r.t. q, k, v."""
    torch.manual_seed(seed)
    attn = build_attention(
        name,
        head_dim=D,
        num_heads=H,
        seq_len=N,
        num_landmarks=M,
        selector=build_selector(selector, **EAGER_PIVOTS[name][1]),
        **EAGER_PIVOTS[name][0],
    )
    attn.train()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = ragged_mask(seed)
    mask[0, :2] = True  # every sequence has a real token: the attentions' own contract
    out = attn(q, k, v, mask)
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((out * weight * mask[:, None, :, None]).sum(), (q, k, v))
    return (out.detach(), *grads)


@pytest.mark.parametrize(
    ("name", "selector", "module", "loop", "oracle"),
    [
        ("wildcat", "rpcholesky", rpcholesky_module, "rpcholesky", oracle_rpcholesky),
        ("pivoted", "pivoted_qr", pivoted_qr, "greedy_pivots", oracle_greedy_pivots),
    ],
)
def test_attention_values_and_gradients_match_previous_pivots(
    name: str, selector: str, module: object, loop: str, oracle: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    got = run_attention(name, selector, 0)
    monkeypatch.setattr(module, loop, oracle)
    want = run_attention(name, selector, 0)
    for g_, w_ in zip(got, want):
        assert torch.isfinite(w_).all()
        torch.testing.assert_close(g_, w_, rtol=0.0, atol=0.0)


def oracle_row_lse(self: PivotedAttention, qf: torch.Tensor, kf: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """The previous `PivotedAttention._row_lse`, verbatim: one sum over all N keys, pads included as −inf."""
    if self.kernel == "fused" and qf.device.type == "cpu" and row_logsumexp.kernel() is not None:
        bias = key_bias(key_valid[:, 0, 0, :], qf.shape[0], kf.shape[-2], qf.dtype)
        return row_logsumexp.RowLogSumExp.apply(qf, kf, bias)
    return BlockwiseLSE.apply(qf, kf, key_valid, self.block_size)


def lse_and_grads(attn: PivotedAttention, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, N, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(2))
    mask = ragged_mask(seed)
    key_valid = mask[:, None, None, :]
    lse = attn._row_lse(q, k, key_valid)
    weight = torch.randn(lse.shape, generator=g, dtype=dtype)
    grads = torch.autograd.grad((torch.where(torch.isfinite(lse), lse, 0.0) * weight).sum(), (q, k))
    return (lse.detach(), *grads)


@pytest.mark.parametrize(("kernel", "dtype", "tol"), [("eager", torch.float64, 1e-12), ("fused", torch.float32, 2e-6)])
def test_row_lse_matches_previous_full_width_sum(
    kernel: str, dtype: torch.dtype, tol: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp64 where the path takes it (`BlockwiseLSE`); the compiled kernel is fp32 only (as the attention calls it)."""
    if kernel == "fused" and row_logsumexp.kernel() is None:
        pytest.skip("compiled kernel not built here")
    attn = build_attention(
        "pivoted",
        head_dim=D,
        num_heads=H,
        seq_len=N,
        num_landmarks=M,
        selector=build_selector("pivoted_qr"),
        kernel=kernel,
        block_size=16,
    )
    assert isinstance(attn, PivotedAttention)
    got = lse_and_grads(attn, dtype)
    monkeypatch.setattr(PivotedAttention, "_row_lse", oracle_row_lse)
    want = lse_and_grads(attn, dtype)
    assert torch.equal(torch.isfinite(got[0]), torch.isfinite(want[0]))
    assert not torch.isfinite(want[0]).all()  # the sequence without a real key: −inf, no gradient
    for g_, w_ in zip(got, want):
        torch.testing.assert_close(g_, w_, rtol=tol, atol=tol)


def oracle_key_sums(
    zs: torch.Tensor, keys: torch.Tensor, hsq_s: torch.Tensor, v: torch.Tensor, links: Links
) -> tuple[torch.Tensor, torch.Tensor]:
    """The previous full-width lines of `WildcatAttention._operator` (logits, shift and X·[V | 1] over all N keys,
    masked), on the arguments `_key_sums` takes now (zs·keysᵀ = z_s·zᵀ)."""
    key_ok = links.real.expand(hsq_s.shape[:-1] + links.real.shape[-1:])
    rhs = torch.cat([v, key_ok[..., None].to(v.dtype)], dim=-1)
    logits_sk = (zs @ keys.transpose(-1, -2) - hsq_s[..., None]).masked_fill(~links.dense(), float("-inf"))
    shift = logits_sk.amax(dim=(-1, -2), keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
    x = torch.exp(logits_sk - shift)
    return shift, x @ rhs


@pytest.mark.parametrize("num_bins", [1, 2])
def test_wildcat_key_sums_match_previous_full_width_sums(num_bins: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """WildCat in fp64 (its core follows the input's precision): output and gradients at fp64 rounding."""

    def run() -> tuple[torch.Tensor, ...]:
        torch.manual_seed(0)
        attn = build_attention(
            "wildcat",
            head_dim=D,
            num_heads=H,
            seq_len=N,
            num_landmarks=M,
            num_bins=num_bins,
            selector=build_selector("rpcholesky"),
        )
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
        mask = ragged_mask(0)
        mask[0, :2] = True
        out = attn(q, k, v, mask)
        weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
        return (out.detach(), *torch.autograd.grad((out * weight * mask[:, None, :, None]).sum(), (q, k, v)))

    got = run()
    monkeypatch.setattr(WildcatAttention, "_key_sums", staticmethod(oracle_key_sums))
    want = run()
    for g_, w_ in zip(got, want):
        assert torch.isfinite(w_).all()
        torch.testing.assert_close(g_, w_, rtol=1e-10, atol=1e-12)
