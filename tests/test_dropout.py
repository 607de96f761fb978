"""The packed CPU dropout (`models.dropout`): the distribution of `nn.Dropout` (independent keeps with probability
1 − p', kept values scaled by 1 / (1 − p'), the gradient the same mask), seeded by torch's generator, and what the
faithful network trains with (no serial Bernoulli draw left in its step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from models.dropout import LEVELS, Dropout, packed_dropout

P = 0.1
P_USED = round(P * LEVELS) / LEVELS  # 0.10000610…


def test_each_element_is_dropped_with_probability_p_and_the_rest_scaled() -> None:
    torch.manual_seed(0)
    x = torch.rand(1 << 21) + 0.5  # never 0, so a 0 out means dropped
    out = packed_dropout(x, P)
    dropped = out == 0
    n, k = x.numel(), int(dropped.sum())
    assert stats.binomtest(k, n, P_USED).pvalue > 1e-4, k / n
    torch.testing.assert_close(out[~dropped], x[~dropped] / (1 - P_USED), rtol=1e-6, atol=0)


def test_neighbours_in_one_random_word_are_independent() -> None:
    """Four elements share one 64-bit word: adjacent keeps must still be independent (χ² on the 2×2 table)."""
    torch.manual_seed(1)
    dropped = (packed_dropout(torch.ones(1 << 22), 0.3) == 0).numpy().reshape(-1, 4)
    for a, b in ((0, 1), (1, 2), (2, 3), (0, 3)):
        table = np.array(
            [
                [np.sum(dropped[:, a] & dropped[:, b]), np.sum(dropped[:, a] & ~dropped[:, b])],
                [np.sum(~dropped[:, a] & dropped[:, b]), np.sum(~dropped[:, a] & ~dropped[:, b])],
            ]
        )
        assert stats.chi2_contingency(table).pvalue > 1e-4, (a, b, table)


def test_the_gradient_is_the_same_mask() -> None:
    torch.manual_seed(2)
    x = torch.randn(64, 256, requires_grad=True)
    out = packed_dropout(x, P)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    keep_scaled = torch.where(out != 0, 1 / (1 - P_USED), 0.0)
    torch.testing.assert_close(x.grad, weights * keep_scaled)


def test_seeded_by_torch_and_fresh_on_every_call() -> None:
    x = torch.ones(4096)
    torch.manual_seed(3)
    first, second = packed_dropout(x, P), packed_dropout(x, P)
    torch.manual_seed(3)
    assert torch.equal(packed_dropout(x, P), first)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_edges(p: float) -> None:
    x = torch.randn(100)
    out = Dropout(p).train()(x)
    assert torch.equal(out, x if p == 0 else torch.zeros_like(x))
    assert torch.equal(Dropout(0.5).eval()(x), x)


def test_the_faithful_network_trains_without_a_serial_bernoulli_draw() -> None:
    """The network a run builds (the protocol's own config) draws its dropout masks with the packed path."""
    from torch.profiler import ProfilerActivity, profile

    from lra_bench.bench.step import faithful_network, protocol_config, random_batch

    cfg = protocol_config("listops", "nystrom", "nystromformer", ["task.seq_len=128", "task.max_length=100"])
    model = faithful_network(cfg).train()
    batch = random_batch(cfg, 2, torch.Generator().manual_seed(0))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(batch).sum().backward()
    ops = {event.key for event in prof.key_averages()}
    assert "aten::bernoulli_" not in ops, sorted(o for o in ops if "bernoulli" in o or "dropout" in o)
    assert "aten::random_" in ops
