"""One plain sentence per comparison: who wins, by how much, how sure — or that the data cannot tell.

"Significant" means the p-value of the result's own test is below alpha *and* the interval printed beside it
excludes 0. Over seeds both come from the same t-test, so the two always agree; for one seed the interval is a
bootstrap and the p-value an exact test, which can disagree at the margin — requiring both keeps the sentence
from contradicting its own numbers (at the price of being slightly conservative there).

Several tasks: each task's sentence decides on its Holm-adjusted p (`Adjustment`), and says so: with six tasks at
α = 0.05 on the raw p, about one comparison of equal methods in four (1 − 0.95⁶ = 26%) prints a spurious "beats".

One seed per method: the test covers the test set, not the training seed, so under a seed noise of 1–3 pp two
equal methods get "A beats B" 17–55% of the time. At one seed the sentence is therefore about *these two trained
models* (never "method A beats method B") and asks for at least `METHOD_SEEDS` seeds per method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lra_bench.stats import core
from lra_bench.stats.paired import NO_TEST, PairedResult

#: the seeds per method a sentence about the methods (not two trained models) asks for
METHOD_SEEDS = 3


@dataclass(frozen=True)
class Adjustment:
    """A multiplicity-adjusted p-value (Holm's step-down) of a result that is one of `family` tests."""

    p: float | None
    family: int


def _pp(value: float) -> str:
    return f"{100 * value:.1f}"


def interval_text(ci: tuple[float, float], level: float = 0.95) -> str:
    lo, hi = ci
    sep = "–" if lo >= 0 else " to "
    return f"{round(100 * level)}% CI {_pp(lo)}{sep}{_pp(hi)}"


def p_text(p: float, prefix: str = "p = ") -> str:
    """A p-value as every report prints it: two significant figures below 0.001, else three decimals."""
    return f"{prefix}{p:.2g}" if p < 0.001 else f"{prefix}{p:.3f}"


def _evidence(result: PairedResult, ci: tuple[float, float] | None, level: float, adjusted: Adjustment | None) -> str:
    seeds = f"{result.n_seeds} seed{'s' if result.n_seeds != 1 else ''}"
    parts = [interval_text(ci, level)] if ci is not None else []
    tests = seeds if result.p is None else f"{seeds}; {result.test} {p_text(result.p)}"
    if adjusted is not None and adjusted.p is not None:
        tests += f", Holm-adjusted over {adjusted.family} tasks {p_text(adjusted.p)}"
    parts.append(tests)
    return ", ".join(parts)


def significant(result: PairedResult, alpha: float = 0.05, adjusted: Adjustment | None = None) -> bool:
    """`core.significant` for one result: p (adjusted, when given: the result is one of several tests) < alpha
    and the interval excludes 0."""
    p = adjusted.p if adjusted is not None else result.p
    if p is None:
        return False
    low, high = result.ci if result.ci is not None else (math.nan, math.nan)
    return bool(core.significant(p, low, high, result.delta, alpha))


def _subjects(a: str, b: str, result: PairedResult) -> tuple[str, str]:
    """What the sentence is about: the methods (≥ 2 seeds), or the two trained models (1 seed)."""
    if result.n_seeds != 1:
        return a, b
    seeds = {str(o.seed) for o in result.outcomes}
    which = f" (seed {seeds.pop()})" if len(seeds) == 1 else " (one seed per task)"
    return f"this trained {a} model{which}", f"this trained {b} model{which}"


def _tail(result: PairedResult) -> str:
    notes = [result.note] if result.note else []
    if result.n_seeds == 1:
        notes.append(
            f"one trained model per method says nothing about the methods: run ≥ {METHOD_SEEDS} seeds per method to "
            "compare them"
        )
    return f" — {'; '.join(notes)}" if notes else ""


def verdict(
    a: str,
    b: str,
    where: str,
    result: PairedResult,
    alpha: float = 0.05,
    level: float = 0.95,
    adjusted: Adjustment | None = None,
) -> str:
    """E.g. "gpa beats nystrom on ListOps by 1.2 pp (95% CI 0.3–2.1, 3 seeds; paired t-test over seeds p = 0.012)".

    `adjusted`: the Holm-adjusted p when this is one of several tasks; the verdict decides on it and prints both."""
    a, b = _subjects(a, b, result)
    tail = _tail(result)
    if result.test == NO_TEST or result.p is None:
        return f"cannot tell whether {a} or {b} is better on {where} (Δ = {100 * result.delta:+.1f} pp){tail}"
    if significant(result, alpha, adjusted):
        if result.delta > 0:
            winner, loser, ci = a, b, result.ci
        else:
            winner, loser = b, a
            ci = (-result.ci[1], -result.ci[0]) if result.ci is not None else None
        evidence = _evidence(result, ci, level, adjusted)
        return f"{winner} beats {loser} on {where} by {_pp(abs(result.delta))} pp ({evidence}){tail}"
    return (
        f"no significant difference between {a} and {b} on {where} "
        f"(Δ = {100 * result.delta:+.1f} pp, {_evidence(result, result.ci, level, adjusted)}){tail}"
    )
