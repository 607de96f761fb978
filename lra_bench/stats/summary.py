"""Intervals and ranks from per-group summaries (mean, sample sd, n), the form the leaderboard has its numbers in.

Why t-intervals and not a bootstrap over seeds: LRA rows have 2–5 seeds, and a percentile bootstrap over 3 values
cannot see beyond their spread. In our simulation a nominal 95% bootstrap interval over 3 seeds covered the truth
77–86% of the time, while Student's t with n − 1 degrees of freedom is exact for normal seed effects at any n ≥ 2
(`tests/test_stats.py` measures both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from lra_bench.stats.core import welch_average


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def t_interval(mean: float | None, sd: float | None, n: int | None, level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of a mean from its sample sd (ddof=1) and n; None when n < 2 (the spread is unknown)."""
    if not (_finite(mean) and _finite(sd)) or n is None or n < 2:
        return None
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(sd) / math.sqrt(n)  # type: ignore[arg-type]
    return float(mean) - half, float(mean) + half  # type: ignore[arg-type]


def average_interval(
    parts: Sequence[tuple[float, float | None, int | None]], level: float = 0.95
) -> tuple[float, tuple[float, float], float, float] | None:
    """Mean of K independent group means, its interval and a two-sided p-value for "the average is 0".

    `parts` = (mean, sd, n) per group; a part with sd None and n None is a constant (Path-X counted as 50) and adds
    no variance. Var(average) = Σ sd²/n / K²; degrees of freedom by Welch–Satterthwaite, so groups with different
    seed counts and spreads combine honestly. Returns (average, (low, high), p, df), or None when a non-constant
    part has fewer than 2 values. With zero spread everywhere the interval is the point and p is 1 for an average of
    exactly 0, NaN otherwise (no test is possible).
    """
    if not parts:
        return None
    variances, dfs = [], []
    for _, sd, n in parts:
        if sd is None and n is None:
            variances.append(0.0)
            dfs.append(0)
            continue
        if sd is None or n is None or n < 2 or not math.isfinite(sd):
            return None
        variances.append(sd * sd / n)
        dfs.append(n - 1)
    means = np.array([float(m) for m, _, _ in parts])
    avg, lo, hi, p, df = (float(x) for x in welch_average(means, np.array(variances), np.array(dfs), level))
    if not math.isfinite(p):  # no spread anywhere
        return avg, (avg, avg), (1.0 if avg == 0.0 else float("nan")), float("inf")
    return avg, (lo, hi), p, df


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment (family-wise error) over the finite p-values; None/NaN stay as they are."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out: list[float | None] = list(pvalues)
    if not idx:
        return out
    p = np.array([pvalues[i] for i in idx], dtype=float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    for rank, j in enumerate(order):
        out[idx[j]] = float(adjusted[rank])
    return out


def tie_aware_ranks(intervals: Sequence[tuple[float, float] | None]) -> list[int | None]:
    """Rank = 1 + the number of entries whose whole interval lies above this one's.

    So entries whose intervals overlap share a rank (a tie), and an entry is ranked below another only when the
    data separate them. Not transitive by design: A may tie B, B tie C, and A still rank above C. Entries without
    an interval (one seed) get no rank.
    """
    return [
        None if own is None else 1 + sum(1 for other in intervals if other is not None and other[0] > own[1])
        for own in intervals
    ]
