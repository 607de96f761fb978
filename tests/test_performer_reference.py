"""Performer in the Nyströmformer reference's mode (mlpen/Nystromformer@5689313 LRA/code/attention_performer.py,
performer_pytorch's FastAttention/softmax_kernel) against an oracle written from those formulas in float64, its
large-M limit, the shared never-redrawn projection, and the defaults left as they were."""

from __future__ import annotations

import math

import pytest
import torch

from lra_bench.registry import build_attention

B, H, N, D, M = 2, 2, 12, 8, 16
REAL = 7  # sequence 1 has 5 pads
REFERENCE = {"logit_scale": "d", "pad_keys": "zero_logit", "shared_heads": True, "feature_eps": 1e-4, "redraw_every": 0}


def make(num_features: int = M, seed: int = 0, **kw):
    return build_attention("performer", head_dim=D, num_heads=H, seq_len=N, num_features=num_features, seed=seed, **kw)


def inputs(seed: int = 0, scale: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    q, k = (scale * torch.randn(B, H, N, D, generator=g) for _ in range(2))
    v = torch.randn(B, H, N, D, generator=g)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, REAL:] = False
    return q, k, v, mask


def oracle(q, k, v, mask, w, eps=1e-4):
    """The reference's forward, one (batch, head) and one query at a time, in float64 with explicit sums.

    Wrapper: Q/d^¼, K/d^¼·mask, V·mask. softmax_kernel: x = d^-¼·input, φ_m(x) = M^-½ (exp(x·w_m − ‖x‖²/2 − s) + ε),
    s = max_m x·w_m for a query, max over keys j and m of k_j·w_m for the keys. linear_attention: out_i =
    Σ_j (φ(q_i)·φ(k_j)) v_j / Σ_j φ(q_i)·φ(k_j)."""
    q, k, v, w = q.double(), k.double(), v.double(), w.double()
    d, m = q.shape[-1], w.shape[0]
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            keep = [float(mask[b, j]) for j in range(q.shape[2])]
            ks = [k[b, h, j] / d**0.25 * keep[j] * d**-0.25 for j in range(len(keep))]
            vs = [v[b, h, j] * keep[j] for j in range(len(keep))]
            k_proj = [[float(torch.dot(x, w[r])) for r in range(m)] for x in ks]
            s_k = max(max(row) for row in k_proj)
            phi_k = [
                [m**-0.5 * (math.exp(p[r] - float(torch.dot(x, x)) / 2 - s_k) + eps) for r in range(m)]
                for x, p in zip(ks, k_proj)
            ]
            for i in range(q.shape[2]):
                x = q[b, h, i] / d**0.25 * d**-0.25
                p = [float(torch.dot(x, w[r])) for r in range(m)]
                s_q = max(p)
                phi_q = [m**-0.5 * (math.exp(p[r] - float(torch.dot(x, x)) / 2 - s_q) + eps) for r in range(m)]
                num, den = torch.zeros(d, dtype=torch.float64), 0.0
                for j in range(len(ks)):
                    kern = sum(phi_q[r] * phi_k[j][r] for r in range(m))
                    num += kern * vs[j]
                    den += kern
                out[b, h, i] = num / den
    return out


def test_reference_mode_matches_the_oracle() -> None:
    module = make(**REFERENCE).eval()
    q, k, v, mask = inputs()
    with torch.no_grad():
        out = module(q, k, v, mask)  # v not masked: the reference's wrapper zeroes pad values itself
    want = oracle(q, k, v, mask, module.projection)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5)
    # the test can tell: without ε, or with q·k/√d, the answer is far outside the tolerance
    assert (oracle(q, k, v, mask, module.projection, eps=0.0) - want).abs().max() > 1e-3
    sqrt_d = make(**{**REFERENCE, "logit_scale": "sqrt_d"}).eval()
    with torch.no_grad():
        assert (sqrt_d(q, k, v, mask).double() - want).abs().max() > 1e-2


def test_reference_implied_matrix_is_the_operator_applied() -> None:
    module = make(**REFERENCE).eval()
    q, k, v, mask = inputs(seed=1)
    with torch.no_grad():
        mat = module.implied_matrix(q, k, mask)
        out = module(q, k, v, mask)
    assert (mat[1, :, REAL:] == 0).all() and (mat[1, :, :, REAL:] == 0).all(), "pad rows and columns are zero"
    real = mask[:, None, :, None]
    vm = v * real
    torch.testing.assert_close((mat @ vm) * real, out * real, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close((mat @ v) * real, out * real, rtol=1e-4, atol=1e-5)  # pad columns are zero
    rows = mat.sum(-1)
    assert torch.allclose(rows[0], torch.ones_like(rows[0]), atol=1e-5), "no pads: rows are normalised"
    assert (rows[1, :, :REAL] < 1 - 1e-3).all(), "the pad keys' share of the normaliser is missing"


def zero_logit_softmax(q, k, v, mask, scale):
    """Exact softmax(q·k·scale) with pad keys as zero vectors (logit 0) and pad values zeroed."""
    keep = mask[:, None, :, None].double()
    scores = (q.double() @ (k.double() * keep).transpose(-1, -2)) * scale
    return torch.softmax(scores, -1) @ (v.double() * keep)


def masked_softmax(q, k, v, mask, scale):
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_reference_mode_estimates_softmax_over_d_with_zero_logit_pads() -> None:
    """With many features the reference's Performer approaches softmax(QKᵀ/d) with pad keys as logit-0 keys, not the
    masked softmax(QKᵀ/√d). Orthogonal blocks from an unsigned QR (performer_pytorch's default, qr_uniform_q=False,
    and `gaussian_features`) are not Haar-distributed, which leaves a bias of about 3% here at d = 8; i.i.d. rows
    converge all the way."""
    q, k, v, mask = inputs(seed=2, scale=0.5)
    real = mask[:, None, :, None]
    target = zero_logit_softmax(q, k, v, mask, 1 / D)
    standard = masked_softmax(q, k, v, mask, 1 / math.sqrt(D))
    module = make(num_features=4096, seed=3, **REFERENCE).eval()
    iid = make(num_features=16384, seed=3, **REFERENCE, orthogonal=False).eval()
    with torch.no_grad():
        out, out_iid = module(q, k, v, mask).double(), iid(q, k, v, mask).double()
    assert rel(out, target) < 0.05
    assert rel(out_iid, target) < 0.015
    assert rel(out * real, standard * real) > 0.25
    assert rel(out_iid * real, standard * real) > 0.25


def test_shared_projection_is_one_matrix_never_redrawn() -> None:
    module = make(**REFERENCE)
    assert module.projection.shape == (M, D)
    first = module.projection.clone()
    q, k, v, mask = inputs()
    same = [t[:, :1].expand_as(t).contiguous() for t in (q, k, v)]  # both heads see the same q, k, v
    module.train()
    for _ in range(25):
        out = module(*same, mask)
    assert torch.equal(module.projection, first), "redraw_every=0 never redraws"
    assert int(module.passes) == 25
    assert torch.equal(out[:, 0], out[:, 1]), "both heads use the same projection"
    per_head = make(**{**REFERENCE, "shared_heads": False})
    assert per_head.projection.shape == (H, M, D)
    with torch.no_grad():
        out_per_head = per_head(*same, mask)
    assert not torch.allclose(out_per_head[:, 0], out_per_head[:, 1])
    clone = make(**REFERENCE, seed=9)
    clone.load_state_dict(module.state_dict())
    assert torch.equal(clone.projection, first), "the shared projection checkpoints"


def test_shared_projection_redraws_on_schedule() -> None:
    module = make(**{**REFERENCE, "redraw_every": 2}).train()
    q, k, v, mask = inputs()
    first = module.projection.clone()
    module(q, k, v, mask)
    assert torch.equal(module.projection, first)
    module(q, k, v, mask)
    assert module.projection.shape == (M, D) and not torch.equal(module.projection, first)


def todays_formula(module, q, k, v, mask):
    """The Performer forward before the reference knobs existed (per-head W, logits q·k/√d, pads φ = 0)."""
    w = module.projection.float().unsqueeze(0)
    scale = q.shape[-1] ** -0.25
    qf, kf = q.float() * scale, k.float() * scale
    wq, wk = qf @ w.transpose(-1, -2), kf @ w.transpose(-1, -2)
    wq = wq - (qf * qf).sum(-1, keepdim=True) / 2
    wk = wk - (kf * kf).sum(-1, keepdim=True) / 2
    if mask is not None:
        wk = wk.masked_fill(~mask[:, None, :, None], float("-inf"))
    q_shift = wq.amax(-1, keepdim=True).detach()
    k_shift = wk.amax((-2, -1), keepdim=True).detach().nan_to_num(0.0, neginf=0.0)
    phi_q, phi_k = torch.exp(wq - q_shift), torch.exp(wk - k_shift)
    ones = torch.ones_like(v[..., :1], dtype=torch.float32)
    both = phi_q @ (phi_k.transpose(-1, -2) @ torch.cat([v.float(), ones], dim=-1))
    return (both[..., :-1] / both[..., -1:].clamp_min(1e-30)).to(v.dtype)


@pytest.mark.parametrize("padded", [False, True])
def test_defaults_compute_the_formula_from_before(padded: bool) -> None:
    """The features through `ShiftedExp` (three memory passes instead of about five) against autograd on the
    formula as it was written before: values and gradients at fp32 rounding (the shift is added to ‖x‖²/2 before
    it is subtracted, not after)."""
    module = make().eval()
    assert module.projection.shape == (H, M, D)
    q, k, v, mask = inputs(seed=4)
    mask = mask if padded else None
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    ours, before = module(q, k, v, mask), todays_formula(module, q, k, v, mask)
    torch.testing.assert_close(ours, before, rtol=1e-5, atol=1e-6)
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(5))
    for got, want in zip(
        torch.autograd.grad(ours, (q, k, v), upstream), torch.autograd.grad(before, (q, k, v), upstream)
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("knob", "value"), [("logit_scale", "sqrt"), ("pad_keys", "zero"), ("feature_eps", -1e-4)])
def test_bad_knob_values_are_refused(knob: str, value: object) -> None:
    with pytest.raises(ValueError, match=knob):
        make(**{knob: value})
