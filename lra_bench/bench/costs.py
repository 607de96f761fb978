"""What one benchmark configuration costs: the attention's and its selector's own cost models, for the batch.

Every attention and selector declares `flops` (and an attention `memory`) on its class (`models.cost` holds the
counting convention and the shared pieces); this module only multiplies by batch × heads, adds the selector, and
answers for the bench-only SDPA references. A component without a cost model gives None here ("unknown" in the
report) and is caught by the registry test — never silently by a missing table entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lra_bench.bench.references import REFERENCES, SDPAReference
from lra_bench.registry import ATTENTIONS, SELECTORS
from models.cost import Flops

Params = dict[str, Any]


@dataclass(frozen=True)
class Point:
    """One benchmark configuration at one length: what the cost models are asked about."""

    attn: str
    batch: int
    heads: int
    n: int
    m: int | None
    d: int
    params: Params = field(default_factory=dict)
    selector: str | None = None
    selector_params: Params = field(default_factory=dict)

    @classmethod
    def of(cls, spec: dict[str, Any]) -> Point:
        """From a sweep's spec (`lra_bench.bench.sweep.spec_for`)."""
        return cls(
            attn=spec["attn"],
            batch=spec["B"],
            heads=spec["H"],
            n=spec["n"],
            m=spec["m_value"],
            d=spec["d"],
            params=spec.get("attn_params") or {},
            selector=spec.get("selector"),
            selector_params=spec.get("selector_params") or {},
        )


def attention_flops(p: Point) -> Flops | None:
    """Total FLOPs of one call (attention + its selector) for the batch, or None when either declares none."""
    try:
        if p.attn in REFERENCES:
            total = SDPAReference.flops(p.n, p.m, p.d, p.params)
        else:
            total = ATTENTIONS.get(p.attn).flops(p.n, p.m, p.d, p.params)
        if p.selector is not None:
            if p.m is None:
                return None
            total = total + SELECTORS.get(p.selector).flops(p.n, int(p.m), p.d, p.selector_params)
    except NotImplementedError:
        return None
    return total.scaled(p.batch * p.heads)


def memory_estimate(p: Point, mode: str, itemsize: int = 4) -> float | None:
    """Estimated peak bytes of one call beyond its inputs, or None when the attention declares no estimate (the
    sweep then extrapolates from its own measured smaller-n peaks)."""
    try:
        if p.attn in REFERENCES:
            elements = SDPAReference.memory_of(p.attn, p.n, p.d, mode)
        else:
            elements = ATTENTIONS.get(p.attn).memory(p.n, p.m, p.d, mode, p.params)
    except NotImplementedError:
        return None
    return elements * p.batch * p.heads * itemsize


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
