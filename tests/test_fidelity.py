"""The fidelity tables (lra_bench/fidelity/*.yaml → docs/fidelity.md): every row marked `same` holds in the composed
config, every test a row names exists, and the page is the rendering of the YAML."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from lra_bench.fidelity import PROTOCOLS, load_rows, ours, render
from models.encoder import pool

ROOT = Path(__file__).resolve().parents[1]


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-12)
    return a == b


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_row_marked_same_holds_in_the_composed_config(protocol: str) -> None:
    wrong = {
        row.setting: (row.reference, ours(protocol, row))
        for row in load_rows(protocol)
        if row.verdict == "same" and row.key and not equal(ours(protocol, row), row.reference)
    }
    assert not wrong, f"protocol={protocol}: rows marked 'same' whose config value is not the reference's: {wrong}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_named_test_exists(protocol: str) -> None:
    for row in load_rows(protocol):
        if not row.test:
            continue
        path, _, name = row.test.partition("::")
        assert (ROOT / path).exists(), f"{row.setting}: {path} does not exist"
        if name:
            assert f"def {name}(" in (ROOT / path).read_text(), f"{row.setting}: no test {name} in {path}"


def test_the_page_is_the_rendering_of_the_tables() -> None:
    page = ROOT / "docs" / "fidelity.md"
    assert page.read_text() == render(), "docs/fidelity.md is stale: run python -m lra_bench.fidelity"


def test_mean_legacy_pools_as_the_reference() -> None:
    """The reference zeroes pad outputs after the final norm (`X = norm(X) * mask`) and averages all N positions
    (`inp.mean(dim=1)`): the real tokens' sum over the padded length. Oracle: that formula in float64, by hand."""
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    expected = torch.stack([x[0, :3].sum(0) / 6, x[1].sum(0) / 6])
    assert torch.allclose(pool(x, mask, "mean_legacy"), expected, atol=1e-12)
    assert not torch.allclose(pool(x, mask, "mean"), expected, atol=1e-3)  # real-token mean: the other pooling
