"""Memory layouts chosen for speed compute what the plain layout computes.

The short-axis layouts (`models/cpu.py`): with fewer landmarks or centroids than a CPU vector register holds, the
landmark weights and the k-means assignment are computed with that axis second to last; each must give what the
usual layout and an fp64 oracle give (values, exact zeros, gradients, the chosen centroid). The head-major q, k, v
of `MultiHeadAttention.project` must change no bit of any attention's training step."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import models.cpu
from lra_bench.bench.step import faithful_network, protocol_config, random_batch
from lra_bench.registry import ATTENTIONS
from models.attention.numerics import landmark_weights
from models.cpu import below_vector_width
from models.encoder import MultiHeadAttention
from models.landmarks.kmeans import assign


@pytest.fixture(params=["short_axis", "row"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Force one layout whatever this CPU is: every capability counts as very wide, or none is known."""
    lanes = {torch.backends.cpu.get_cpu_capability(): 1 << 20} if request.param == "short_axis" else {}
    monkeypatch.setattr(models.cpu, "CPU_FP32_LANES", lanes)
    return str(request.param)


def test_the_choice_follows_the_register_width_and_stays_off_other_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert below_vector_width(11, torch.device("cpu")) and not below_vector_width(16, torch.device("cpu"))
    assert not below_vector_width(11, torch.device("cuda")), "a layout measured on a CPU must not reach a GPU"
    for unmeasured in ("AVX2", "DEFAULT", "SOMETHING_NEW"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda name=unmeasured: name)
        assert not below_vector_width(2, torch.device("cpu")), f"{unmeasured}: an unmeasured CPU keeps the layout"


def test_landmark_weights_match_an_fp64_masked_softmax_with_gradients(layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 40, 8, generator=g, requires_grad=True)
    keys = torch.randn(2, 3, 11, 8, generator=g, requires_grad=True)
    valid = torch.rand(2, 3, 11, generator=g) > 0.3
    valid[0, 1] = False  # a sequence/head without any valid landmark: zeros, not NaN
    weights = landmark_weights(q, keys, valid)
    assert weights.shape == (2, 3, 40, 11)
    assert weights.is_contiguous() == (layout == "row"), "the forced layout was not the one computed"
    scores = (q.double() @ keys.double().transpose(-1, -2)).masked_fill(~valid[..., None, :], float("-inf"))
    oracle = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    torch.testing.assert_close(weights.double(), oracle, rtol=1e-5, atol=1e-6)
    assert (weights.masked_select(~valid[..., None, :].expand_as(weights)) == 0).all(), "an invalid landmark got weight"
    probe = torch.randn(weights.shape, generator=g)
    grads = torch.autograd.grad((weights * probe).sum(), (q, keys))
    q64, k64 = q.detach().double().requires_grad_(), keys.detach().double().requires_grad_()
    scores = (q64 @ k64.transpose(-1, -2)).masked_fill(~valid[..., None, :], float("-inf"))
    ref = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    ref_grads = torch.autograd.grad((ref * probe.double()).sum(), (q64, k64))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_assign_picks_the_nearest_valid_centroid_as_an_fp64_oracle_does(layout: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, 8, generator=g)
    c = torch.randn(1, 3, 11, 8, generator=g) * 1.5
    c_valid = torch.rand(1, 3, 11, generator=g) > 0.25
    idx, dist = assign(x, c, c_valid)
    d64 = ((x.double()[..., :, None, :] - c.double()[..., None, :, :]) ** 2).sum(-1)  # [2, 3, 64, 11]
    d64 = d64.masked_fill(~c_valid[..., None, :], float("inf"))
    want_dist, want_idx = d64.min(dim=-1)
    assert torch.equal(idx, want_idx), "a point went to another centroid than the nearest valid one"
    torch.testing.assert_close(dist.double(), want_dist, rtol=1e-4, atol=1e-4)
    assert c_valid.expand(2, 3, 11).gather(-1, idx).all(), "a point was assigned to an invalid centroid"


def _token_major_project(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The projection as it was before it copied into head-major memory: q, k, v as strided views."""
    b, n, _ = x.shape
    return self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


@pytest.mark.parametrize("attn", sorted(ATTENTIONS.names()))
def test_head_major_projection_changes_no_bit_of_any_attentions_training_step(
    attn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`MultiHeadAttention.project` copies q, k, v into head-major memory for speed; the faithful network's loss
    and every gradient must equal, bit for bit, what the token-major views gave (a run resumed across the change
    continues the same numbers)."""
    cfg = protocol_config("listops", attn, "nystromformer", ["task.seq_len=128", "task.gen_min_length=40"])
    results = []
    for project in (MultiHeadAttention.project, _token_major_project):
        monkeypatch.setattr(MultiHeadAttention, "project", project)
        torch.manual_seed(0)
        model = faithful_network(cfg).train()
        batch = random_batch(cfg, 3, torch.Generator().manual_seed(0))
        torch.manual_seed(1)  # the same dropout masks
        loss = torch.nn.functional.cross_entropy(model(batch), batch["label"])
        loss.backward()
        results.append([loss.detach(), *(p.grad for p in model.parameters() if p.grad is not None)])
    assert len(results[0]) > 1
    for new, old in zip(*results, strict=True):
        assert torch.equal(new, old), f"attn={attn}: the head-major projection changed a value"


def _contiguous_dim(t: torch.Tensor) -> int | None:
    """The dimension along which `t`'s elements lie next to each other in memory (stride 1, size > 1); None for a
    broadcast (a stride-0 dimension: a mask or a row statistic read again and again, not a layout)."""
    if any(t.stride(d) == 0 and t.shape[d] > 1 for d in range(t.dim())):
        return None
    return next((d for d in range(t.dim()) if t.stride(d) == 1 and t.shape[d] > 1), None)


class MixedLayoutPasses(TorchDispatchMode):
    """Records every element-wise op over two same-shaped per-token tensors (a dimension of the sequence's `length`:
    not the small m × m cores) that lie contiguous along
    different dimensions (one row-major, one transposed): the pass reads one of them against its layout, element by
    element across cache lines (one such add of two [32, 2, 2048, 32] gradients took ~4.8 ms on one Zen 5 thread,
    ~1.1 in one layout; a multiply of Performer's [32, 2, 2048, 256] features ~160 ms)."""

    OPS = ("aten.add", "aten.sub", "aten.mul", "aten.div")

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length
        self.found: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        pair = [a for a in args if isinstance(a, torch.Tensor) and self.length in a.shape]
        if str(func).startswith(self.OPS) and len(pair) == 2 and pair[0].shape == pair[1].shape:
            inner = {_contiguous_dim(t) for t in pair}
            if None not in inner and len(inner) == 2:
                self.found.append(f"{func}: {tuple(pair[0].shape)} strides {pair[0].stride()} and {pair[1].stride()}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("attn", sorted(ATTENTIONS.names()))
@pytest.mark.parametrize("kernels", ["fused", "eager"])
def test_the_attentions_gradients_meet_in_one_layout(attn: str, kernels: str, layout: str) -> None:
    """In the faithful training step no element-wise pass over per-token tensors mixes two memory layouts: where two
    gradients of one tensor meet (q and k feed both the landmarks and the landmark kernels; φ(K) and the spectral
    mixer's C a summary and a product; Skyformer's K its kernel, its norms and its landmarks), each arrives in the
    layout of the other (`SlotSums`, `BlockMeans`, `transposed_product`, `product_with_transposed`) — with the
    landmark weights on their short axis and without (`layout`: a CPU with wider or narrower vectors)."""
    overrides = ["task.seq_len=256", "task.gen_min_length=100", f"model.kernels={kernels}"]
    cfg = protocol_config("listops", attn, "nystromformer", overrides)
    torch.manual_seed(0)
    model = faithful_network(cfg).train()
    batch = random_batch(cfg, 3, torch.Generator().manual_seed(0))
    scan = MixedLayoutPasses(length=256)
    with scan:
        torch.nn.functional.cross_entropy(model(batch), batch["label"]).backward()
    assert not scan.found, f"attn={attn}: " + "; ".join(scan.found)
