"""What one benchmark configuration costs: the attention's and its selector's own cost models, for the batch.

Every attention and selector declares `flops` (and an attention `memory`) on its class (`models.cost` holds the
counting convention and the shared pieces); this module only multiplies by batch × heads, adds the selector, and
answers for the bench-only SDPA references. A component without a cost model gives None here ("unknown" in the
report) and is caught by the registry test — never silently by a missing table entry.
"""

from __future__ import annotations

import math
from typing import Any

from lra_bench.bench.references import REFERENCES, SDPAReference
from lra_bench.registry import ATTENTIONS, SELECTORS
from models.cost import Flops

Params = dict[str, Any]


def attention_flops(
    name: str,
    *,
    batch: int,
    heads: int,
    n: int,
    m: int | None,
    d: int,
    params: Params | None = None,
    selector: str | None = None,
    selector_params: Params | None = None,
) -> Flops | None:
    """Total FLOPs of one call (attention + its selector) for the batch, or None when either declares none."""
    try:
        if name in REFERENCES:
            total = SDPAReference.flops(n, m, d, params or {})
        else:
            total = ATTENTIONS.get(name).flops(n, m, d, params or {})
        if selector is not None:
            if m is None:
                return None
            total = total + SELECTORS.get(selector).flops(n, int(m), d, selector_params or {})
    except NotImplementedError:
        return None
    return total.scaled(batch * heads)


def memory_estimate(
    name: str,
    *,
    batch: int,
    heads: int,
    n: int,
    m: int | None,
    d: int,
    mode: str,
    params: Params | None = None,
    itemsize: int = 4,
) -> float | None:
    """Estimated peak bytes of one call beyond its inputs, or None when the attention declares no estimate (the
    sweep then extrapolates from its own measured smaller-n peaks)."""
    try:
        if name in REFERENCES:
            elements = SDPAReference.memory_of(name, n, d, mode)
        else:
            elements = ATTENTIONS.get(name).memory(n, m, d, mode, params or {})
    except NotImplementedError:
        return None
    return elements * batch * heads * itemsize


def extrapolate_memory(history: list[tuple[int, float]], n: int) -> float | None:
    """Peak at `n` from measured (n, peak) pairs: the last two points' log-log slope, clipped to [1, 2]
    (slope 2 — quadratic — when only one point is known)."""
    pts = sorted((x, y) for x, y in history if y and y > 0 and x < n)
    if not pts:
        return None
    (n1, y1) = pts[-1]
    slope = 2.0
    if len(pts) >= 2:
        n0, y0 = pts[-2]
        slope = min(2.0, max(1.0, math.log(y1 / y0) / math.log(n1 / n0)))
    return y1 * (n / n1) ** slope
