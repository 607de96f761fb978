"""`models/attention/numerics.py` itself: the masked softmax, the fp32 core context and the pseudo-inverses, each
against torch's own dense computation (the robustness of every attention in hard cases is in
test_finite_outputs.py)."""

from __future__ import annotations

import pytest
import torch

from models.attention.numerics import (
    exact_pinv,
    fp32_core,
    iterative_pinv,
    masked_attention,
    masked_softmax,
    stable_pinv,
)


def test_masked_softmax_gives_masked_keys_exactly_zero_and_matches_softmax_on_the_rest() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 5, generator=g) * 10
    valid = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    got = masked_softmax(scores, valid)
    assert (got[~valid] == 0).all(), "a masked key got weight"
    for row in range(2):
        ref = torch.softmax(scores[row][valid[row]], dim=-1)
        torch.testing.assert_close(got[row][valid[row]], ref)
    assert (got[2] == 0).all() and torch.isfinite(got).all(), "an all-masked row must be zeros, not NaN"
    torch.testing.assert_close(masked_softmax(scores, None), torch.softmax(scores, -1))


def test_iterative_pinv_converges_to_the_inverse_and_per_matrix_init_decouples_the_batch() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(2, 8, 8, generator=g), dim=-1)  # a softmax core: rows sum to 1
    inv = torch.linalg.inv(a.double()).float()
    errors = [float((iterative_pinv(a, it) - inv).norm() / inv.norm()) for it in (2, 6, 20)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-4, errors
    scaled = torch.stack([a[0], 50 * a[1]])  # the second matrix's norms dominate a batch-wide init
    per_matrix = iterative_pinv(scaled, 6, "per_matrix")
    torch.testing.assert_close(per_matrix[0], iterative_pinv(a[:1], 6, "per_matrix")[0])
    original = iterative_pinv(scaled, 6, "original")
    assert not torch.allclose(original[0], iterative_pinv(a[:1], 6, "original")[0]), "original init is batch-wide"
    with pytest.raises(ValueError, match="pinv_init"):
        iterative_pinv(a, 6, "nope")


def test_pinvs_agree_with_torch_and_cut_what_they_say() -> None:
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    a = u @ torch.diag(torch.tensor([1.0, 0.5, 0.1, 1e-3, 1e-5, 1e-12], dtype=torch.float64)) @ u.T
    torch.testing.assert_close(exact_pinv(a), torch.linalg.pinv(a.float(), rtol=1e-4))  # fp32, cut at 1e-4·σ₁
    assert exact_pinv(a).dtype == torch.float32
    assert float(torch.linalg.svdvals(exact_pinv(a).double())[0]) == pytest.approx(1e3, rel=1e-2)  # 1e-5 cut
    stable = stable_pinv(a)  # fp64 in, fp64 out, rounding-level cut max(m, n)·eps·σ₁ ≈ 1.3e-15: keeps all six
    assert stable.dtype == torch.float64
    torch.testing.assert_close(stable, torch.linalg.pinv(a))
    single = stable_pinv(a.float())  # fp32: the cut ≈ 7e-7·σ₁ keeps 1e-5 and drops 1e-12
    assert single.dtype == torch.float32
    inverted = torch.linalg.svdvals(single.double())[:5]
    torch.testing.assert_close(
        inverted, torch.tensor([1e5, 1e3, 10.0, 2.0, 1.0], dtype=torch.float64), rtol=1e-2, atol=0
    )
    assert torch.linalg.svdvals(single.double())[5] < 1e-2, "the 1e-12 direction must be cut, not inverted to 1e12"


def test_fp32_core_computes_in_fp32_under_bf16_autocast() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
        with fp32_core(a.device):
            assert (a @ b).dtype == torch.float32


@pytest.mark.parametrize("all_rows_valid", [True, False])
def test_masked_softmax_is_the_masked_product_bit_for_bit(all_rows_valid: bool) -> None:
    """The CPU shortcut (no final multiply when every row has a valid key) changes no value and no gradient."""
    gen = torch.Generator().manual_seed(0)
    scores = (torch.randn(3, 2, 5, 7, generator=gen) * 4).requires_grad_(True)
    valid = torch.rand(3, 1, 1, 7, generator=gen) < 0.6
    valid[..., 0] = True
    if not all_rows_valid:
        valid[1] = False  # a sequence without a valid key: its rows must be zeros
    upstream = torch.randn(3, 2, 5, 7, generator=gen)
    got = masked_softmax(scores, valid)
    (grad,) = torch.autograd.grad(got, scores, upstream)
    reference = torch.softmax(scores.masked_fill(~valid, torch.finfo(scores.dtype).min), -1) * valid
    (ref_grad,) = torch.autograd.grad(reference, scores, upstream)
    assert torch.equal(got, reference) and torch.equal(grad, ref_grad)
    if not all_rows_valid:
        assert torch.equal(got[1], torch.zeros_like(got[1]))


@pytest.mark.parametrize("all_rows_valid", [True, False])
def test_masked_attention_is_the_masked_softmax_product_bit_for_bit(all_rows_valid: bool) -> None:
    """Zeroing a keyless query's output row instead of its weights changes no value and no gradient (scores and
    values), with a per-row mask as `local` builds it (some rows of a block with no key in their window)."""
    gen = torch.Generator().manual_seed(1)
    scores = (torch.randn(3, 2, 5, 7, generator=gen) * 4).requires_grad_(True)
    values = torch.randn(3, 2, 7, 4, generator=gen).requires_grad_(True)
    valid = torch.rand(3, 1, 5, 7, generator=gen) < 0.5
    valid[..., 0] = True
    if not all_rows_valid:
        valid[1, :, 2:] = False  # rows with no valid key: their outputs must be zeros
    upstream = torch.randn(3, 2, 5, 4, generator=gen)
    got = masked_attention(scores, valid, values)
    grads = torch.autograd.grad(got, (scores, values), upstream)
    reference = masked_softmax(scores, valid) @ values
    ref_grads = torch.autograd.grad(reference, (scores, values), upstream)
    assert torch.equal(got, reference) and all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
    if not all_rows_valid:
        assert torch.equal(got[1, :, 2:], torch.zeros_like(got[1, :, 2:])) and got[1, :, :2].abs().sum() > 0


@pytest.mark.parametrize("form", ["aᵀ b", "a bᵀ"])
def test_the_row_major_products_are_autograds_with_both_gradients_row_major(form: str) -> None:
    """`transposed_product` (aᵀ b) and `product_with_transposed` (a bᵀ): the forward is autograd's own product bit for
    bit, the gradients autograd's at fp32 rounding (fp64: gradcheck), and both come out row-major — where autograd's
    gradient of the transposed operand is a transposed view."""
    from models.attention.numerics import product_with_transposed, transposed_product

    ours = transposed_product if form == "aᵀ b" else product_with_transposed
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(2, 3, 50, 6, generator=gen, requires_grad=True)
    b = torch.randn(2, 3, 50 if form == "aᵀ b" else 7, 6 if form == "a bᵀ" else 5, generator=gen, requires_grad=True)
    theirs = a.transpose(-1, -2) @ b if form == "aᵀ b" else a @ b.transpose(-1, -2)
    out = ours(a, b)
    assert torch.equal(out, theirs)
    upstream = torch.randn(out.shape, generator=gen)
    got, want = torch.autograd.grad(out, (a, b), upstream), torch.autograd.grad(theirs, (a, b), upstream)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        assert g.is_contiguous(), "row-major"
    assert not all(w.is_contiguous() for w in want), "autograd sends one of them transposed"
    wide = [t.detach().double().requires_grad_() for t in (a, b)]
    assert torch.autograd.gradcheck(ours, tuple(wide))
