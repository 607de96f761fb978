"""How many seeds a difference needs: the sample size of a two-sided two-sample t-test at a given power.

The reproduction page asks it of the measured seed spread ("a 1 pp difference between gpa and nystrom needs N seeds
per method"), so that "cannot tell" comes with what it would take to tell. The power is the exact one, from the
noncentral t distribution (equal seeds per arm, pooled sd), not the normal approximation, which undercounts at the
handful of seeds LRA rows have.
"""

from __future__ import annotations

import math

from scipy import stats

#: the search stops here: a difference that needs more seeds than this is "not within reach"
MAX_SEEDS = 10_000


def t_test_power(difference: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided two-sample t-test (pooled sd, `n` per arm) to detect a true `difference`."""
    if n < 2:
        return 0.0
    df = 2 * n - 2
    shift = abs(difference) / (sd * math.sqrt(2.0 / n))
    critical = float(stats.t.ppf(1 - alpha / 2, df))
    return float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))


def seeds_per_arm(difference: float, sd: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """The fewest seeds per method at which the t-test detects `difference` with `power` (None: over MAX_SEEDS).

    `sd` is the seed-to-seed sd of one method's accuracy; with sd 0 two seeds suffice."""
    if sd <= 0:
        return 2
    n = 2
    while t_test_power(difference, sd, n, alpha) < power:
        n = n * 2 if n < 64 else n + max(1, n // 8)
        if n > MAX_SEEDS:
            return None
    low = max(2, n // 2)
    while low < n:  # the smallest n in (low, n] with enough power (power rises with n)
        mid = (low + n) // 2
        if t_test_power(difference, sd, mid, alpha) >= power:
            n = mid
        else:
            low = mid + 1
    return n
