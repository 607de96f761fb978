"""Seeds needed for a difference (`lra_bench.stats.power`), checked against G*Power's published sample sizes and a
simulation of the t-test it sizes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lra_bench.stats.power import seeds_per_arm, t_test_power


@pytest.mark.parametrize(("effect", "per_arm"), [(0.2, 394), (0.5, 64), (0.8, 26), (1.0, 17)])
def test_sample_sizes_match_gpower(effect: float, per_arm: int) -> None:
    """G*Power 3 (Faul et al. 2007), t tests / means, two independent groups, two tails, α 0.05, power 0.80."""
    assert seeds_per_arm(effect, 1.0) == per_arm
    assert seeds_per_arm(3 * effect, 3.0) == per_arm  # only the ratio matters


def test_power_is_what_a_simulated_t_test_achieves() -> None:
    rng = np.random.default_rng(0)
    n, difference, sd, reps = 10, 1.0, 1.2, 40_000
    a = rng.normal(0.0, sd, (reps, n))
    b = rng.normal(difference, sd, (reps, n))
    simulated = float(np.mean(stats.ttest_ind(a, b, axis=1).pvalue < 0.05))
    assert abs(t_test_power(difference, sd, n) - simulated) < 0.01, simulated


def test_edges() -> None:
    assert seeds_per_arm(1.0, 0.0) == 2
    assert seeds_per_arm(1e-4, 1.0) is None  # beyond reach, not an endless search
    assert t_test_power(1.0, 1.0, 1) == 0.0
