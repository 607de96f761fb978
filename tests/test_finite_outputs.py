"""No NaN/Inf in outputs or gradients, for every attention × selector, in the cases that break landmark methods:
sequences shorter than m, one real token, duplicated tokens (singular cores), bf16 autocast, half precision,
and large-norm queries and keys."""

from __future__ import annotations

import pytest
import torch

from tests.test_landmark_attention import IDS, PAIRS, B, D, H, make

N = 16
CASES = ("shorter_than_m", "one_real_token", "duplicated_tokens", "bf16_autocast", "half", "large_norm")


def case_inputs(case: str) -> tuple[list[torch.Tensor], torch.Tensor | None, torch.dtype]:
    g = torch.Generator().manual_seed(0)
    n = 4 if case == "shorter_than_m" else N
    q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
    mask = torch.ones(B, n, dtype=torch.bool)
    if case == "one_real_token":
        mask[1, 1:] = False
    if case == "duplicated_tokens":
        q, k, v = (t[:, :, :1].expand(B, H, n, D).contiguous() for t in (q, k, v))
    if case == "large_norm":
        q, k = 100 * q, 100 * k
    dtype = torch.float16 if case == "half" else torch.float32
    return [t.to(dtype).requires_grad_(True) for t in (q, k, v)], mask, dtype


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("attn", "selector"), PAIRS, ids=IDS)
def test_finite_outputs_and_gradients(attn: str, selector: str | None, case: str) -> None:
    module = make(attn, selector, seq_len=N)  # m = 6 landmarks / small feature counts
    (q, k, v), mask, dtype = case_inputs(case)
    if dtype != torch.float32:
        module = module.to(dtype)
    vm = v * mask[:, None, :, None].to(v.dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "bf16_autocast"):
        out = module(q, k, vm, mask)
    assert torch.isfinite(out).all(), f"non-finite output ({case})"
    (out.float() * mask[:, None, :, None]).pow(2).mean().backward()
    for name, t in zip("qkv", (q, k, v)):
        assert t.grad is not None and torch.isfinite(t.grad).all(), f"non-finite {name}.grad ({case})"
    module.eval()
    with torch.no_grad():
        mat = module.implied_matrix(q.detach(), k.detach(), mask)
    assert torch.isfinite(mat).all(), f"non-finite implied matrix ({case})"
