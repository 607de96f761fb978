"""Landmark selectors: shapes, masking, determinism, their own RNG, and each selector's defining property."""

from __future__ import annotations

import pytest
import torch

from lra_bench.registry import SELECTORS, build_selector
from models.landmarks.base import gather_tokens
from models.landmarks.leverage import ridge_leverage
from models.landmarks.pivoted_qr import greedy_pivots

SELECTOR_NAMES = SELECTORS.names()
TOKEN_SELECTORS = [n for n in SELECTOR_NAMES if SELECTORS.get(n).token_landmarks]
B, H, N, D, M = 2, 2, 24, 8, 6


def inputs(n: int = N, seed: int = 0, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(B, H, n, D, generator=g), scale * torch.randn(B, H, n, D, generator=g)


def padded_mask(n: int = N, real: int = 15) -> torch.Tensor:
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, real:] = False
    return mask


@pytest.mark.parametrize("name", SELECTOR_NAMES)
def test_shapes_validity_and_pads(name: str) -> None:
    sel = build_selector(name)
    q, k = inputs()
    mask = padded_mask()
    lm = sel(q, k, mask, M)
    assert lm.queries.shape == lm.keys.shape == (B, H, M, D)
    assert lm.valid.shape == (B, H, M) and lm.valid.dtype == torch.bool
    if name != "gpa":  # a shared codebook may leave a cluster without tokens of one sequence: that is allowed
        assert lm.valid.all(), "enough real tokens: every landmark is valid"
    assert lm.valid.any(-1).all()
    assert torch.isfinite(lm.queries).all() and torch.isfinite(lm.keys).all()
    if name in TOKEN_SELECTORS:
        assert lm.indices is not None and lm.indices.shape == (B, H, M)
        real = mask[:, None, :].expand(B, H, N).gather(-1, lm.indices)
        assert real[lm.valid].all(), "a landmark token is never a pad"
        for b in range(B):
            for h in range(H):
                assert len(set(lm.indices[b, h].tolist())) == M, "tokens drawn without replacement"
        assert torch.equal(lm.queries, gather_tokens(q, lm.indices))


@pytest.mark.parametrize("name", SELECTOR_NAMES)
def test_fewer_real_tokens_than_landmarks(name: str) -> None:
    sel = build_selector(name)
    q, k = inputs()
    mask = padded_mask(real=3)
    lm = sel(q, k, mask, M)
    assert int(lm.valid[1].sum(-1).max()) <= 3
    if name != "gpa":  # a codebook pooled over the batch may leave a cluster without tokens of sequence 0
        assert lm.valid[0].all()
    assert torch.isfinite(lm.queries).all() and torch.isfinite(lm.keys).all()


@pytest.mark.parametrize("name", SELECTOR_NAMES)
@pytest.mark.parametrize("training", [True, False])
def test_global_rng_untouched(name: str, training: bool) -> None:
    sel = build_selector(name).train(training)
    q, k = inputs()
    before = torch.get_rng_state()
    sel(q, k, padded_mask(), M)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("name", SELECTOR_NAMES)
def test_eval_landmarks_ignore_padding_and_batch_position(name: str) -> None:
    sel = build_selector(name).eval()
    q, k = inputs(n=16)
    extra_q, extra_k = inputs(n=8, seed=1)
    lm = sel(q, k, None, M)
    q_pad, k_pad = torch.cat([q, extra_q], dim=2), torch.cat([k, extra_k], dim=2)
    mask = torch.zeros(B, 24, dtype=torch.bool)
    mask[:, :16] = True
    lm_pad = sel(q_pad, k_pad, mask, M)
    torch.testing.assert_close(lm.queries, lm_pad.queries)
    torch.testing.assert_close(lm.keys, lm_pad.keys)
    assert torch.equal(lm.valid, lm_pad.valid)
    flipped = sel(q.flip(0), k.flip(0), None, M)
    torch.testing.assert_close(flipped.queries, lm.queries.flip(0))


@pytest.mark.parametrize("name", ["uniform", "kmeans_pp", "pivoted_qr", "leverage"])
def test_seeded_training_stream(name: str) -> None:
    q, k = inputs()
    a, b = build_selector(name, seed=3), build_selector(name, seed=3)
    first, again = a(q, k, None, M), b(q, k, None, M)
    assert torch.equal(first.indices, again.indices), "same seed, same draws"
    second = a(q, k, None, M)
    assert not torch.equal(first.indices, second.indices), "the training stream advances"
    other = build_selector(name, seed=4)(q, k, None, M)
    assert not torch.equal(first.indices, other.indices)
    a.eval()
    assert torch.equal(a(q, k, None, M).indices, a(q, k, None, M).indices), "eval draws are fixed"


def test_generator_state_checkpoints() -> None:
    q, k = inputs()
    sel = build_selector("uniform", seed=5)
    sel(q, k, None, M)
    state = sel.state_dict()
    expected = sel(q, k, None, M).indices
    restored = build_selector("uniform", seed=5)
    restored.load_state_dict(state)
    assert torch.equal(restored(q, k, None, M).indices, expected)


def test_hash_is_evenly_spaced() -> None:
    sel = build_selector("hash")
    q, k = inputs(n=16)
    assert sel(q, k, None, 4).indices[0, 0].tolist() == [2, 6, 10, 14]
    mask = torch.zeros(B, 16, dtype=torch.bool)
    mask[:, :8] = True
    assert sel(q, k, mask, 4).indices[0, 0].tolist() == [1, 3, 5, 7]


def blobs(n_per: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[10.0] + [0.0] * (D - 1), [0.0, 10.0] + [0.0] * (D - 2), [-10.0] + [0.0] * (D - 1)])
    pts = torch.cat([c + 0.1 * torch.randn(n_per, D, generator=g) for c in centres])
    perm = torch.randperm(pts.shape[0], generator=g)
    return pts[perm].expand(B, H, -1, -1).contiguous(), centres


@pytest.mark.parametrize("init", ["segment_means", "random", "kmeans++"])
@pytest.mark.parametrize("empty", ["farthest", "keep"])
def test_kmeans_recovers_blobs(init: str, empty: str) -> None:
    pts, centres = blobs()
    sel = build_selector("kmeans", init=init, empty=empty)
    lm = sel(pts, 2 * pts, None, 3)
    found = lm.queries[0, 0]
    assert lm.valid.all()
    dist = torch.cdist(found, centres).min(dim=0).values
    assert dist.max() < 0.5, f"every blob has a centroid nearby (init={init}, empty={empty})"
    torch.testing.assert_close(lm.keys, 2 * lm.queries), "key means over the same clusters"


def test_kmeans_centroids_are_differentiable() -> None:
    q, k = inputs()
    q.requires_grad_(True)
    k.requires_grad_(True)
    lm = build_selector("kmeans")(q, k, padded_mask(), M)
    (lm.queries.sum() + lm.keys.sum()).backward()
    for t in (q, k):
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["kmeans", "kmeans_pp", "gpa"])
def test_duplicate_tokens_give_one_cluster(name: str) -> None:
    q = torch.ones(B, H, N, D)
    lm = build_selector(name)(q, q, None, M)
    assert int(lm.valid[0, 0].sum()) == 1
    assert torch.isfinite(lm.queries).all()


def test_pivoted_qr_takes_every_column_when_asked() -> None:
    q, _ = inputs(n=12, scale=2.0)  # k = q: a diagonally dominant, well-conditioned A
    sel = build_selector("pivoted_qr", tol=0.0, sketch_rows=12)
    lm = sel(q, q, None, 12)
    assert lm.valid.all()
    assert sorted(lm.indices[0, 0].tolist()) == list(range(12))


def test_pivoted_qr_first_pivot_is_largest_column_and_stops_at_rank() -> None:
    q, k = inputs(n=12, scale=2.0)
    a = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
    lm = build_selector("pivoted_qr", tol=0.0, sketch_rows=12)(q, k, None, 4)
    assert torch.equal(lm.indices[..., 0], a.norm(dim=-2).argmax(-1))
    # keys with only 3 distinct values: A has 3 distinct columns, so at most 3 pivots are useful
    k3 = k[:, :, :3].repeat(1, 1, 4, 1)
    lm3 = build_selector("pivoted_qr", tol=1e-4, sketch_rows=12)(q, k3, None, 6)
    assert int(lm3.valid.sum(-1).max()) <= 3


def test_greedy_pivots_never_pick_pads() -> None:
    a = torch.rand(1, 1, 5, 8)
    a[..., 6:] = 10.0  # huge columns — but they are pads
    mask = torch.ones(1, 1, 8, dtype=torch.bool)
    mask[..., 6:] = False
    idx, valid = greedy_pivots(a * mask[..., None, :], mask, 4, 0.0)
    assert (idx[valid] < 6).all()


def test_ridge_leverage_matches_definition() -> None:
    a = torch.rand(1, 1, 5, 9, dtype=torch.float64)
    ridge, m = 0.3, 4
    lam = ridge * (a[0, 0] ** 2).sum() / m
    mat = a[0, 0]
    expected = torch.diagonal(mat.T @ torch.linalg.inv(mat @ mat.T + lam * torch.eye(5, dtype=mat.dtype)) @ mat)
    torch.testing.assert_close(ridge_leverage(a, ridge, m)[0, 0], expected)
