"""Is A faster than B? A step-time ratio with an interval, or "too few timed steps to tell".

Why not just the ratio of the two medians: a run's median step time is itself an estimate, and one timed step
(`max_steps=6` with 5 warm-up steps) on a loaded machine once gave "B is 23× faster" for two models of the same
size. So a ratio is only called a speed difference when its interval excludes 1.

Method (on the log scale, where a ratio is a difference):

* **One run** with `n` timed steps, median `m` and interquartile range `IQR`: the sample median has asymptotic
  standard error √(π/2)·σ/√n for a normal distribution, with σ estimated robustly as IQR/1.349 (the IQR of a
  normal is 1.349σ); by the delta method SE(log m) ≈ SE(m)/m. Runs with fewer than `MIN_TIMED_STEPS` timed steps
  get no interval at all: the asymptotics need a sample, and a handful of steps can sit wholly inside a burst of
  machine load.
* **One side** (several seeds): the mean of its runs' log medians (the geometric mean of the medians). Its
  variance is the larger of the within-run part, Σ SE²/k², and — with k ≥ 2 runs — the across-run part, s²/k
  (s: the sd of the runs' log medians, k − 1 degrees of freedom). The across-run spread also holds what varied
  between runs (other jobs, clocks, caches), which no within-run IQR sees.
* **The ratio A/B** = exp(mean log A − mean log B), its variance the sum of the two sides' (`_with_interval`); the
  average over tasks is the geometric mean of the task ratios, variance Σ var/K².

Calibration (simulated runs, normal or log-normal step times): a nominal 95% interval covers the true ratio about
95% of the time with 40 timed steps per run, and about 91% at the minimum of 10 — the median's asymptotics are
still settling there.

What no interval covers: a *systematic* difference in machine load between the runs of A and those of B (A timed
while another job ran, B alone). That is why the comparison prints the load each side was timed under.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

#: fewer timed steps than this in any run and no speed verdict is given
MIN_TIMED_STEPS = 10
#: asymptotic SE of a sample median in units of σ/√n, normal distribution: √(π/2)
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
#: the IQR of a normal distribution in units of σ: 2·Φ⁻¹(0.75)
NORMAL_IQR = 2 * float(stats.norm.ppf(0.75))

OK = "ok"
TOO_FEW = "too few timed steps"
UNKNOWN = "spread unknown"
UNMEASURED = "not measured"


@dataclass(frozen=True)
class Timing:
    """One run's step-time measurement: the median, how many steps it is over and their IQR (None: unknown)."""

    median_s: float | None
    timed_steps: int | None = None
    iqr_s: float | None = None

    @property
    def log_se(self) -> float:
        """SE of log(median) (see the module): √(π/2) · (IQR/1.349) / (√n · median)."""
        assert self.median_s and self.timed_steps and self.iqr_s is not None
        return MEDIAN_SE_FACTOR * (self.iqr_s / NORMAL_IQR) / (math.sqrt(self.timed_steps) * self.median_s)


@dataclass(frozen=True)
class SpeedRatio:
    """A / B step time (< 1: A is faster). `ci` only when `status` is OK; `reason` says why not otherwise."""

    ratio: float | None
    ci: tuple[float, float] | None
    status: str
    reason: str = ""
    log_var: float | None = None
    df: float = math.inf

    def faster(self) -> str | None:
        """Which side is faster ("A" or "B") when the interval excludes 1, else None (no speed difference)."""
        if self.ci is None:
            return None
        if self.ci[1] < 1.0:
            return "A"
        return "B" if self.ci[0] > 1.0 else None


def _logs(timings: Sequence[Timing]) -> list[float]:
    return [math.log(t.median_s) for t in timings]  # type: ignore[arg-type]


def _side_variance(timings: Sequence[Timing]) -> tuple[float, float]:
    """(variance, df) of one side's mean log median (see the module): the larger of the within-run and the
    across-run part."""
    k = len(timings)
    within = sum(t.log_se**2 for t in timings) / k**2
    across = statistics.variance(_logs(timings)) / k if k >= 2 else 0.0
    return (across, k - 1.0) if across > within else (within, math.inf)


def _with_interval(log_ratio: float, parts: Sequence[tuple[float, float]], level: float) -> SpeedRatio:
    """The ratio with its interval, its log's variance the sum of independent (variance, df) parts: Student's t
    with Welch–Satterthwaite df, where an inf part (the normal approximation) adds nothing to the denominator; the
    normal when no part has a finite df."""
    var = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts if v > 0 and math.isfinite(df))
    df = var * var / denom if denom > 0 else math.inf
    q = 0.5 + level / 2
    half = float(stats.norm.ppf(q) if math.isinf(df) else stats.t.ppf(q, df)) * math.sqrt(var)
    return SpeedRatio(math.exp(log_ratio), (math.exp(log_ratio - half), math.exp(log_ratio + half)), OK, "", var, df)


def _problem(a: Sequence[Timing], b: Sequence[Timing]) -> tuple[str, str] | None:
    """(status, reason) when the runs cannot give an interval, else None."""
    unknown = [
        name for name, side in (("A", a), ("B", b)) if any(t.timed_steps is None or t.iqr_s is None for t in side)
    ]
    if unknown:
        whose = " and ".join(unknown)
        return UNKNOWN, f"{whose}'s records do not say how many steps were timed or their spread (older records)"
    if min(t.timed_steps or 0 for t in (*a, *b)) < MIN_TIMED_STEPS:  # (None was answered above)
        return TOO_FEW, f"needs ≥ {MIN_TIMED_STEPS} timed steps in every run"
    return None


def speed_ratio(a: Sequence[Timing], b: Sequence[Timing], level: float = 0.95) -> SpeedRatio:
    """A / B of the sides' geometric-mean median step times, with its interval when both sides allow one."""
    if not a or not b or any(not t.median_s or t.median_s <= 0 for t in (*a, *b)):
        return SpeedRatio(None, None, UNMEASURED, "no median step time on every run")
    log_ratio = statistics.fmean(_logs(a)) - statistics.fmean(_logs(b))
    problem = _problem(a, b)
    if problem is not None:
        return SpeedRatio(math.exp(log_ratio), None, *problem)
    return _with_interval(log_ratio, [_side_variance(a), _side_variance(b)], level)


def average_speed_ratio(ratios: Sequence[SpeedRatio], level: float = 0.95) -> SpeedRatio:
    """The geometric mean of task ratios (tasks weigh equally), with an interval when every task has one."""
    known = [r for r in ratios if r.ratio is not None]
    if not known:
        return SpeedRatio(None, None, UNMEASURED, "no task has a step-time ratio")
    log_ratio = statistics.fmean(math.log(r.ratio) for r in known)  # type: ignore[arg-type]
    if len(known) < len(ratios) or any(r.status != OK for r in known):
        return SpeedRatio(math.exp(log_ratio), None, TOO_FEW, "not every task has a step-time interval")
    k = len(known)
    return _with_interval(log_ratio, [(r.log_var / k**2, r.df) for r in known], level)  # type: ignore[operator]
