"""Numbers in reports: the median of what is known (`median_of`), and how a ratio is printed: never with more
than its inputs can support (issue 21: docs/results.md printed `676682359.81×` as a finding).

The rule, in one place (`ratio_text`):

* three significant figures (`1.72×`, `57×`, `403×`): a ratio of measured times or summed errors carries no more;
* no ratio when its denominator is noise (`None` from the caller, e.g. an Eckart–Young floor below 1% of ‖A‖_F):
  "not meaningful" with the reason;
* above `limit`, the largest value the inputs can show as a ratio (for error / floor: ‖A‖_F / floor, the ratio
  of predicting Â = 0), only the bound and what crossing it means: the digits beyond measure how an unstable
  solve exploded, not how far a selection is from the optimum.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

#: significant figures of a printed ratio
RATIO_DIGITS = 3


def ratio_text(
    ratio: float | None,
    limit: float | None = None,
    beyond: str = "worse than Â = 0",
    undefined: str = "denominator below the noise floor",
) -> str:
    """`ratio` as `1.72×`; `> {limit}× ({beyond})` above `limit`; `not meaningful ({undefined})` for None."""
    if ratio is None:
        return f"not meaningful ({undefined})"
    if limit is not None and ratio > limit:
        return f"> {limit:.{RATIO_DIGITS}g}× ({beyond})"
    return f"{ratio:.{RATIO_DIGITS}g}×"


def median_of(values: Iterable[Any]) -> float | None:
    """The median of the values that are known (None skipped); None when none is. A record's missing number (an
    older schema, a failed measurement) never counts as 0."""
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None
