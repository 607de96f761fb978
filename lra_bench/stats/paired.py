"""Paired comparison of two methods on one task: runs paired by seed, examples paired by test-split position.

Two sources of noise separate two LRA numbers: the training seed (Pathfinder moves by 6–7 points between seeds)
and the finite test set (2000 ListOps examples: ±1 pp). Which test answers "is A better than B?" depends on what
was measured:

* **≥ 2 seeds** — a paired t-test on the per-seed differences d_s = acc_A,s − acc_B,s, and its t-interval. Each
  d_s already carries both noises, so this covers them both, and it is exact for normal seed effects at any seed
  count (a bootstrap over 3 seeds is not: see `summary`). This decides the verdict.
* **1 seed with per-example outputs** — the exact McNemar test on the discordant examples (A right and B wrong,
  or the reverse), and a bootstrap interval over test examples. It covers the test-set noise only: it says
  whether *these two trained models* differ, not whether the methods do.
* **The hierarchical bootstrap** (resample seeds, then examples within each seed) is reported beside, whenever
  every pair has per-example outputs: the hierarchical bootstrap interval. With few seeds it understates the seed
  variance, so it never overrides the test.

**Zero spread.** Per-seed differences are computed from integer counts — (n10 − n01)/N from the per-example
outputs, else (correct_A − correct_B)/N with the correct counts recovered from the records' accuracies and test
sizes — so two seeds on which A is ahead by the same number of examples give the same float, whatever the
accuracy level (0.455 − 0.450 and 0.305 − 0.300 differ in the last bit). Where no count is known, a spread below
`SPREAD_TOL` counts as none: it is rounding, never a measurement (one example in a million is 1e-6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lra_bench.stats import core
from lra_bench.stats.summary import average_interval

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0
#: a per-seed spread (or mean) of accuracy differences below this is float rounding, not a measurement
SPREAD_TOL = 1e-9
#: how far accuracy × test examples may sit from an integer and still be read as a count
COUNT_TOL = 1e-6


@dataclass(frozen=True)
class SeedOutcome:
    """One seed's pair of runs. Accuracies are fractions; the counts exist when both runs saved predictions."""

    seed: Any
    acc_a: float
    acc_b: float
    n10: int | None = None  # A right, B wrong
    n01: int | None = None  # A wrong, B right
    n: int | None = None  # test examples
    counts: tuple[int, int, int] | None = None  # (correct A, correct B, test examples), when known without n10/n01

    @property
    def diff(self) -> float:
        """acc_A − acc_B from integer counts when known (see the module: zero spread), else from the floats."""
        if self.n10 is not None and self.n01 is not None and self.n:
            return (self.n10 - self.n01) / self.n
        if self.counts is not None:
            correct_a, correct_b, total = self.counts
            return (correct_a - correct_b) / total
        return self.acc_a - self.acc_b

    @property
    def has_examples(self) -> bool:
        return self.n is not None

    @property
    def mcnemar_p(self) -> float | None:
        return mcnemar_exact(self.n10, self.n01) if self.n10 is not None and self.n01 is not None else None


def outcome_from_predictions(seed: Any, correct_a: np.ndarray, correct_b: np.ndarray) -> SeedOutcome:
    """The seed's accuracies, discordant counts and exact McNemar p from two boolean `correct` arrays."""
    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"per-example outcomes must be equal non-empty 1-d arrays, got {a.shape} and {b.shape}")
    n10, n01 = int(np.sum(a & ~b)), int(np.sum(~a & b))
    return SeedOutcome(seed, float(a.mean()), float(b.mean()), n10, n01, int(a.size))


def correct_count(acc: float, examples: int | None) -> int | None:
    """The number of correct examples behind accuracy `acc` on `examples` test examples, or None when it is not a
    count over that many (unknown size, or acc × examples not within `COUNT_TOL` of an integer)."""
    if not isinstance(examples, int) or isinstance(examples, bool) or examples <= 0:
        return None
    scaled = acc * examples
    count = round(scaled)
    return count if abs(scaled - count) <= COUNT_TOL else None


def outcome_from_accuracies(
    seed: Any, acc_a: float, acc_b: float, examples_a: int | None = None, examples_b: int | None = None
) -> SeedOutcome:
    """The seed's outcome from two recorded accuracies (no per-example outputs). Differences use the correct
    counts when both accuracies are counts over the same test size. Non-finite accuracies are refused."""
    if not (math.isfinite(acc_a) and math.isfinite(acc_b)):
        raise ValueError(f"seed {seed}: accuracy A {acc_a}, B {acc_b}: not a number")
    ca, cb = correct_count(acc_a, examples_a), correct_count(acc_b, examples_b)
    counts = (ca, cb, examples_a) if ca is not None and cb is not None and examples_a == examples_b else None
    return SeedOutcome(seed, acc_a, acc_b, counts=counts)  # type: ignore[arg-type]


def mcnemar_exact(n10: int, n01: int) -> float:
    """Exact McNemar p for one seed (see `core.mcnemar_p`)."""
    return float(core.mcnemar_p(np.array(n10), np.array(n01)))


RngSeed = int | Sequence[int]  # numpy's SeedSequence entropy: (base seed, task index) gives each task its own stream


def _counts(outcomes: Sequence[SeedOutcome]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not outcomes or not all(o.has_examples for o in outcomes):
        raise ValueError("the example bootstrap needs per-example outcomes for every seed")
    return tuple(np.array([getattr(o, k) for o in outcomes], dtype=np.int64) for k in ("n10", "n01", "n"))  # type: ignore[return-value]


def hierarchical_bootstrap(
    outcomes: Sequence[SeedOutcome], n_resamples: int = DEFAULT_RESAMPLES, seed: RngSeed = DEFAULT_SEED
) -> np.ndarray:
    """`n_resamples` draws of the mean paired difference: seeds resampled with replacement, then each chosen
    seed's test examples (see `core.bootstrap_draws`). With one seed this is the plain bootstrap over test
    examples. Deterministic for a given `seed`."""
    return core.bootstrap_draws(*_counts(outcomes), n_resamples, np.random.default_rng(seed))


def percentile_interval(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    lo, hi = core.percentile_interval(draws, level)
    return float(lo), float(hi)


@dataclass(frozen=True)
class PairedResult:
    """The answer for one task (or the average over tasks). Differences are fractions (×100 = pp)."""

    n_seeds: int
    delta: float
    ci: tuple[float, float] | None  # the interval that goes with `test` (so the two never disagree)
    p: float | None
    test: str  # "paired t-test over seeds" | "exact McNemar (1 seed)" | ... | "none"
    sd: float | None = None  # sample sd of the per-seed differences
    bootstrap_ci: tuple[float, float] | None = None  # hierarchical, seeds × examples
    outcomes: tuple[SeedOutcome, ...] = ()
    note: str = ""
    draws: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def examples(self) -> bool:
        return bool(self.outcomes) and all(o.has_examples for o in self.outcomes)


T_TEST = "paired t-test over seeds"
MCNEMAR = "exact McNemar test"
WELCH = "Welch t-test on the task average"
SIGN_FLIP = "sign-flip test over examples"
NO_TEST = "none"


def compare_paired(
    outcomes: Sequence[SeedOutcome],
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: RngSeed = DEFAULT_SEED,
) -> PairedResult:
    """Point estimate, the matching interval and test, and the hierarchical bootstrap beside (see the module)."""
    if not outcomes:
        raise ValueError("no paired seeds to compare")
    outcomes = tuple(outcomes)
    bad = [o.seed for o in outcomes if not math.isfinite(o.diff)]
    if bad:
        raise ValueError(f"seed(s) {', '.join(map(str, bad))}: the accuracy is not a number")
    diffs = np.array([o.diff for o in outcomes])
    delta = _snap(float(diffs.mean()))
    draws = hierarchical_bootstrap(outcomes, n_resamples, seed) if all(o.has_examples for o in outcomes) else None
    boot = percentile_interval(draws, level) if draws is not None else None
    n = len(outcomes)
    if n >= 2:
        _, sd_, lo, hi, p = core.paired_t(diffs, level)
        sd = _snap(float(sd_))
        if sd > 0.0:
            return PairedResult(n, delta, (float(lo), float(hi)), float(p), T_TEST, sd, boot, outcomes, "", draws)
        if delta == 0.0:
            note = "identical accuracies on every seed"
            return PairedResult(n, delta, (0.0, 0.0), 1.0, T_TEST, sd, boot, outcomes, note, draws)
        note = "the per-seed differences are all equal: no spread, the t-test is undefined"
        return PairedResult(n, delta, None, None, NO_TEST, sd, boot, outcomes, note, draws)
    only = outcomes[0]
    if only.has_examples:
        note = "1 seed: test-set noise only, training-seed variance not covered"
        return PairedResult(1, delta, boot, only.mcnemar_p, MCNEMAR, None, boot, outcomes, note, draws)
    note = "1 seed and no per-example test outputs: no test is possible"
    return PairedResult(1, delta, None, None, NO_TEST, None, None, outcomes, note, None)


def _snap(value: float) -> float:
    """0 for a value within `SPREAD_TOL` of 0 (float rounding of differences of fractions), else the value."""
    return 0.0 if abs(value) <= SPREAD_TOL else value


def compare_average(
    results: Sequence[PairedResult],
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: RngSeed = DEFAULT_SEED,
) -> PairedResult:
    """The difference of the task-averaged accuracy (tasks weigh equally, as in the LRA average).

    Every task with ≥ 2 seeds: a t-test on the average of the task differences (Welch–Satterthwaite degrees of
    freedom). Every task with 1 seed and per-example outputs: a sign-flip randomisation test (under "no
    difference" each discordant example favours either method with probability 1/2, independently in each task;
    for one task it is McNemar's test). Tasks are independent runs, so the bootstrap of the average is the mean of
    the tasks' own bootstrap draws.
    """
    if not results:
        raise ValueError("no task results to average")
    delta = float(np.mean([r.delta for r in results]))
    every_draw = [r.draws for r in results if r.draws is not None]
    draws = np.mean(every_draw, axis=0) if len(every_draw) == len(results) else None
    boot = percentile_interval(draws, level) if draws is not None else None
    seeds = min(r.n_seeds for r in results)
    if all(r.n_seeds >= 2 for r in results):
        avg = average_interval([(r.delta, r.sd, r.n_seeds) for r in results], level)
        assert avg is not None
        _, ci, p, _ = avg
        if math.isfinite(p):
            return PairedResult(seeds, delta, ci, p, WELCH, None, boot, (), "", draws)
        note = "no spread across seeds: the t-test is undefined"
        return PairedResult(seeds, delta, None, None, NO_TEST, None, boot, (), note, draws)
    if all(r.n_seeds == 1 and r.examples for r in results):
        p = sign_flip_p([r.outcomes[0] for r in results], n_resamples, seed)
        note = "1 seed per task: test-set noise only, training-seed variance not covered"
        return PairedResult(1, delta, boot, p, SIGN_FLIP, None, boot, (), note, draws)
    note = "tasks differ in what was measured: the average needs ≥ 2 seeds on every task"
    return PairedResult(seeds, delta, None, None, NO_TEST, None, boot, (), note, draws)


def sign_flip_p(
    outcomes: Sequence[SeedOutcome], n_resamples: int = DEFAULT_RESAMPLES, seed: RngSeed = DEFAULT_SEED
) -> float:
    """Two-sided Monte-Carlo p of the average paired difference over tasks, one seed each (`core.sign_flip_p`)."""
    return float(core.sign_flip_p(*_counts(outcomes), n_resamples, np.random.default_rng(seed)))
