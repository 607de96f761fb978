"""The RPCholesky selector against an independent numpy RPCholesky on the explicit kernel matrix, and its masking,
bins, temperature rule and seeded draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lra_bench.registry import build_selector
from models.landmarks.rpcholesky import RHO, key_features, rpcholesky

TRIALS = 1000
N, D, R = 120, 5, 8


def numpy_rpcholesky(kernel: np.ndarray, r: int, rng: np.random.Generator) -> list[int]:
    """Algorithm 1 of Chen, Epperly, Tropp & Webber (arXiv 2207.06503) on an explicit PSD matrix, in fp64."""
    n = kernel.shape[0]
    factor = np.zeros((n, r))
    diag = np.diag(kernel).copy()
    pivots = []
    for t in range(r):
        s = int(rng.choice(n, p=diag / diag.sum()))
        pivots.append(s)
        g = kernel[:, s] - factor[:, :t] @ factor[s, :t]
        factor[:, t] = g / np.sqrt(g[s])
        diag = np.clip(diag - factor[:, t] ** 2, 0.0, None)
    return pivots


def trace_error(kernel: np.ndarray, pivots: list[int]) -> float:
    """tr(K − K_{:,S} K_SS⁺ K_{S,:}): the trace-norm error of the Nyström approximation on the pivots."""
    cols = kernel[:, pivots]
    return float(np.trace(kernel - cols @ np.linalg.pinv(kernel[np.ix_(pivots, pivots)], rcond=1e-12) @ cols.T))


def clustered_features(seed: int = 0) -> torch.Tensor:
    """Six clusters of very unequal size and norm: exp(z zᵀ) has a decaying spectrum and a few heavy rows."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(6, D, generator=g)
    sizes = [60, 30, 15, 8, 4, 3]
    return torch.cat([c + 0.15 * torch.randn(s, D, generator=g) for c, s in zip(centres, sizes)]).double()


def torch_pivot_sets(z: torch.Tensor, r: int, trials: int, seed: int = 1) -> list[list[int]]:
    """`trials` independent draws in one batched call (one batch row per trial)."""
    batch = z.float()[None, None].expand(trials, 1, *z.shape).contiguous()
    u = torch.rand(trials, 1, r, generator=torch.Generator().manual_seed(seed))
    idx, ok = rpcholesky(batch, torch.ones(trials, 1, z.shape[0], dtype=torch.bool), r, u, 1e-5)
    assert ok.all()
    return [idx[i, 0].tolist() for i in range(trials)]


def test_expected_trace_error_matches_numpy_reference_and_beats_uniform() -> None:
    z = clustered_features()
    kernel = np.exp(z.numpy() @ z.numpy().T)
    rng = np.random.default_rng(0)
    reference = np.mean([trace_error(kernel, numpy_rpcholesky(kernel, R, rng)) for _ in range(TRIALS)])
    ours = np.mean([trace_error(kernel, s) for s in torch_pivot_sets(z, R, TRIALS)])
    uniform = np.mean([trace_error(kernel, list(rng.choice(N, R, replace=False))) for _ in range(TRIALS)])
    assert abs(ours / reference - 1) < 0.05, f"expected trace error {ours:.1f} vs numpy RPCholesky {reference:.1f}"
    assert ours < 0.5 * uniform, f"RPCholesky {ours:.1f} vs uniform sampling {uniform:.1f} at r={R}"


def test_first_pivot_is_drawn_proportionally_to_the_diagonal() -> None:
    """Step 1 draws s ∝ K_ss = e^{‖z_s‖²}: the empirical frequencies match the exact probabilities."""
    z = torch.tensor([[0.0], [1.0], [1.5], [0.5]], dtype=torch.float64)
    draws = torch.tensor([s[0] for s in torch_pivot_sets(z, 1, 20000)])
    freq = torch.bincount(draws, minlength=4).double() / 20000
    prob = torch.exp(z.squeeze(-1) ** 2)
    torch.testing.assert_close(freq, prob / prob.sum(), atol=0.012, rtol=0)


def test_pads_are_never_pivots_even_when_they_dominate() -> None:
    z = torch.randn(2, 2, 16, D, generator=torch.Generator().manual_seed(0))
    z[:, :, 10:] *= 20.0  # huge diagonal e^{‖z‖²} — but these are pads
    eligible = torch.ones(2, 2, 16, dtype=torch.bool)
    eligible[:, :, 10:] = False
    u = torch.rand(2, 2, 12, generator=torch.Generator().manual_seed(1))
    idx, ok = rpcholesky(z, eligible, 12, u, 1e-5)
    assert (idx[ok] < 10).all()
    assert (ok.sum(-1) <= 10).all(), "at most as many pivots as real tokens"
    for b in range(2):
        for h in range(2):
            picked = idx[b, h][ok[b, h]].tolist()
            assert len(picked) == len(set(picked)), "no token twice"


def test_duplicate_keys_give_one_pivot_and_rank_exhaustion_stops() -> None:
    """Near-duplicates: after one pivot the residual is roundoff-sized (≤ tol), so no further valid pivot."""
    z = 1.0 + 3e-4 * torch.randn(1, 1, 10, D, generator=torch.Generator().manual_seed(0))
    u = torch.rand(1, 1, 4, generator=torch.Generator().manual_seed(0))
    _, ok = rpcholesky(z, torch.ones(1, 1, 10, dtype=torch.bool), 4, u, 1e-5)
    assert ok.sum() == 1


def test_bins_draw_their_quota_within_each_bin() -> None:
    n, bins_n, r = 24, 3, 7
    z = torch.randn(2, 1, n, D, generator=torch.Generator().manual_seed(0))
    bins = (torch.arange(n) * bins_n // n).expand(2, 1, n)
    u = torch.rand(2, 1, r, generator=torch.Generator().manual_seed(1))
    idx, ok = rpcholesky(z, torch.ones(2, 1, n, dtype=torch.bool), r, u, 1e-5, bins, bins_n)
    assert ok.all()
    assert (bins.gather(-1, idx) == torch.arange(r) % bins_n).all(), "step t draws from bin t mod C"


def test_auto_temperature_is_the_official_rule_over_real_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 9, D, generator=g), torch.randn(1, 2, 9, D, generator=g) + 3.0
    q[..., 6:, :] *= 10.0  # pads with the longest queries and keys: they must not set τ
    k[..., 6:, :] *= 10.0
    mask = torch.ones(1, 1, 9, dtype=torch.bool)
    mask[..., 6:] = False
    z, kc = key_features(q, k, mask, "auto", center=True)
    real_k = k[..., :6, :] - k[..., :6, :].mean(-2, keepdim=True)
    torch.testing.assert_close(kc[..., :6, :], real_k)
    assert (kc[..., 6:, :] == 0).all()
    tau2 = RHO * real_k.norm(dim=-1).amax(-1) / q[..., :6, :].norm(dim=-1).amax(-1)
    torch.testing.assert_close(z[..., :6, :], real_k / tau2.sqrt()[..., None, None])
    z_fixed, _ = key_features(q, k, mask, 2.0, center=False)
    torch.testing.assert_close(z_fixed[..., :6, :], k[..., :6, :] / 2.0)


def test_selector_seeded_stream_eval_draws_and_global_rng() -> None:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 32, D, generator=g), torch.randn(2, 2, 32, D, generator=g)
    a, b = build_selector("rpcholesky", seed=3), build_selector("rpcholesky", seed=3)
    before = torch.get_rng_state()
    first, again = a(q, k, None, 6), b(q, k, None, 6)
    assert torch.equal(before, torch.get_rng_state()), "never the global RNG"
    assert torch.equal(first.indices, again.indices), "same seed, same draws"
    assert not torch.equal(first.indices, a(q, k, None, 6).indices), "the training stream advances"
    assert not torch.equal(first.indices, build_selector("rpcholesky", seed=4)(q, k, None, 6).indices)
    a.eval()
    assert torch.equal(a(q, k, None, 6).indices, a(q, k, None, 6).indices), "eval draws are fixed"
    k.requires_grad_(True)
    lm = a(q, k, None, 6)
    lm.keys.sum().backward()
    assert k.grad.abs().sum() > 0, "the landmarks' keys stay differentiable"


def test_bad_tau_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"selector.tau='hot': expected 'auto' or a positive number"):
        build_selector("rpcholesky", tau="hot")
    with pytest.raises(ValueError, match=r"selector.tau=-1.0"):
        build_selector("rpcholesky", tau=-1.0)
