"""One table of runs from their records, and the one statistic each quantity takes over a row's seeds.

The leaderboard, compare and the reproductions page summarise the same per-run numbers over seeds. Each used to
read them from the records and reduce them on its own, and once two readers disagreed for one quantity (peak memory
over seeds: the median in compare, the maximum in the leaderboard's plot — 2,788 vs 2,830 MiB for the same runs).
Here the records become one `pandas` table (`runs_table`, a line per record) and `OVER_SEEDS` says, once, how each
quantity is reduced; `over_seeds` applies it, so every reader shows the same number for the same runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from lra_bench.record.reader import typed

#: how each per-run quantity is summarised over seeds, everywhere it is shown: accuracies by their mean (with the
#: sample sd and interval beside it), the run's median step time, its throughput and its peak memory by the median
#: (one run slowed by a loaded machine does not move it), the parameter count by the maximum (equal across seeds of
#: one experiment)
OVER_SEEDS: dict[str, str] = {
    "test": "mean",
    "val": "mean",
    "step_time_median_s": "median",
    "tokens_per_s": "median",
    "peak_memory_mib": "median",
    "params": "max",
}
#: the record's `metrics` a line carries as they are (accuracies are carried in percent, as `test` and `val`)
MEASURED = ("step_time_median_s", "tokens_per_s", "peak_memory_mib", "params")
COLUMNS = ("path", "record", "status", "seed", "finished_at", "test", "val", *MEASURED)


def as_percent(value: Any) -> float | None:
    """Our records hold accuracy as a fraction (torchmetrics); papers print percent. Values > 1 are percent."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number):
        return None
    return number * 100.0 if number <= 1.0 else number


def runs_table(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """A line per record: where it is (`path`: its `_path`), the record itself, its status, seed and end time, its
    accuracies in percent and its measured numbers (NaN where a record has none)."""
    lines = []
    for rec in records:
        read = typed(rec)
        lines.append(
            {
                "path": rec.get("_path"),
                "record": rec,
                "status": rec.get("status"),
                "seed": rec.get("seed"),
                "finished_at": str(read.run.finished_at or ""),
                "test": as_percent(read.metrics.test_acc),
                "val": as_percent(read.metrics.val_acc),
                **{key: read.metrics.get(key) for key in MEASURED},
            }
        )
    frame = pd.DataFrame(lines, columns=list(COLUMNS))
    numeric = ["test", "val", *MEASURED]
    frame[numeric] = frame[numeric].apply(pd.to_numeric, errors="coerce")
    return frame


def over_seeds(runs: pd.DataFrame, quantities: Sequence[str] = tuple(OVER_SEEDS)) -> dict[str, float | None]:
    """Each quantity of `runs` (a slice of `runs_table`) reduced by its `OVER_SEEDS` statistic; None where no run
    has it."""
    out: dict[str, float | None] = {}
    for key in quantities:
        known = runs[key].dropna()
        value = getattr(known, OVER_SEEDS[key])() if len(known) else None
        out[key] = None if value is None or pd.isna(value) else float(value)
    return out
