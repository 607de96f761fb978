"""Do our runs reproduce a published number? One verdict per published number, from our seeds' t-interval.

An equivalence reading, as the claims of `docs/reproductions.md` are read (the verdicts: `verdict_from_interval`):
* the interval is our seeds' 95% Student-t interval of the mean, the one the rest of the leaderboard shows: with
  the 2–5 seeds LRA runs have it is exact for normal seed effects, where a bootstrap over seeds is too narrow
  (`lra_bench.stats.summary`); one seed has none, and its number alone says nothing about seed noise;
* the margin `MARGIN_PP` is the noise the published number carries itself: one run scored on one test set (an
  accuracy near 37% on ListOps' 2,000 test sequences has a 95% binomial half-width of 2.1 pp);
* "cannot tell" when the interval holds the published value but reaches beyond the margin: two seeds of which one
  learned the task and one did not give an interval of tens of points, which contains every published number and
  so confirms none.
Only an on-protocol row of ours of the published row's own protocol is compared with it (a run that changed a
protocol value is another experiment); a published `FAIL` gets no verdict. `reproduction_verdict` and
`reproduction_interval` take per-seed accuracies, for other pages too.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from lra_bench.leaderboard.published import FIVE_TASKS, TASKS
from lra_bench.stats.summary import t_interval

LEVEL = 0.95
ONE_SEED = "1 seed: cannot tell"
MARGIN_PP = 2.0  # a published single run's own test-set noise (module docstring), in the verdicts' unit (percent)
#: how each average a verdict is given for is computed (stated beside it wherever it is shown)
AVERAGE_CONVENTIONS = {
    "avg5": "Avg-5: mean of ListOps, Text, Retrieval, Image, Pathfinder (LRA convention, Path-X not counted)",
    "avg6": "Avg-6: mean of all six tasks, Path-X FAIL or not run = 50 (S4/Mega convention)",
}
COLUMNS = (
    "protocol",
    "published_source",
    "published_method",
    "target",
    "published",
    "method",
    "variant",
    "n",
    "mean",
    "ci_low",
    "ci_high",
    "verdict",
    "convention",
)


def reproduction_interval(accuracies: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The Student-t interval of the mean of `accuracies` (one per seed); None with fewer than 2 seeds."""
    values = [float(a) for a in accuracies]
    if len(values) < 2:
        return None
    return t_interval(statistics.fmean(values), statistics.stdev(values), len(values), level)


def mean_and_interval(accuracies: Sequence[float]) -> str:
    """`mean [low, high]` of per-seed accuracies (two decimals, no interval for one seed) as the pages print it; "—"
    without a seed."""
    if not accuracies:
        return "—"
    interval = reproduction_interval(accuracies)
    return f"{statistics.fmean(accuracies):.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def verdict_from_interval(published: float, interval: tuple[float, float] | None, n: int, level: float = LEVEL) -> str:
    """The verdict for a published value against our interval over `n` seeds (same unit as the interval)."""
    if n < 1:
        raise ValueError("no runs of ours: nothing to reproduce the published number with")
    if n < 2 or interval is None:
        return ONE_SEED
    low, high = interval
    if not low <= published <= high:
        return f"not reproduced: published {'above' if published > high else 'below'} our {level:.0%} CI"
    if published - MARGIN_PP <= low and high <= published + MARGIN_PP:
        return f"reproduced: our {level:.0%} CI within published ± {MARGIN_PP:g} pp"
    return f"cannot tell: our {level:.0%} CI holds published but reaches beyond ± {MARGIN_PP:g} pp of it"


def reproduction_verdict(accuracies: Sequence[float], published: float, level: float = LEVEL) -> str:
    """One of `reproduced: …`, `not reproduced: published above|below our 95% CI`, `cannot tell: …` or `1 seed:
    cannot tell`.

    `accuracies` are our per-seed test accuracies of one experiment, in the unit of `published` (the leaderboard
    uses percent)."""
    return verdict_from_interval(published, reproduction_interval(accuracies, level), len(accuracies), level)


def _matches(ours: dict[str, Any], pub: dict[str, Any]) -> bool:
    """Our row may be said to reproduce `pub`: same protocol, on-protocol, same attention (and landmark count when
    the paper gives one), trained from scratch."""
    return (
        ours.get("kind") == "ours"
        and pub.get("protocol") is not None
        and str(ours.get("protocol")) == str(pub["protocol"])
        and ours.get("conformance") == "on"
        and ours.get("attn") == pub.get("attn")
        and ours.get("pretraining") in (None, "none")
        and pub.get("rank_budget") in (None, ours.get("rank_budget"))
    )


def _entry(pub: dict[str, Any], ours: dict[str, Any], target: str, mean: float, n: int, ci: Any) -> dict[str, Any]:
    published = float(pub[target])
    return {
        "protocol": str(pub["protocol"]),
        "published_source": pub.get("source"),
        "published_method": pub.get("method"),
        "target": target,
        "published": published,
        "method": ours.get("method"),
        "variant": ours.get("variant") or "",
        "n": n,
        "mean": mean,
        "ci_low": ci[0] if ci else None,
        "ci_high": ci[1] if ci else None,
        "verdict": verdict_from_interval(published, ci, n),
        "convention": AVERAGE_CONVENTIONS.get(target, ""),
    }


def _average_entries(pub: dict[str, Any], ours: dict[str, Any]) -> list[dict[str, Any]]:
    """Avg-5 always (when both have it); Avg-6 only when a real Path-X number enters it on either side."""
    out = []
    for target, tasks in (("avg5", FIVE_TASKS), ("avg6", TASKS)):
        if pub.get(target) is None or ours.get(target) is None:
            continue
        if target == "avg6" and pub.get("pathx_counted_as_50") and ours.get("pathx_counted_as_50"):
            continue  # both count Path-X as 50: Avg-6 says nothing Avg-5 does not
        n = min(int(ours.get(f"{t}_n") or 0) for t in tasks if ours.get(t) is not None)
        low = ours.get(f"{target}_ci_low")
        ci = (low, ours[f"{target}_ci_high"]) if low is not None else None
        out.append(_entry(pub, ours, target, float(ours[target]), n, ci))
    return out


def reproductions(wide: Sequence[dict[str, Any]], published: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A verdict for each published number (task and average) of a protocol of ours, against each on-protocol row
    of ours of that protocol and attention with a result there. Needs `uncertainty.add_uncertainty` to have run
    (the averages' intervals)."""
    out = []
    for pub in published:
        for ours in (w for w in wide if _matches(w, pub)):
            for task in TASKS:
                accs = (ours.get("task_accuracies") or {}).get(task) or []
                if isinstance(pub.get(task), (int, float)) and accs:
                    ci = reproduction_interval(accs)
                    out.append(_entry(pub, ours, task, statistics.fmean(accs), len(accs), ci))
            out += _average_entries(pub, ours)
    return out
