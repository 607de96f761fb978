"""Uncertainty on the leaderboard: a confidence interval for every mean over seeds, and ranks that call a tie a tie.

New columns on the rows `aggregate` built (`GROUP_COLUMNS`, `WIDE_COLUMNS`; nothing there changes). An average's
interval combines the tasks' seed spreads (Welch–Satterthwaite); a Path-X counted as 50 is a constant and adds none.
Every interval is clipped to [0, 100] (`ACCURACY_RANGE`): a t-interval over few seeds near 100% (or 0%) reaches past
what an accuracy can be, and a bar or a cell beyond it reads as a measurement; every table and plot says so
(`CLIPPED`, `ERROR_BARS`). Clipping never changes which intervals overlap, so the ranks are the same either way.
Ranks (`lra_bench.stats.summary.tie_aware_ranks`) only among on-protocol rows within one protocol (and task): an
off-protocol run (more steps, another precision) or an unchecked one is another experiment, and ranking it in would
push the rows that kept the protocol down for a reason the protocol excludes. Those keep their interval, unranked.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from lra_bench.leaderboard.published import FIVE_TASKS, PATHX_FAIL_SCORE, TASKS
from lra_bench.stats.summary import average_interval, t_interval, tie_aware_ranks

LEVEL = 0.95
ACCURACY_RANGE = (0.0, 100.0)
#: what every table and plot with these intervals says about them
CLIPPED = "intervals are clipped to [0, 100] (an accuracy cannot leave it): an end shown as 0.00 or 100.00 was cut"
ERROR_BARS = f"error bars: {LEVEL:.0%} CI over seeds (Student-t; none for one seed), clipped to [0, 100]"
GROUP_COLUMNS = ("test_acc_ci_low", "test_acc_ci_high", "rank")
WIDE_COLUMNS = (
    *(f"{t}_{c}" for t in TASKS for c in ("ci_low", "ci_high", "rank")),
    *(key for avg in ("avg5", "avg6") for key in (f"{avg}_ci_low", f"{avg}_ci_high", f"rank_{avg}")),
)


def _set_interval(row: dict[str, Any], prefix: str, ci: tuple[float, float] | None) -> None:
    """`<prefix>_ci_low/high`: `ci` cut to `ACCURACY_RANGE` (None without an interval)."""
    low, high = ACCURACY_RANGE
    clipped = (max(low, min(high, ci[0])), max(low, min(high, ci[1]))) if ci is not None else (None, None)
    row[f"{prefix}_ci_low"], row[f"{prefix}_ci_high"] = clipped


RANKED = "on"  # the one conformance class that is ranked


def _rank(rows: Sequence[dict[str, Any]], prefix: str, out_key: str, by: Sequence[str]) -> None:
    """Tie-aware ranks of the on-protocol `rows` within each group of equal `by` values, from
    `<prefix>_ci_low/high`; every other row gets rank None."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        row[out_key] = None
        if row.get("conformance") == RANKED:
            groups[tuple(row.get(k) for k in by)].append(row)
    for members in groups.values():
        intervals = [
            (r[f"{prefix}_ci_low"], r[f"{prefix}_ci_high"]) if r.get(f"{prefix}_ci_low") is not None else None
            for r in members
        ]
        for row, rank in zip(members, tie_aware_ranks(intervals)):
            row[out_key] = rank


def _average(row: dict[str, Any], tasks: Sequence[str], pathx_as_constant: bool) -> tuple[float, float] | None:
    parts: list[tuple[float, float | None, int | None]] = []
    for task in tasks:
        mean = row.get(task)
        if mean is None:
            if task == "pathx" and pathx_as_constant:
                parts.append((PATHX_FAIL_SCORE, None, None))
                continue
            return None
        parts.append((float(mean), row.get(f"{task}_std"), row.get(f"{task}_n")))
    result = average_interval(parts, LEVEL)
    return result[1] if result is not None else None


def add_uncertainty(rows: Sequence[dict[str, Any]], wide: Sequence[dict[str, Any]]) -> None:
    """Add the interval and rank columns to `rows` (groups) and `wide` (our methods), in place."""
    for row in rows:
        _set_interval(
            row, "test_acc", t_interval(row.get("test_acc_mean"), row.get("test_acc_std"), row.get("n"), LEVEL)
        )
    _rank(rows, "test_acc", "rank", by=("protocol", "task"))
    ours = [r for r in wide if r.get("kind") == "ours"]
    for row in ours:
        for task in TASKS:
            _set_interval(row, task, t_interval(row.get(task), row.get(f"{task}_std"), row.get(f"{task}_n"), LEVEL))
        _set_interval(row, "avg5", _average(row, FIVE_TASKS, False) if row.get("avg5") is not None else None)
        _set_interval(row, "avg6", _average(row, TASKS, True) if row.get("avg6") is not None else None)
    for prefix, out_key in (*((t, f"{t}_rank") for t in TASKS), ("avg5", "rank_avg5"), ("avg6", "rank_avg6")):
        _rank(ours, prefix, out_key, by=("protocol",))
