"""GPU checks (run where CUDA exists; `make test` on a CPU machine deselects them): every attention in bf16
autocast trains a step with finite loss, and `full` agrees with the SDPA flash kernel path."""

from __future__ import annotations

import pytest
import torch

from lra_bench.registry import ATTENTIONS
from lra_bench.run.build import build_network as build_classifier

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def default_selector(name: str) -> dict | None:
    from tests.conftest import compose

    cfg = compose([f"attn={name}"])
    return dict(cfg.selector) if ATTENTIONS.get(name).takes_selector else None


@pytest.mark.parametrize("name", ATTENTIONS.names())
def test_bf16_training_step_is_finite(name: str) -> None:
    from tests.conftest import compose

    cfg = compose([f"attn={name}"])
    model = build_classifier(
        vocab_size=17,
        seq_len=1024,
        num_classes=10,
        dual=False,
        model=dict(dim=64, depth=2, num_heads=2, head_dim=32, ffn_dim=128),
        attn=dict(cfg.attn),
        selector=default_selector(name),
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(1, 17, (8, 1024), device="cuda")
    mask = torch.ones(8, 1024, dtype=torch.bool, device="cuda")
    mask[:, 900:] = False
    batch = {"input_ids": ids, "mask": mask, "label": torch.randint(0, 10, (8,), device="cuda")}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(batch).float(), batch["label"])
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_full_matches_flash_kernel() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lra_bench.registry import build_attention

    q, k, v = (torch.randn(4, 2, 2048, 32, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    attn = build_attention("full", head_dim=32, num_heads=2, seq_len=2048)
    ours = attn(q, k, v, None)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(ours.float(), flash.float(), atol=2e-2)
