"""`attn=nystrom selector.over=padded attn.pinv_init=original` is the reference code's Nyström attention.

The oracle below is written from the reference's formula (mlpen/Nystromformer@5689313
LRA/code/attention_nystrom.py:30-60), in float64 and independently of the module: q, k zeroed at pads and scaled by
d^(-1/4), landmarks the means of m fixed blocks of n/m positions of the padded sequence, kernel_1 and kernel_2
unmasked, kernel_3 with pad keys masked by -1e9, the 6-step iterative pseudo-inverse with the batch-wide init, plus
the depthwise conv of the zeroed V. Only real positions are compared: the encoder zeroes the attention's output at
pads (models/encoder.py) and nothing at a pad position reaches a real one, in either implementation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lra_bench.registry import build_attention, build_selector
from models.landmarks.base import gradient_d_major

B, H, N, D, M = 2, 2, 64, 8, 8
REAL = (23, 64)  # one padded sequence, one without padding
REFERENCE_KNOBS = {"pinv_init": "original"}  # with selector.over=padded


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.arange(N)[None, :] < torch.tensor(REAL)[:, None]
    return q, k, v, mask  # v is NOT zeroed at pads: the attention must not read it there


def conv_weight(kernel: int) -> torch.Tensor:
    """A fixed depthwise kernel `[H, 1, kernel, 1]`, different per head."""
    taps = torch.linspace(-1.0, 1.0, kernel, dtype=torch.float64)
    return torch.stack([torch.cos(3 * taps + h) for h in range(H)])[:, None, :, None]


def oracle(q, k, v, mask, m, conv=None, iterations=6):
    """The reference's forward, line by line, in float64."""
    b, h, n, d = q.shape
    keep = mask.to(torch.float64)
    Q = q * keep[:, None, :, None] / d**0.25
    K = k * keep[:, None, :, None] / d**0.25
    Q_l = Q.reshape(b, h, m, n // m, d).mean(dim=-2)
    K_l = K.reshape(b, h, m, n // m, d).mean(dim=-2)
    kernel_1 = torch.softmax(Q @ K_l.transpose(-1, -2), dim=-1)
    kernel_2 = torch.softmax(Q_l @ K_l.transpose(-1, -2), dim=-1)
    kernel_3 = torch.softmax(Q_l @ K.transpose(-1, -2) - 1e9 * (1 - keep[:, None, None, :]), dim=-1)
    eye = torch.eye(m, dtype=torch.float64)
    Z = kernel_2.transpose(-1, -2) / kernel_2.sum(dim=-2).max()  # init "original": one scalar for the whole batch
    for _ in range(iterations):
        KZ = kernel_2 @ Z
        Z = (0.25 * Z) @ (13 * eye - KZ @ (15 * eye - KZ @ (7 * eye - KZ)))
    X = (kernel_1 @ Z) @ (kernel_3 @ v)
    if conv is not None:
        X = X + F.conv2d(v * keep[:, None, :, None], conv, padding=(conv.shape[2] // 2, 0), groups=h)
    return X


def module(over: str, conv_kernel: int = 0, **knobs):
    sel = build_selector("segment_means", over=over)
    attn = build_attention(
        "nystrom", head_dim=D, num_heads=H, seq_len=N, selector=sel, num_landmarks=M, conv_kernel=conv_kernel, **knobs
    ).double()
    if conv_kernel:
        assert isinstance(attn.conv, torch.nn.Conv2d)
        with torch.no_grad():
            attn.conv.weight.copy_(conv_weight(conv_kernel))
    return attn.eval()


def real_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x * mask[:, None, :, None]


@pytest.mark.parametrize("conv_kernel", [0, 5])
def test_reference_knobs_equal_the_reference_formula_on_a_padded_batch(conv_kernel: int) -> None:
    q, k, v, mask = batch()
    conv = conv_weight(conv_kernel) if conv_kernel else None
    out = module("padded", conv_kernel, **REFERENCE_KNOBS)(q, k, v, mask)
    ref = oracle(q, k, v, mask, M, conv)
    assert torch.isfinite(out).all()
    diff = (real_rows(out, mask) - real_rows(ref, mask)).abs().max().item()
    assert diff < 1e-5, diff


def test_padded_landmarks_are_the_reference_block_means_and_all_valid() -> None:
    q, k, _, mask = batch()
    sel = build_selector("segment_means", over="padded")
    lm = sel(q, k, mask, M)
    keep = mask[:, None, :, None].double()
    assert torch.allclose(lm.queries, (q * keep).reshape(B, H, M, N // M, D).mean(-2), atol=1e-12)
    assert torch.allclose(lm.keys, (k * keep).reshape(B, H, M, N // M, D).mean(-2), atol=1e-12)
    assert lm.valid.all()  # including the all-pad blocks (23 real tokens: blocks 3..7 of sequence 0 hold only pads)
    assert (lm.queries[0, :, 3:] == 0).all()


def test_default_knobs_differ_on_the_padded_sequence_and_agree_without_padding() -> None:
    """The difference the knobs fix: ours averages segments of the real tokens and masks empty landmarks."""
    q, k, v, mask = batch()
    ref = oracle(q, k, v, mask, M)
    out = module("real")(q, k, v, mask)  # every other knob at its default (pinv_init=per_matrix)
    padded_seq = (out[0] - ref[0])[:, : REAL[0]].abs().max().item()
    full_seq = (out[1] - ref[1]).abs().max().item()
    assert padded_seq > 1e-2, padded_seq
    assert full_seq < 1e-4, full_seq
    # the landmarks alone make the difference: over=real with the reference's pinv init still differs
    out_init = module("real", pinv_init="original")(q, k, v, mask)
    assert (out_init[0] - ref[0])[:, : REAL[0]].abs().max().item() > 1e-2


def test_the_pinv_init_matters_too() -> None:
    """6 Newton–Schulz steps do not converge, so the init shows: the per-matrix one (our default) is not the
    reference's batch-wide one, even with the reference's landmarks."""
    q, k, v, mask = batch()
    ref = oracle(q, k, v, mask, M)
    out = module("padded")(q, k, v, mask)  # pinv_init=per_matrix
    assert (real_rows(out, mask) - real_rows(ref, mask)).abs().max().item() > 1e-4


def test_padded_ignores_pad_values_queries_and_keys() -> None:
    """What sits at a pad position (q, k or v) never reaches a real position's output."""
    q, k, v, mask = batch()
    attn = module("padded", 5, **REFERENCE_KNOBS)
    out = attn(q, k, v, mask)
    pads = ~mask[:, None, :, None]
    noise = [torch.where(pads, 100 * torch.randn_like(x), x) for x in (q, k, v)]
    moved = attn(*noise, mask)
    assert torch.allclose(real_rows(out, mask), real_rows(moved, mask), atol=1e-10)


@pytest.mark.parametrize("n", [64, 60])
def test_padded_landmarks_take_torchs_mean_and_its_gradient_bit_for_bit_sent_d_major(n: int) -> None:
    """The block means (`BlockMeans`) against torch's own reshape-and-mean on the zeroed (and, at n = 60, extended)
    sequence: the same means and the same gradient bit for bit, each gradient laid out as the Nyström kernels'
    gradient of the same tensor it is added to (the keys' D-major; the queries' D-major where the left kernel takes
    the short axis)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(B, H, n, D, generator=gen, requires_grad=True)
    mask = torch.arange(n)[None, None, :] < torch.tensor([23, n])[:, None, None]
    sel = build_selector("segment_means", over="padded")
    means = sel(x, x.detach(), mask[:, 0], M).queries
    upstream = torch.randn(means.shape, generator=gen)
    (grad,) = torch.autograd.grad(means, x, upstream)
    zeroed = F.pad(x * mask[..., None], (0, 0, 0, -n % M))
    expected = zeroed.reshape(B, H, M, -1, D).mean(-2)
    assert torch.equal(means, expected)
    assert torch.equal(grad, torch.autograd.grad(expected, x, upstream)[0])
    d_major = gradient_d_major("queries", M, x.device)  # where the left kernel's gradient of q is D-major
    assert (grad.stride()[-2:] == (1, n)) == d_major, "the gradient is in the layout of the left kernel's"
    (key_grad,) = torch.autograd.grad(sel(x.detach(), x, mask[:, 0], M).keys, x, upstream)
    assert key_grad.stride()[-2:] == (1, n), "the keys' gradient is D-major, as Q̃Kᵀ's"


def test_a_length_the_reference_cannot_run_is_extended_with_pads() -> None:
    """The reference's reshape needs m | n. At n = 60, m = 8 ours extends the sequence with 4 pad positions, so its
    landmarks are the reference's on that 64-long padded sequence (blocks of 8), and its real rows the reference's
    outputs there."""
    q, k, v, mask = batch()
    n = 60
    short = module("padded", **REFERENCE_KNOBS)
    out = short(q[:, :, :n], k[:, :, :n], v[:, :, :n], mask[:, :n])
    extended = mask.clone()
    extended[:, n:] = False
    expected = oracle(q, k, v, extended, M)[:, :, :n]
    assert torch.allclose(real_rows(out, mask[:, :n]), real_rows(expected, mask[:, :n]), atol=1e-5)
    with pytest.raises(ValueError, match=r"selector\.over='blocks'"):
        build_selector("segment_means", over="blocks")


def test_real_is_the_default_and_unchanged() -> None:
    q, k, v, mask = batch()
    sel = build_selector("segment_means")
    assert sel.over == "real"
    default = build_attention("nystrom", head_dim=D, num_heads=H, seq_len=N, selector=sel, num_landmarks=M).double()
    explicit = module("real", conv_kernel=35)
    explicit.load_state_dict(default.state_dict())
    assert torch.equal(default(q, k, v, mask), explicit(q, k, v, mask))
