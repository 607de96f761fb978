"""The statistics behind `compare` and the leaderboard's intervals, against independent oracles and by simulation.

Calibration tests draw many synthetic experiments with a *known* effect (fixed seeds, so the outcome is
deterministic) and check that: intervals cover the truth at their nominal rate, and a null difference is called
significant about 5% of the time. Bounds are the nominal rate ± ~3 Monte-Carlo standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from lra_bench.stats import core
from lra_bench.stats.paired import (
    MCNEMAR,
    NO_TEST,
    SeedOutcome,
    compare_paired,
    hierarchical_bootstrap,
    mcnemar_exact,
    outcome_from_predictions,
)
from lra_bench.stats.summary import average_interval, holm, t_interval, tie_aware_ranks
from lra_bench.stats.verdict import significant, verdict


def _mc_bounds(rate: float, draws: int, k: float = 3.0) -> tuple[float, float]:
    se = math.sqrt(rate * (1 - rate) / draws)
    return rate - k * se, rate + k * se


def _paired_examples(rng: np.random.Generator, n: int, p10: float, p01: float, size: tuple[int, ...] = ()):
    """Boolean `correct` arrays of two classifiers: A-only right w.p. p10, B-only w.p. p01, both right otherwise
    half of the rest (the concordant split does not matter to any paired statistic)."""
    rest = 1.0 - p10 - p01
    kind = rng.choice(4, p=[rest / 2, p10, p01, rest / 2], size=(*size, n))
    return np.isin(kind, (0, 1)), np.isin(kind, (0, 2))


def _brute_force_bootstrap(correct_a, correct_b, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The textbook hierarchical bootstrap: pick seeds with replacement, then N example indices per seed."""
    seeds, n = correct_a.shape
    out = np.empty(n_resamples)
    for i in range(n_resamples):
        chosen = rng.integers(0, seeds, seeds)
        idx = rng.integers(0, n, (seeds, n))
        a = np.take_along_axis(correct_a[chosen], idx, axis=1)
        b = np.take_along_axis(correct_b[chosen], idx, axis=1)
        out[i] = (a.mean(axis=1) - b.mean(axis=1)).mean()
    return out


# -- oracles -------------------------------------------------------------------------------------------------------
def test_multinomial_bootstrap_has_the_distribution_of_index_resampling() -> None:
    rng = np.random.default_rng(1)
    a = np.stack([_paired_examples(rng, 300, p10, p01)[0] for p10, p01 in ((0.2, 0.1), (0.15, 0.15), (0.1, 0.05))])
    b = np.stack([_paired_examples(np.random.default_rng(s), 300, 0.2, 0.1)[1] for s in range(3)])
    outcomes = [outcome_from_predictions(s, a[s], b[s]) for s in range(3)]
    ours = hierarchical_bootstrap(outcomes, n_resamples=20_000, seed=0)
    oracle = _brute_force_bootstrap(a, b, 4_000, np.random.default_rng(2))
    sd = oracle.std()
    assert ours.mean() == pytest.approx(oracle.mean(), abs=0.06 * sd)
    assert ours.std() == pytest.approx(sd, rel=0.05)
    for q in (0.025, 0.5, 0.975):
        assert np.quantile(ours, q) == pytest.approx(np.quantile(oracle, q), abs=0.12 * sd)


def test_one_seed_interval_matches_the_paired_proportion_formula() -> None:
    """Planted effect: Δ = p10 − p01 = 4 pp on 5000 examples. The bootstrap interval must match the normal
    interval for a paired difference of proportions, Δ̂ ± 1.96·√((n10 + n01)/N − Δ̂²)/√N, to Monte-Carlo error."""
    rng = np.random.default_rng(3)
    a, b = _paired_examples(rng, 5000, 0.12, 0.08)
    outcome = outcome_from_predictions(0, a, b)
    result = compare_paired([outcome], n_resamples=40_000, seed=7)
    n = outcome.n
    d = (outcome.n10 - outcome.n01) / n
    half = 1.959964 * math.sqrt(((outcome.n10 + outcome.n01) / n - d * d) / n)
    assert result.test == MCNEMAR and result.delta == pytest.approx(d)
    assert result.ci[0] == pytest.approx(d - half, abs=0.0012)  # quantiles of 40k draws: ~0.03·half
    assert result.ci[1] == pytest.approx(d + half, abs=0.0012)
    assert result.p == pytest.approx(stats.binomtest(outcome.n10, outcome.n10 + outcome.n01, 0.5).pvalue)


def test_mcnemar_is_scipys_exact_binomial_test() -> None:
    assert mcnemar_exact(15, 5) == pytest.approx(stats.binomtest(15, 20).pvalue)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0


def test_t_interval_and_average_by_hand() -> None:
    lo, hi = t_interval(38.0, 1.0, 3)
    assert (lo, hi) == pytest.approx((38.0 - 4.302653 / math.sqrt(3), 38.0 + 4.302653 / math.sqrt(3)))
    assert t_interval(38.0, None, 1) is None and t_interval(38.0, 1.0, 1) is None
    # two tasks, sd 1 and 2 over 3 seeds each, plus a constant 50: var = (1/3 + 4/3)/9; df (Welch) = 25/17·2.
    avg, (lo, hi), p, df = average_interval([(40.0, 1.0, 3), (60.0, 2.0, 3), (50.0, None, None)])
    var = (1 / 3 + 4 / 3) / 9
    assert avg == pytest.approx(50.0)
    assert df == pytest.approx((1 / 3 + 4 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2))
    assert hi - avg == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(var))
    assert average_interval([(40.0, 1.0, 1)]) is None  # one seed: spread unknown


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04, 0.2 → ×4, ×3, ×2, ×1 = 0.04, 0.09, 0.08, 0.2 → running max 0.04, 0.09, 0.09, 0.2
    assert holm([0.01, 0.04, 0.03, 0.2, None]) == pytest.approx([0.04, 0.09, 0.09, 0.2, None])
    assert holm([0.5, 0.6]) == [1.0, 1.0]


def test_ranks_tie_overlapping_intervals() -> None:
    # A [58, 62] and B [57.5, 61] overlap: both 1st. C [54, 56] lies below A, B and D: 4th. D [57, 59.9] overlaps A and
    # B: 1st. E has no interval (one seed): no rank.
    ranks = tie_aware_ranks([(58, 62), (57.5, 61), (54, 56), (57, 59.9), None])
    assert ranks == [1, 1, 4, 1, None]  # three intervals lie wholly above C's
    assert tie_aware_ranks([(58, 62), (50, 57.9)]) == [1, 2]


def test_resampling_is_deterministic_for_a_seed() -> None:
    rng = np.random.default_rng(5)
    a, b = _paired_examples(rng, 400, 0.1, 0.1)
    outcomes = [outcome_from_predictions(0, a, b)]
    assert np.array_equal(hierarchical_bootstrap(outcomes, 500, seed=1), hierarchical_bootstrap(outcomes, 500, seed=1))
    assert not np.array_equal(hierarchical_bootstrap(outcomes, 500, seed=1), hierarchical_bootstrap(outcomes, 500, 2))


# -- calibration (batched: thousands of synthetic experiments per call of the same functions compare uses) --------
BASE = 0.2  # share of discordant examples per side around which the planted differences sit


def _counts(rng: np.random.Generator, true_diff: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discordant counts of paired runs whose true accuracy difference is `true_diff` (any shape), observed on n
    test examples: A-only w.p. BASE/2 + diff/2, B-only w.p. BASE/2 − diff/2."""
    p10 = np.clip(BASE / 2 + true_diff / 2, 0.0, 1.0)
    p01 = np.clip(BASE / 2 - true_diff / 2, 0.0, 1.0)
    counts = rng.multinomial(n, np.stack([p10, p01, 1.0 - p10 - p01], axis=-1))
    return counts[..., 0], counts[..., 1], np.full(true_diff.shape, n)


def test_wrappers_return_what_the_batched_core_computes() -> None:
    rng = np.random.default_rng(9)
    n10, n01, n = _counts(rng, np.array([0.01, 0.03, 0.02]), 2000)
    outcomes = [
        SeedOutcome(s, 0.5 + n10[s] / n[s], 0.5 + n01[s] / n[s], int(n10[s]), int(n01[s]), int(n[s])) for s in range(3)
    ]
    result = compare_paired(outcomes, n_resamples=500, seed=4)
    mean, sd, lo, hi, p = (float(x) for x in core.paired_t((n10 - n01) / n, 0.95))
    assert (result.delta, result.sd, *result.ci, result.p) == pytest.approx((mean, sd, lo, hi, p))
    draws = core.bootstrap_draws(n10, n01, n, 500, np.random.default_rng(4))
    assert result.bootstrap_ci == pytest.approx(tuple(np.quantile(draws, [0.025, 0.975])))
    one = compare_paired(outcomes[:1], n_resamples=500, seed=4)
    assert one.p == pytest.approx(float(core.mcnemar_p(n10[0], n01[0])))
    assert significant(result) == bool(core.significant(p, lo, hi, mean, 0.05))


def test_one_seed_null_is_rarely_significant_and_a_planted_effect_is_covered() -> None:
    draws, n = 3000, 400
    rng = np.random.default_rng(11)
    for truth in (0.0, 0.06):
        n10, n01, nn = _counts(rng, np.full((draws, 1), truth), n)
        p = core.mcnemar_p(n10[:, 0], n01[:, 0])
        lo, hi = core.percentile_interval(core.bootstrap_draws(n10, n01, nn, 600, rng), 0.95)
        called = core.significant(p, lo, hi, (n10 - n01)[:, 0] / n, 0.05)
        if truth == 0.0:  # exact McNemar: at most nominal (discrete, so a little conservative)
            assert called.mean() <= _mc_bounds(0.05, draws)[1], called.mean()
        else:
            covered = np.mean((lo <= truth) & (truth <= hi))
            low, high = _mc_bounds(0.95, draws)
            assert low - 0.01 <= covered <= high, covered  # percentile bootstrap on 400 examples: ≈ nominal
            assert called.mean() > 0.6  # 6 pp on 400 examples is usually detected


def test_three_seeds_null_is_called_significant_5_percent_of_the_time() -> None:
    draws = 20_000
    rng = np.random.default_rng(21)
    n10, n01, n = _counts(rng, 0.02 * rng.standard_normal((draws, 3)), 2000)  # seed sd 2 pp, no true effect
    mean, _, lo, hi, p = core.paired_t((n10 - n01) / n, 0.95)
    rate = core.significant(p, lo, hi, mean, 0.05).mean()
    low, high = _mc_bounds(0.05, draws)
    assert low <= rate <= high, rate
    assert np.mean(p < 0.01) == pytest.approx(0.01, abs=3 * math.sqrt(0.01 * 0.99 / draws))
    assert np.mean(p < 0.2) == pytest.approx(0.2, abs=3 * math.sqrt(0.2 * 0.8 / draws))


def test_three_seeds_planted_effect_interval_covers_the_truth() -> None:
    """Δ = 3 pp, seed sd 2 pp: the verdict's interval (paired t) covers 3 pp ~95% of the time; the hierarchical
    bootstrap beside it does not (it cannot see seed variance beyond 3 points) — why it never decides."""
    draws, truth = 4000, 0.03
    rng = np.random.default_rng(22)
    n10, n01, n = _counts(rng, truth + 0.02 * rng.standard_normal((draws, 3)), 2000)
    _, _, lo, hi, _ = core.paired_t((n10 - n01) / n, 0.95)
    covered = np.mean((lo <= truth) & (truth <= hi))
    low, high = _mc_bounds(0.95, draws)
    assert low <= covered <= high, covered
    blo, bhi = core.percentile_interval(core.bootstrap_draws(n10, n01, n, 400, rng), 0.95)
    assert np.mean((blo <= truth) & (truth <= bhi)) < 0.9


def test_average_over_tasks_is_calibrated() -> None:
    """Five tasks × 3 seeds with different seed spreads (a Pathfinder-like 5 pp next to 0.5 pp): the Welch interval
    of the average difference covers the truth ~95% and a null average is called significant ~5% of the time."""
    draws = 8000
    rng = np.random.default_rng(23)
    spreads = np.array([0.005, 0.01, 0.01, 0.02, 0.05])
    for truth in (0.0, 0.02):
        n10, n01, n = _counts(rng, truth + spreads[:, None] * rng.standard_normal((draws, 5, 3)), 2000)
        diffs = (n10 - n01) / n
        means, sds = diffs.mean(axis=-1), diffs.std(axis=-1, ddof=1)
        avg, lo, hi, p, _ = core.welch_average(means, sds**2 / 3, np.full(means.shape, 2), 0.95)
        if truth == 0.0:
            rate = core.significant(p, lo, hi, avg, 0.05).mean()
            low, high = _mc_bounds(0.05, draws)
        else:
            rate = np.mean((lo <= truth) & (truth <= hi))
            low, high = _mc_bounds(0.95, draws)
        assert low <= rate <= high, (truth, rate)


def test_one_seed_per_task_sign_flip_is_calibrated() -> None:
    draws = 2000
    rng = np.random.default_rng(24)
    n10, n01, n = _counts(rng, np.zeros((draws, 3)), 300)
    p = core.sign_flip_p(n10, n01, n, 400, rng)
    assert np.mean(p < 0.05) <= _mc_bounds(0.05, draws)[1]
    assert np.mean(p < 0.3) == pytest.approx(0.3, abs=3 * math.sqrt(0.3 * 0.7 / draws))


def test_significant_needs_the_p_value_and_the_printed_interval_to_agree() -> None:
    p = np.array([0.01, 0.01, 0.20, np.nan, 0.01])
    low = np.array([0.005, -0.01, 0.005, 0.005, np.nan])
    high = np.array([0.02, 0.02, 0.02, 0.02, np.nan])
    delta = np.array([0.01, 0.005, 0.01, 0.01, 0.01])
    # p < α with 0 inside the interval (a 1-seed bootstrap interval against the exact test) is not a win
    assert core.significant(p, low, high, delta, 0.05).tolist() == [True, False, False, False, True]


# -- wording -------------------------------------------------------------------------------------------------------
def test_verdict_wording() -> None:
    win = compare_paired([SeedOutcome(s, 0.40 + d, 0.40) for s, d in enumerate((0.010, 0.013, 0.012))])
    text = verdict("GPA", "Nyströmformer", "ListOps", win)
    assert text.startswith("GPA beats Nyströmformer on ListOps by 1.2 pp (95% CI ")
    assert "3 seeds; paired t-test over seeds p = " in text
    lose = compare_paired([SeedOutcome(s, 0.40, 0.40 + d) for s, d in enumerate((0.010, 0.013, 0.012))])
    assert verdict("GPA", "Nyströmformer", "ListOps", lose).startswith("Nyströmformer beats GPA on ListOps by 1.2 pp")
    tie = compare_paired([SeedOutcome(s, 0.40 + d, 0.40) for s, d in enumerate((0.01, -0.02, 0.005))])
    assert verdict("GPA", "Nyström", "Text", tie).startswith(
        "no significant difference between GPA and Nyström on Text"
    )
    one = compare_paired([SeedOutcome(0, 0.41, 0.40)])
    assert one.test == NO_TEST and verdict("A", "B", "Image", one).startswith(
        "cannot tell whether this trained A model (seed 0) or this trained B model (seed 0)"
    )
    same = compare_paired([SeedOutcome(s, 0.4, 0.4) for s in range(3)])
    assert same.p == 1.0 and "no significant difference" in verdict("A", "B", "Image", same)
