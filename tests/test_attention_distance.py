"""How far attention reaches (`lra_bench.diagnostics.metrics.locality`): expected token distance and the mass within
16/64/256 tokens, against a numpy oracle on planted matrices, and as the diagnostics record them per layer and head
for a trained `local` model (whose implied matrix can never reach beyond its window)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lra_bench.diagnostics import LOCALITY_WINDOWS
from lra_bench.diagnostics.metrics import head_metrics, locality
from lra_bench.record import results
from tests.conftest import TINY_LISTOPS, run_cli


def numpy_oracle(a: np.ndarray) -> dict[str, float]:
    """The definitions, row by row: weights |A_ij| / Σ_j |A_ij|, distance Σ_j w_ij |i − j|, mass Σ_{|i−j|≤w} w_ij,
    averaged over the rows that have weight."""
    n = a.shape[0]
    distances, masses = [], {w: [] for w in LOCALITY_WINDOWS}
    for i in range(n):
        row = np.abs(a[i])
        if row.sum() == 0:
            continue
        row = row / row.sum()
        offsets = np.abs(np.arange(n) - i)
        distances.append(float(row @ offsets))
        for w in LOCALITY_WINDOWS:
            masses[w].append(float(row[offsets <= w].sum()))
    return {"attn_distance": float(np.mean(distances))} | {
        f"mass_within_{w}": float(np.mean(masses[w])) for w in masses
    }


def banded(n: int, half_width: int) -> np.ndarray:
    i, j = np.indices((n, n))
    a = (np.abs(i - j) <= half_width).astype(float)
    return a / a.sum(1, keepdims=True)


PLANTED = {
    "banded-8": banded(300, 8),
    "banded-40": banded(300, 40),
    "uniform": np.full((300, 300), 1 / 300),
    "identity": np.eye(300),
    "signed, unnormalised, a zero row": np.vstack(
        [np.random.default_rng(0).normal(size=(299, 300)) * np.arange(1, 300)[:, None], np.zeros((1, 300))]
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_locality_equals_the_numpy_oracle(name: str) -> None:
    a = PLANTED[name]
    got = locality(torch.from_numpy(a))
    for key, expected in numpy_oracle(a).items():
        assert got[key] == pytest.approx(expected, rel=1e-12, abs=1e-12), key


def test_closed_forms() -> None:
    """Uniform attention over n tokens: d = (n² − 1)/(3n), mass within w = Σ_i #{j: |i − j| ≤ w} / n²; a band of
    half-width b has all its mass within any w ≥ b and reaches at most b; the identity reaches 0."""
    n = 300
    uniform = locality(torch.full((n, n), 1.0 / n, dtype=torch.float64))
    assert uniform["attn_distance"] == pytest.approx((n * n - 1) / (3 * n), rel=1e-12)
    for w in LOCALITY_WINDOWS:
        inside = sum(min(n - 1, i + w) - max(0, i - w) + 1 for i in range(n))
        assert uniform[f"mass_within_{w}"] == pytest.approx(inside / n**2, rel=1e-12)
    band = locality(torch.from_numpy(banded(n, 8)))
    assert band["attn_distance"] <= 8 and all(band[f"mass_within_{w}"] == pytest.approx(1.0) for w in LOCALITY_WINDOWS)
    assert locality(torch.eye(n, dtype=torch.float64))["attn_distance"] == 0.0


def test_a_matrix_without_weight_has_no_locality() -> None:
    assert set(locality(torch.zeros(4, 4, dtype=torch.float64)).values()) == {None}


def test_head_metrics_report_the_method_and_the_exact_softmax() -> None:
    """q = k = 0: the exact softmax is uniform; the method's Â is planted as a band of half-width 2."""
    n = 40
    q = torch.zeros(n, 4, dtype=torch.float64)
    got = head_metrics(q, q, q, torch.from_numpy(banded(n, 2)), rank_budget=None, rank_tol=1e-3)
    assert got["attn_distance_exact"] == pytest.approx((n * n - 1) / (3 * n))
    assert got["attn_distance"] == pytest.approx(numpy_oracle(banded(n, 2))["attn_distance"])
    assert got["mass_within_16"] == pytest.approx(1.0) and got["mass_within_16_exact"] < 1.0


@pytest.mark.slow
def test_a_local_run_records_how_far_its_attention_reaches(tmp_path) -> None:
    """A real `run.py attn=local attn.window=2` run: in the record, every layer and head reaches at most 2 tokens
    with all its mass within 16, while the exact softmax of the same q, k reaches further; the summary holds both."""
    run_cli(["attn=local", "attn.window=2", *TINY_LISTOPS], tmp_path)
    record = results.read_record(next((tmp_path / "outputs").rglob(results.FILENAME)))
    best = record["diagnostics"]["best"]
    heads = [h for layer in best["layers"] for h in layer["heads"]]
    assert len(heads) == 4  # 2 layers × 2 heads
    for head in heads:
        assert 0 < head["attn_distance"] <= 2 and head["mass_within_16"] == pytest.approx(1.0)
        assert head["attn_distance_exact"] > head["attn_distance"]
    summary = best["summary"]
    assert summary["attn_distance"] <= 2 < summary["attn_distance_exact"]
