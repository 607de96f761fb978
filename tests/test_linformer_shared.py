"""Linformer as the Nyströmformer reference code builds it: one projection E [num_head, k, max_seq_len], shared by
keys and values and by every layer, initialised N(0, 0.02²) (mlpen/Nystromformer@5689313
LRA/code/attention_linformer.py:17-21), and `K = E (K·mask)`, `V = E (V·mask)` (:25-26).

The reference knobs are `attn.share=kv_layers attn.per_head=true attn.init_std=0.02`; the defaults keep the network
this harness had before they existed (E and F per layer, [k, n], randn/√k)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from lra_bench.kit.plain import plain_dict
from lra_bench.registry import build_attention, selector_node
from lra_bench.run.build import build_network
from models.attention.linformer import LinformerAttention
from tests.conftest import compose

REFERENCE = {"share": "kv_layers", "per_head": True, "init_std": 0.02}
REFERENCE_OVERRIDES = ["attn.share=kv_layers", "attn.per_head=true", "attn.init_std=0.02"]
LISTOPS = ["task=listops", "attn=linformer", "protocol=nystromformer"]

# Parameter counts written here, not computed from the code under test. The reference ListOps linformer prints
# num_parameter 1,258,378 (run_tasks.py, vocab_size 32 in lra_config.py): embeddings 32·64 + 2048·64, two blocks of
# 33,472, final norm 128, head 9,610, and E 2·256·2048 = 1,048,576 once. This harness's ListOps vocabulary has 17
# tokens (15 embedding rows of 64 fewer: 960), so the same network here has 1,257,418.
REFERENCE_PARAMS_VOCAB_32 = 1_258_378
REFERENCE_PARAMS = 1_257_418
DEFAULT_PARAMS = 2_305_994  # E and F [256, 2048] per layer: 4 · 524,288 where the reference has 1,048,576


def listops_network(attn: dict, vocab_size: int | None = None, overrides: tuple[str, ...] = ()):
    """The protocol's ListOps classifier, built as `lra_bench.run.build.build_model` builds it (the data module's
    shape read from the task config, so no data is needed); `attn` replaces the composed node's knobs."""
    cfg = compose([*LISTOPS, *overrides])
    node = {**plain_dict(cfg.attn), **attn}
    return build_network(
        vocab_size=int(cfg.task.vocab_size if vocab_size is None else vocab_size),
        seq_len=int(cfg.task.seq_len),
        num_classes=int(cfg.task.num_classes),
        dual=bool(cfg.task.dual),
        model=plain_dict(cfg.model),
        attn=node,
        selector=selector_node(cfg),
    )


def count(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def projections(net: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The distinct Linformer projection parameters of a network (each once, however many layers hold it)."""
    return [p for name, p in net.named_parameters() if name.endswith((".proj_k", ".proj_v"))]


def layer_attentions(net) -> list[LinformerAttention]:
    return [block.attn.attention for block in net.encoder.blocks]


# -- (1) the network's parameters ----------------------------------------------------------------------------


def test_reference_knobs_give_the_reference_parameter_count():
    net = listops_network(REFERENCE)
    assert count(net) == REFERENCE_PARAMS
    (shared,) = projections(net)
    assert tuple(shared.shape) == (2, 256, 2048)
    first, second = layer_attentions(net)
    assert second.proj_k is first.proj_k and first.proj_v is None and second.proj_v is None
    assert count(listops_network(REFERENCE, vocab_size=32)) == REFERENCE_PARAMS_VOCAB_32


def test_the_reference_override_set_composes_validates_and_builds_it():
    from lra_bench.config.validate import check_components

    cfg = compose([*LISTOPS, *REFERENCE_OVERRIDES])
    check_components(cfg)  # the knobs' types against LinformerConfig, as every run checks them
    assert {k: cfg.attn[k] for k in REFERENCE} == REFERENCE
    net = listops_network({}, overrides=tuple(REFERENCE_OVERRIDES))
    assert count(net) == REFERENCE_PARAMS
    assert [tuple(p.shape) for p in projections(net)] == [(2, 256, 2048)]


def test_defaults_keep_todays_network():
    net = listops_network({"share": "none", "per_head": False, "init_std": None})
    assert count(net) == DEFAULT_PARAMS
    plain = build_network(  # the dataclass defaults alone (no knob in the node)
        vocab_size=17, seq_len=2048, num_classes=10, dual=False,
        model=plain_dict(compose(LISTOPS).model), attn={"name": "linformer"}, selector=None,
    )  # fmt: skip
    assert count(plain) == DEFAULT_PARAMS
    assert [tuple(p.shape) for p in projections(plain)] == [(256, 2048)] * 4
    assert sorted(plain.state_dict()) == sorted(net.state_dict())
    proj = [k for k in plain.state_dict() if ".proj_" in k]  # the checkpoint names of before
    assert proj == [f"encoder.blocks.{i}.attn.attention.proj_{x}" for i in (0, 1) for x in "kv"]


def test_default_initialisation_draws_as_before():
    """The defaults draw E then F, each randn(k, n)/√k from the global RNG: a seeded run is the run of before."""
    torch.manual_seed(7)
    attn = build_attention("linformer", head_dim=4, num_heads=2, seq_len=32, proj_dim=8)
    torch.manual_seed(7)
    e, f = torch.randn(8, 32) / math.sqrt(8), torch.randn(8, 32) / math.sqrt(8)
    assert torch.equal(attn.proj_k.detach(), e) and attn.proj_v is not None and torch.equal(attn.proj_v.detach(), f)


# -- (2) the forward against the reference formula -------------------------------------------------------------


def reference_forward(e: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """attention_linformer.py's forward in float64, head by head: K = E[h] (K·mask), V = E[h] (V·mask),
    softmax(Q Kᵀ/√d) V, with E cut to the first N columns for a sequence of N."""
    b_, h_, n, d = q.shape
    out = np.zeros_like(q)
    for b in range(b_):
        m = mask[b].astype(np.float64)[:, None]
        for h in range(h_):
            eh = e[h][:, :n]
            kp, vp = eh @ (k[b, h] * m), eh @ (v[b, h] * m)
            dot = q[b, h] @ kp.T / math.sqrt(d)
            w = np.exp(dot - dot.max(axis=-1, keepdims=True))
            out[b, h] = (w / w.sum(axis=-1, keepdims=True)) @ vp
    return out


@pytest.mark.parametrize("n", [24, 32])  # shorter than the built length (first N columns), and the full length
def test_forward_equals_the_reference_formula_on_a_padded_batch(n):
    torch.manual_seed(0)
    attn = build_attention("linformer", head_dim=4, num_heads=3, seq_len=32, proj_dim=6, **REFERENCE).double()
    assert tuple(attn.proj_k.shape) == (3, 6, 32)
    q, k, v = (torch.randn(2, 3, n, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - 9 :] = False  # the second sequence padded
    got = attn(q, k, v, mask).detach().numpy()
    want = reference_forward(attn.proj_k.detach().numpy(), q.numpy(), k.numpy(), v.numpy(), mask.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    implied = attn.implied_matrix(q.float(), k.float(), mask).detach().double()  # the N×N operator applied to V
    v_real = v * mask[:, None, :, None]
    np.testing.assert_allclose((implied @ v_real).numpy(), want * mask[:, None, :, None].numpy(), atol=1e-5)
    assert attn.rank_budget(n) == 6


def test_per_head_projects_each_head_with_its_own_matrix():
    """per_head without sharing: E[h] and F[h], each head its own pair (the oracle with keys and values apart)."""
    torch.manual_seed(1)
    attn = build_attention("linformer", head_dim=4, num_heads=2, seq_len=16, proj_dim=5, per_head=True).double()
    assert attn.proj_v is not None and tuple(attn.proj_v.shape) == (2, 5, 16)
    q, k, v = (torch.randn(1, 2, 16, 4, dtype=torch.float64) for _ in range(3))
    e, f = attn.proj_k.detach(), attn.proj_v.detach()
    w = torch.softmax(q @ (e @ k).transpose(-1, -2) / 2.0, dim=-1)
    torch.testing.assert_close(attn(q, k, v, None), w @ (f @ v), rtol=1e-12, atol=1e-12)


# -- (3) the tie across layers survives a checkpoint and a training step ----------------------------------------


def test_tie_survives_state_dict_round_trip_and_an_optimiser_step():
    torch.manual_seed(0)
    net = listops_network(REFERENCE)
    keys = [k for k in net.state_dict() if k.endswith("proj_k")]
    assert keys == ["encoder.blocks.0.attn.attention.proj_k", "encoder.blocks.1.attn.attention.proj_k"]
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    torch.manual_seed(1)  # a fresh model, other initial values
    fresh = listops_network(REFERENCE)
    first, second = layer_attentions(fresh)
    before = first.proj_k
    assert not torch.equal(before.detach(), saved[keys[0]])
    fresh.load_state_dict(saved, strict=True)
    first, second = layer_attentions(fresh)
    assert first.proj_k is before and second.proj_k is first.proj_k  # loading copied into the one parameter
    assert torch.equal(first.proj_k.detach(), saved[keys[0]])
    assert len(projections(fresh)) == 1 and count(fresh) == REFERENCE_PARAMS

    opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    ids = torch.randint(0, 17, (2, 2048))
    mask = torch.ones(2, 2048, dtype=torch.bool)
    mask[1, 1500:] = False
    batch = {"input_ids": ids, "mask": mask}
    fresh.eval()  # no dropout: the gradient below is compared with an untied copy's
    start = first.proj_k.detach().clone()
    loss = fresh(batch).logsumexp(-1).sum()
    loss.backward()
    tied_grad = first.proj_k.grad.clone()
    opt.step()
    assert second.proj_k is first.proj_k
    assert not torch.equal(first.proj_k.detach(), start)  # updated, and both layers read the updated tensor
    state = fresh.state_dict()
    assert torch.equal(state[keys[0]], state[keys[1]])

    # the tied gradient is the sum of what each layer contributes: an untied copy (share=kv, one E per layer)
    # with the same weights gets one gradient per layer
    untied = listops_network({**REFERENCE, "share": "kv"})
    untied.load_state_dict(saved, strict=True)
    untied.eval()
    untied(batch).logsumexp(-1).sum().backward()
    u0, u1 = layer_attentions(untied)
    assert u0.proj_k is not u1.proj_k
    torch.testing.assert_close(tied_grad, u0.proj_k.grad + u1.proj_k.grad, rtol=1e-4, atol=1e-9)


def test_sharing_is_refused_between_mismatched_layers():
    a = build_attention("linformer", head_dim=4, num_heads=2, seq_len=16, proj_dim=5, **REFERENCE)
    b = build_attention("linformer", head_dim=4, num_heads=2, seq_len=16, proj_dim=6, **REFERENCE)
    c = build_attention("linformer", head_dim=4, num_heads=2, seq_len=16, proj_dim=5)
    with pytest.raises(ValueError, match="differ in shape"):
        b.share_with(a)
    with pytest.raises(ValueError, match="not a kv_layers Linformer"):
        a.share_with(c)
    c.share_with(a)  # share=none ties nothing
    assert c.proj_k is not a.proj_k
    with pytest.raises(ValueError, match="attn.share='layers'"):
        build_attention("linformer", head_dim=4, num_heads=2, seq_len=16, share="layers")


# -- (4) the initialisation ------------------------------------------------------------------------------------


def test_reference_initialisation_std():
    torch.manual_seed(0)
    (e,) = (p.detach() for p in projections(listops_network(REFERENCE)))
    assert abs(float(e.std()) - 0.02) < 0.0002 and abs(float(e.mean())) < 0.0002
    torch.manual_seed(0)
    default = projections(listops_network({"share": "none", "per_head": False, "init_std": None}))[0].detach()
    assert abs(float(default.std()) - 1 / 16) < 0.001  # randn/√k, k = 256


@pytest.mark.parametrize("per_head", [True, False])
def test_the_batched_projection_is_the_reference_product(per_head: bool) -> None:
    """`LinformerAttention.project` (one GEMM over the batch) computes `E (K·mask)` as the reference's broadcast
    matmul does — values and every gradient, against the plain formula in fp64 — for a sequence shorter than the
    one E was built for, with padded keys."""
    gen = torch.Generator().manual_seed(0)
    b, h, n, d, k, built = 3, 2, 40, 8, 6, 48
    shape = (h, k, built) if per_head else (k, built)
    e = (0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)).requires_grad_()
    x = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    x = (x * (torch.arange(n) < torch.tensor([n, 25, 3])[:, None])[:, None, :, None]).requires_grad_()
    grad = torch.randn(b, h, k, d, generator=gen, dtype=torch.float64)
    ours = LinformerAttention.project(e[..., :n], x)
    plain = e[..., :n] @ x  # broadcast over the batch (and the heads when E has none)
    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    (g_e, g_x) = torch.autograd.grad(ours, (e, x), grad)
    (p_e, p_x) = torch.autograd.grad(plain, (e, x), grad)
    torch.testing.assert_close(g_e, p_e, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_x, p_x, rtol=1e-12, atol=1e-12)
    assert ours.shape == (b, h, k, d)
