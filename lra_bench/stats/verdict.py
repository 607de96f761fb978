"""One plain sentence per comparison: who wins, by how much, how sure — or that the data cannot tell.

"Significant" means the p-value of the result's own test is below alpha *and* the interval printed beside it
excludes 0. Over seeds both come from the same t-test, so the two always agree; for one seed the interval is a
bootstrap and the p-value an exact test, which can disagree at the margin — requiring both keeps the sentence
from contradicting its own numbers (at the price of being slightly conservative there).
"""

from __future__ import annotations

import math

from lra_bench.stats import core
from lra_bench.stats.paired import NO_TEST, PairedResult


def _pp(value: float) -> str:
    return f"{100 * value:.1f}"


def interval_text(ci: tuple[float, float], level: float = 0.95) -> str:
    lo, hi = ci
    sep = "–" if lo >= 0 else " to "
    return f"{round(100 * level)}% CI {_pp(lo)}{sep}{_pp(hi)}"


def p_text(p: float) -> str:
    return f"p = {p:.2g}" if p < 0.001 else f"p = {p:.3f}"


def _evidence(result: PairedResult, ci: tuple[float, float] | None, level: float) -> str:
    seeds = f"{result.n_seeds} seed{'s' if result.n_seeds != 1 else ''}"
    parts = [interval_text(ci, level)] if ci is not None else []
    parts.append(seeds if result.p is None else f"{seeds}; {result.test} {p_text(result.p)}")
    return ", ".join(parts)


def significant(result: PairedResult, alpha: float = 0.05) -> bool:
    """`core.significant` for one result: p < alpha and the interval excludes 0."""
    if result.p is None:
        return False
    low, high = result.ci if result.ci is not None else (math.nan, math.nan)
    return bool(core.significant(result.p, low, high, result.delta, alpha))


def verdict(a: str, b: str, where: str, result: PairedResult, alpha: float = 0.05, level: float = 0.95) -> str:
    """E.g. "gpa beats nystrom on ListOps by 1.2 pp (95% CI 0.3–2.1, 3 seeds; paired t-test over seeds p = 0.012)"."""
    note = f" — {result.note}" if result.note else ""
    if result.test == NO_TEST or result.p is None:
        return f"cannot tell whether {a} or {b} is better on {where} (Δ = {100 * result.delta:+.1f} pp){note}"
    if significant(result, alpha):
        if result.delta > 0:
            winner, loser, ci = a, b, result.ci
        else:
            winner, loser = b, a
            ci = (-result.ci[1], -result.ci[0]) if result.ci is not None else None
        return (
            f"{winner} beats {loser} on {where} by {_pp(abs(result.delta))} pp ({_evidence(result, ci, level)}){note}"
        )
    return (
        f"no significant difference between {a} and {b} on {where} "
        f"(Δ = {100 * result.delta:+.1f} pp, {_evidence(result, result.ci, level)}){note}"
    )
