"""Performer's blocked core (`models/kernels/performer_core.cpp`) against the eager chain it replaces where the
encoder's chain is compiled: both modes (this harness's and the Nyströmformer reference's), values and the three
gradients in fp64 and fp32, a key shift that rises from block to block (the online maximum), a sequence of pads only,
any thread count, gradcheck, the whole attention on both paths, and the encoder choosing it exactly where
`model.kernels` compiles the chain."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from models.kernels import load, performer_core
from tests.kernel_paths import compiled_in_encoder, on_both_paths, on_one_and_two_threads

pytestmark = pytest.mark.skipif(load("performer_core") is None, reason="the compiled kernel cannot be built here")

HARNESS: dict[str, Any] = {}
REFERENCE = dict(feature_eps=1e-4, pad_keys="zero_logit", shared_heads=True, logit_scale="d")


def performer(n: int, **knobs: Any) -> Any:
    """A Performer of 2 heads of 8 with 37 features (no multiple of a vector) for n tokens."""
    from lra_bench.registry import build_attention

    return build_attention("performer", head_dim=8, num_heads=2, seq_len=n, num_features=37, **knobs)


def case(n: int, dtype: torch.dtype, rising: bool = False, lengths: tuple[int, ...] = (0, 30)) -> list[torch.Tensor]:
    """q, k, v `[3, 2, n, 8]` and the key mask `[3, n]`: the second sequence's last `lengths[1]` tokens are pads, the
    third's all of them when `lengths[0]` is 0. `rising` scales the keys up along the sequence, so that every block of
    64 keys raises the running shift the blocked summary keeps."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, 2, n, 8, generator=gen, dtype=dtype) for _ in range(3))
    if rising:
        k = k * torch.linspace(0.2, 3.0, n, dtype=dtype).view(1, 1, n, 1)
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, n - lengths[1] :] = False
    mask[2, lengths[0] :] = False
    return [q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), mask]


def outputs_and_grads(attention: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> list:
    """The attention's output on the valid queries and the gradients of q, k and v under a fixed upstream gradient."""
    out = attention(q, k, v, mask) * mask[:, None, :, None]
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(6))
    return [out, *torch.autograd.grad(out, (q, k, v), upstream)]


def on_paths(attention: Any, inputs: list[torch.Tensor]) -> tuple[list, list]:
    """`outputs_and_grads` with the attention's `compiled` set, then not."""
    results = []
    for compiled in (True, False):
        attention.compiled = compiled
        results.append(outputs_and_grads(attention, *inputs))
    return results[0], results[1]


def favor_formula(
    qf: torch.Tensor, kf: torch.Tensor, values: torch.Tensor, w: torch.Tensor, valid: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """φ(Q)(φ(K)ᵀ[V | 1]) written out as the docstring of `PerformerAttention` states it, in the inputs' dtype (the
    attention itself computes in fp32): detached shifts from the row maxima of x·Wᵀ (less ‖x‖²/2 without ε), the keys'
    over the valid keys, dropped keys' features 0."""
    wt = w if w.dim() == 2 else w.unsqueeze(0)
    proj_q, proj_k = qf @ wt.transpose(-1, -2), kf @ wt.transpose(-1, -2)
    half_q, half_k = (qf * qf).sum(-1, keepdim=True) / 2, (kf * kf).sum(-1, keepdim=True) / 2
    with torch.no_grad():
        stat_q, stat_k = proj_q.amax(-1, keepdim=True), proj_k.amax(-1, keepdim=True)
        if not eps:
            stat_q, stat_k = stat_q - half_q, stat_k - half_k
        if valid is not None:
            stat_k = stat_k.masked_fill(~valid[:, None, :, None], float("-inf"))
        shift_k = stat_k.amax(-2, keepdim=True).nan_to_num(0.0, neginf=0.0)
    phi_q = torch.exp(proj_q - (half_q + stat_q)) + eps
    phi_k = torch.exp(proj_k - (half_k + shift_k)) + eps
    if valid is not None:
        phi_k = phi_k * valid[:, None, :, None]
    return phi_q @ (phi_k.transpose(-1, -2) @ values)


@pytest.mark.parametrize("eps, shared, dropped", [(0.0, False, True), (1e-4, True, False), (1e-4, False, True)])
@pytest.mark.parametrize("rising", [False, True], ids=["steady", "rising-shift"])
def test_the_blocked_core_is_the_formula_in_fp64(eps: float, shared: bool, dropped: bool, rising: bool) -> None:
    """`BlockedFavor`'s output and the gradients of q, k and [V | 1] the formula's to 1e-12 (relative to each tensor's
    largest entry) in fp64, over 200 tokens (four blocks, the last partial), with dropped keys in one sequence and a
    sequence of dropped keys only, W per head and shared."""
    q, k, v, mask = case(200, torch.float64, rising)
    values = torch.cat([v.detach(), torch.ones_like(v[..., :1])], -1).requires_grad_()
    w = torch.randn(1 if shared else 2, 37, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    w = w[0] if shared else w
    valid = mask if dropped else None
    upstream = torch.randn(3, 2, 200, 9, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    results = []
    for favor in (performer_core.blocked_favor, favor_formula):
        out = favor(0.5 * q, 0.5 * k, values, w, valid, eps) * mask[:, None, :, None]
        results.append([out, *torch.autograd.grad(out, (q, k, values), upstream)])
    for got, want in zip(*results, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12 * max(1.0, float(want.detach().abs().max())))


@pytest.mark.parametrize("knobs", [HARNESS, REFERENCE], ids=["harness", "reference"])
def test_the_blocked_core_is_the_eager_chain_at_fp32_rounding(knobs: dict[str, Any]) -> None:
    """The whole attention on both paths (its core is fp32), with the keys' shift rising from block to block, pads in
    one sequence and a sequence of pads only: output and the gradients of q, k and v within 1e-5 of the eager
    chain's."""
    attention = performer(200, **knobs)
    compiled, eager = on_paths(attention, case(200, torch.float32, rising=True))
    for got, want in zip(compiled, eager, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(want.detach().abs().max())))


def test_the_blocked_core_does_not_depend_on_the_thread_count() -> None:
    """Each (batch, head) is summed in one order by one thread: 1 and 2 threads give the same bits."""
    attention = performer(150)
    attention.compiled = True
    inputs = case(150, torch.float32, rising=True)
    one, two = on_one_and_two_threads(lambda: outputs_and_grads(attention, *inputs))
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


@pytest.mark.parametrize("valid", [False, True], ids=["all-keys", "dropped-keys"])
def test_the_blocked_core_passes_gradcheck(valid: bool) -> None:
    """The autograd Function's backward is its forward's derivative (fp64, 70 tokens: two blocks), with and without
    dropped keys. Checked on the attention's normalised output without ε, where the detached shifts cancel: with ε, or
    on the unnormalised product, a finite difference also moves the shifts, which by design carry no gradient."""
    gen = torch.Generator().manual_seed(8)
    qf, kf = (0.5 * torch.randn(1, 2, 70, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, 70, 4, generator=gen, dtype=torch.float64)
    w = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64)
    keys = torch.arange(70).unsqueeze(0) < 50 if valid else None

    def attention(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        both = performer_core.blocked_favor(a, b, torch.cat([c, torch.ones_like(c[..., :1])], -1), w, keys, 0.0)
        return both[..., :-1] / both[..., -1:]

    assert torch.autograd.gradcheck(attention, tuple(t.requires_grad_() for t in (qf, kf, v)))


def test_performer_computes_the_same_attention_on_both_paths() -> None:
    """Through the shared helper: the node `BlockedFavor` exactly on the compiled path, the results at fp32
    rounding."""
    compiled, eager = on_both_paths(performer(50), 50, "BlockedFavor")
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(want.detach().abs().max())))


def test_the_encoder_computes_performer_blocked_exactly_where_its_chain_is_compiled() -> None:
    """`model.kernels` says how the whole network computes: the compiled chain (auto, fused) takes the blocked core,
    the eager chain keeps the features and autograd's products."""

    def make(layer: int, n: int) -> Any:
        return performer(n)

    assert compiled_in_encoder("fused", make, "BlockedFavor") and compiled_in_encoder("auto", make, "BlockedFavor")
    assert not compiled_in_encoder("eager", make, "BlockedFavor")
