"""`attn=local`: exact softmax inside a band of w tokens on each side, computed in blocks.

Checked against an fp64 numpy oracle (dense scores with the band and padding masks), against `full` when the window
holds the sequence, through its implied matrix, causally, and for its memory: no intermediate tensor of the blocked
path may be n × n.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lra_bench.registry import build_attention
from models.attention.local import MIN_BLOCK, LocalAttention, LocalConfig


def qkv(b: int = 2, h: int = 2, n: int = 45, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def padding(b: int, n: int, lengths: list[int]) -> torch.Tensor:
    mask = torch.zeros(b, n, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    return mask


def oracle(q, k, v, mask, window: int, causal: bool = False) -> np.ndarray:
    """Dense fp64 softmax with keys outside |i − j| ≤ w (and j > i when causal) or padded set to −inf."""
    q, k, v = (x.numpy() for x in (q, k, v))
    n = q.shape[-2]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = np.abs(i - j) <= window
    if causal:
        allowed &= j <= i
    keys = allowed[None, None] & (np.ones((q.shape[0], n), bool) if mask is None else mask.numpy())[:, None, None, :]
    scores = np.where(keys, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -np.inf)
    with np.errstate(invalid="ignore"):  # a padded query may see no real key: NaN there, never compared
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        return (weights / weights.sum(-1, keepdims=True)) @ v


def local(n: int, window: int) -> LocalAttention:
    return build_attention("local", head_dim=8, num_heads=2, seq_len=n, window=window)


@pytest.mark.parametrize("window", [1, 3, MIN_BLOCK - 1, MIN_BLOCK, 40])
@pytest.mark.parametrize("lengths", [[45, 45], [45, 17]], ids=["no-pad", "pad"])
def test_equals_the_band_masked_oracle(window: int, lengths: list[int]) -> None:
    q, k, v = qkv()
    mask = padding(2, 45, lengths)
    out = local(45, window)(q, k, v, mask).numpy()
    ref = oracle(q, k, v, mask, window)
    for row, length in enumerate(lengths):  # padded queries are the wrapper's to zero; real ones must match
        np.testing.assert_allclose(out[row, :, :length], ref[row, :, :length], rtol=0, atol=1e-12)


@pytest.mark.parametrize("window", [2, 37])
def test_causal_equals_the_oracle(window: int) -> None:
    q, k, v = qkv(n=70)
    mask = padding(2, 70, [70, 51])
    attention = local(70, window)
    attention.set_causal(True)
    out = attention(q, k, v, mask).numpy()
    ref = oracle(q, k, v, mask, window, causal=True)
    np.testing.assert_allclose(out[0], ref[0], atol=1e-12)
    np.testing.assert_allclose(out[1, :, :51], ref[1, :, :51], atol=1e-12)


@pytest.mark.parametrize("window", [44, 45, 200], ids=["w=n-1 (blocked)", "w=n", "w>n"])
def test_a_window_that_holds_the_sequence_is_full_attention(window: int) -> None:
    q, k, v = qkv()
    mask = padding(2, 45, [45, 30])
    full = build_attention("full", head_dim=8, num_heads=2, seq_len=45)
    out, ref = local(45, window)(q, k, v, mask), full(q, k, v, mask)
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(out[1, :, :30], ref[1, :, :30], rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_the_implied_matrix_is_the_operator_applied(causal: bool) -> None:
    q, k, v = qkv(n=50)
    mask = padding(2, 50, [50, 33])
    attention = local(50, 5)
    attention.set_causal(causal)
    implied = attention.implied_matrix(q, k, mask)
    real = mask[:, None, :, None]
    torch.testing.assert_close(implied @ v * real, attention(q, k, v, mask) * real, rtol=0, atol=1e-12)
    i, j = torch.meshgrid(torch.arange(50), torch.arange(50), indexing="ij")
    assert not implied[..., (i - j).abs() > 5].any()  # nothing outside the band
    assert not implied[1][..., 33:].any() and not implied[1][:, 33:].any()  # nor at pads


class LargestTensor(TorchDispatchMode):
    """The most elements any operator output had while the mode was active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_grows_like_n_squared() -> None:
    """Forward and backward at n = 2048, w = 8: every intermediate is O(n·(block + 2w)), far below n²."""
    n, window = 2048, 8
    q, k, v = (x.float().requires_grad_() for x in qkv(b=1, h=1, n=n))
    mask = padding(1, n, [n - 100])
    with LargestTensor() as probe:
        local(n, window)(q, k, v, mask).sum().backward()
    assert probe.largest <= n * (MIN_BLOCK + 2 * window) + 2 * window * 8 + MIN_BLOCK * 8 * 2
    assert probe.largest < n * n / 16


def test_cost_hooks_follow_the_window() -> None:
    narrow, wide = ({"window": w} for w in (8, 128))
    assert LocalAttention.flops(4096, None, 32, narrow).forward < LocalAttention.flops(4096, None, 32, wide).forward
    assert LocalAttention.flops(4096, None, 32, narrow).forward == 4.0 * 4096 * 17 * 32
    full_n = LocalAttention.flops(64, None, 32, {"window": 500}).forward
    assert full_n == 4.0 * 64 * 64 * 32  # never more keys than the sequence has
    for mode in ("forward", "forward_backward"):
        assert LocalAttention.memory(4096, None, 32, mode, narrow) < LocalAttention.memory(4096, None, 32, mode, wide)


@pytest.mark.parametrize("window", [0, -3, True, 2.5])
def test_a_window_that_is_not_a_positive_integer_is_refused(window) -> None:
    with pytest.raises(ValueError, match=r"attn.window=.*: must be a positive integer"):
        LocalAttention(head_dim=8, num_heads=2, seq_len=16, cfg=LocalConfig(window=window))


@pytest.mark.parametrize("case", ["one_real_token", "bf16_autocast", "large_norm"])
def test_the_blocked_path_stays_finite(case: str) -> None:
    """The edge cases of `tests/test_finite_outputs.py` on the blocked path (its n = 16 is inside the default
    window, so there `local` runs as SDPA)."""
    q, k, v = (x.float() * (100 if case == "large_norm" and i < 2 else 1) for i, x in enumerate(qkv(n=70)))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    mask = padding(2, 70, [70, 1 if case == "one_real_token" else 70])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "bf16_autocast"):
        out = local(70, 3)(q, k, v * mask[:, None, :, None], mask)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(x.grad).all() for x in (q, k, v))
