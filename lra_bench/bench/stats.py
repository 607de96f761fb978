"""Robust summaries shared by the bench and approx apps: median + IQR, mean ± std, log-log slopes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, quartiles and IQR of `values` (numpy's linear interpolation); None entries when empty."""
    if not values:
        return {"median": None, "q1": None, "q3": None, "iqr": None, "min": None, "count": 0}
    arr = np.asarray(values, dtype=float)
    q1, med, q3 = (float(x) for x in np.percentile(arr, [25, 50, 75]))
    return {"median": med, "q1": q1, "q3": q3, "iqr": q3 - q1, "min": float(arr.min()), "count": int(arr.size)}


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1; 0.0 for a single value), ignoring NaN/None."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return None, None
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def loglog_slope(
    xs: Sequence[float], ys: Sequence[float], lo: float | None = None, hi: float | None = None
) -> float | None:
    """Least-squares slope of log(y) on log(x) over the points with lo ≤ x ≤ hi and y > 0 (None if < 2)."""
    pts = [
        (math.log(x), math.log(y))
        for x, y in zip(xs, ys)
        if y is not None and y > 0 and (lo is None or x >= lo) and (hi is None or x <= hi)
    ]
    if len({p[0] for p in pts}) < 2:
        return None
    lx, ly = np.array(pts).T
    return float(np.polyfit(lx, ly, 1)[0])
