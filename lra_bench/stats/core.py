"""The statistics themselves, on numpy arrays with any leading batch shape (…, seeds) or (…, tasks).

Batched so that the calibration tests can draw thousands of synthetic experiments in one call and check what the
command line prints against the truth; `paired` wraps these for one comparison. Every random function takes a
`numpy.random.Generator`, so the caller fixes the seed.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats


def mcnemar_p(n10: np.ndarray, n01: np.ndarray) -> np.ndarray:
    """Exact two-sided McNemar p: under "equal accuracy" each of the n10 + n01 discordant examples favours A with
    probability 1/2. The binomial(d, 1/2) is symmetric, so the two-sided exact p (scipy's `binomtest`) is twice
    the smaller tail, capped at 1; 1 when nothing is discordant."""
    n10, n01 = np.asarray(n10), np.asarray(n01)
    d = n10 + n01
    p = np.minimum(1.0, 2.0 * stats.binom.cdf(np.minimum(n10, n01), np.maximum(d, 1), 0.5))
    return np.where(d == 0, 1.0, p)


def bootstrap_draws(
    n10: np.ndarray, n01: np.ndarray, n: np.ndarray, n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Draws (…, n_resamples) of the mean paired difference over seeds (last axis of the inputs): resample the
    seeds with replacement, then each chosen seed's n test examples with replacement. One resampled test set's
    difference is (c10 − c01)/n with (c10, c01, rest) ~ Multinomial(n, (n10, n01, rest)/n) — exactly the
    distribution of resampling n example indices, at O(1) cost."""
    n10, n01, n = (np.asarray(x) for x in (n10, n01, n))
    seeds = n.shape[-1]
    batch = n.shape[:-1]
    chosen = rng.integers(0, seeds, size=(*batch, n_resamples, seeds))

    def pick(x: np.ndarray) -> np.ndarray:
        return np.take_along_axis(np.broadcast_to(x[..., None, :], (*batch, n_resamples, seeds)), chosen, axis=-1)

    nn = pick(n)
    p10, p01 = pick(n10) / nn, pick(n01) / nn
    pvals = np.stack([p10, p01, np.clip(1.0 - p10 - p01, 0.0, 1.0)], axis=-1)
    counts = rng.multinomial(nn, pvals)
    return ((counts[..., 0] - counts[..., 1]) / nn).mean(axis=-1)


def percentile_interval(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = np.quantile(draws, [0.5 - level / 2, 0.5 + level / 2], axis=-1)
    return lo, hi


def paired_t(diffs: np.ndarray, level: float) -> tuple[np.ndarray, ...]:
    """One-sample t on per-seed differences (last axis, ≥ 2 seeds): (mean, sd, low, high, p). Zero spread gives
    NaN for the interval and p (the t statistic is undefined); the caller decides what that means."""
    diffs = np.asarray(diffs, dtype=float)
    k = diffs.shape[-1]
    mean = diffs.mean(axis=-1)
    sd = diffs.std(axis=-1, ddof=1)
    se = sd / np.sqrt(k)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, mean / np.where(se > 0, se, 1.0), np.nan)
    half = stats.t.ppf(0.5 + level / 2, k - 1) * se
    p = 2.0 * stats.t.sf(np.abs(t), k - 1)
    nan = se <= 0
    return mean, sd, np.where(nan, np.nan, mean - half), np.where(nan, np.nan, mean + half), np.where(nan, np.nan, p)


def welch_average(means: np.ndarray, var_of_means: np.ndarray, dfs: np.ndarray, level: float) -> tuple[np.ndarray, ...]:
    """Mean of K independent group means (last axis), each with the variance of its mean and its degrees of
    freedom (a constant group: variance 0): (average, low, high, p for "average = 0", df). Var = Σ v / K²; df by
    Welch–Satterthwaite. Zero total variance gives NaN interval and p."""
    means, v, dfs = (np.asarray(x, dtype=float) for x in (means, var_of_means, dfs))
    k = means.shape[-1]
    avg = means.mean(axis=-1)
    total = v.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = total**2 / np.sum(np.where(v > 0, v**2 / np.where(dfs > 0, dfs, 1.0), 0.0), axis=-1)
        se = np.sqrt(total) / k
        t = avg / se
    half = stats.t.ppf(0.5 + level / 2, df) * se
    p = 2.0 * stats.t.sf(np.abs(t), df)
    nan = total <= 0
    return avg, np.where(nan, np.nan, avg - half), np.where(nan, np.nan, avg + half), np.where(nan, np.nan, p), df


def sign_flip_p(
    n10: np.ndarray, n01: np.ndarray, n: np.ndarray, n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Two-sided Monte-Carlo p of the average over tasks (last axis, one seed each) of the paired difference,
    under "no difference": each discordant example favours either side with probability 1/2, independently.
    Counts the observed value among the resamples, so p ≥ 1/(n_resamples + 1)."""
    n10, n01, n = (np.asarray(x) for x in (n10, n01, n))
    d = n10 + n01
    observed = ((n10 - n01) / n).mean(axis=-1)
    for_a = rng.binomial(np.broadcast_to(d[..., None, :], (*d.shape[:-1], n_resamples, d.shape[-1])), 0.5)
    null = ((2 * for_a - d[..., None, :]) / n[..., None, :]).mean(axis=-1)
    extreme = np.sum(np.abs(null) >= np.abs(observed)[..., None] - 1e-12, axis=-1)
    return (extreme + 1) / (n_resamples + 1)


def significant(p: ArrayLike, low: ArrayLike, high: ArrayLike, delta: ArrayLike, alpha: float) -> np.ndarray:
    """The verdict rule: p < alpha and the interval excludes 0 (NaN p or interval: not significant)."""
    p, low, high, delta = (np.asarray(x, dtype=float) for x in (p, low, high, delta))
    excludes = ~((low <= 0.0) & (0.0 <= high))
    with np.errstate(invalid="ignore"):
        return (p < alpha) & np.isfinite(p) & excludes & (delta != 0.0)
