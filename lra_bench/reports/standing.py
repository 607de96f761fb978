"""The bench half of docs/results.md's "Where we stand": each target one line with its verdict and the figure
that decides it, what limits the methods (profiler shares), and the methods' efficiency claims.

A target's line names the deciding figures only (how many configurations met it, the best and the worst); the
per-configuration values are in `bench.json: summary.targets` and the full tables beside the page. A target that
nothing measured is one clause with the reason, never a list of every configuration.
"""

from __future__ import annotations

import math
import re
from typing import Any

from lra_bench.kit.markdown import table
from lra_bench.kit.numbers import ratio_text

CATEGORIES = (
    ("depthwise conv skip", re.compile(r"conv")),
    ("fused SDPA", re.compile(r"scaled_dot_product|flash")),
    ("matmul", re.compile(r"\b(aten::)?(bmm|mm|matmul|addmm|baddbmm|linalg_|_linalg)")),
    ("softmax", re.compile(r"softmax")),
)
REST = ("elementwise, copies, indexing", "other (below the top operators)")


def categorize(profile: dict[str, Any]) -> dict[str, float]:
    """Share of the profiled self time by category (matmul, conv, softmax, fused SDPA, the rest)."""
    shares: dict[str, float] = {}
    for row in profile["top"]:
        name = next((cat for cat, rx in CATEGORIES if rx.search(row["op"])), REST[0])
        shares[name] = shares.get(name, 0.0) + row["share"]
    covered = sum(r["share"] for r in profile["top"])
    if covered < 0.999:
        shares[REST[1]] = 1.0 - covered
    return shares


def value_text(value: float, threshold: str) -> str:
    """A target's figure in its threshold's unit: a ratio by the ratio rule, a share in %, a slope to 2 decimals."""
    if threshold.endswith("×"):
        return ratio_text(value)
    if threshold.endswith("%"):
        return f"{value:.1%}"
    return f"{value:.2f}"


def target_line(t: dict[str, Any], ns: list[int]) -> str:
    """`- **verdict** — target (threshold): how many configurations met it, the best and the worst figure`."""
    values: dict[str, float] = t.get("values") or {}
    head = f"- **{t['verdict']}** — {t['target']}, {t['threshold']}: "
    if not values:
        count = len(t.get("missing") or [])
        return (
            head
            + (f"none of {count} configurations measured" if count else "no configuration of this kind run")
            + (f" (this run's n: {', '.join(map(str, ns))})")
        )
    higher_is_better = t["threshold"].startswith("≥")
    ordered = sorted(values, key=lambda k: values[k], reverse=higher_is_better)
    failing = t.get("failing") or []
    best, worst = ordered[0], ordered[-1]
    parts = [
        f"met by {len(values) - len(failing)} of {len(values)} (best {best} {value_text(values[best], t['threshold'])})"
    ]
    if failing:
        parts.append(f"missed by {len(failing)} (worst {worst} {value_text(values[worst], t['threshold'])})")
    elif len(values) > 1:
        parts.append(f"worst {worst} {value_text(values[worst], t['threshold'])}")
    if t.get("missing"):
        parts.append(f"{len(t['missing'])} not measured")
    return head + "; ".join(parts)


def profile_table(profiles: list[dict[str, Any]]) -> list[str]:
    """One row per profiled configuration: ms per call and the share of self time by category."""
    cats = [c for c, _ in CATEGORIES] + list(REST)
    body = []
    for p in profiles:
        sh = categorize(p)
        body.append(
            [
                f"`{p['label']}` (n={p['n']})",
                f"{p['total_ms_per_call']:.0f}",
                *(f"{sh[c]:.0%}" if c in sh else "—" for c in cats),
            ]
        )
    return table(["method", "ms / call", *cats], body)


def _nlogn_slope(lo: int, hi: int) -> float:
    return math.log((hi * math.log(hi)) / (lo * math.log(lo))) / math.log(hi / lo)


def _ratios(bench: dict[str, Any], prefix: str, n: int) -> tuple[dict[str, Any], float, float, float | None] | None:
    """The configuration of `prefix` at n (m=64 if measured) and full's time, memory and FLOPs over its."""
    ok = {(r["label"], r["n"]): r for r in bench["rows"] if r["mode"] == "forward_backward" and r["status"] == "ok"}
    cands = [r for (lab, nn), r in ok.items() if lab.startswith(prefix) and nn == n]
    r = next((r for r in cands if str(r.get("m")) == "64"), cands[0] if cands else None)
    f = ok.get(("full", n))
    if r is None or f is None:
        return None
    fl = f["flops"] / r["flops"] if r.get("flops") and f.get("flops") else None
    return r, f["time_median_s"] / r["time_median_s"], f["peak_mem_bytes"] / max(r["peak_mem_bytes"], 1), fl


def efficiency_claims(bench: dict[str, Any]) -> list[str]:
    """The methods' efficiency claims, checked on the bench numbers (forward + backward), with verdicts."""
    out: list[str] = []
    ns = sorted({r["n"] for r in bench["rows"] if r["mode"] == "forward_backward" and r["status"] == "ok"})
    if not ns:
        return out
    got = _ratios(bench, "spectral/", ns[0])
    if got:
        r, t, mem, _ = got
        out.append(
            f"**(b) efficiency half (≥ 1.5× lower attention memory or latency than full):** "
            f"{'met' if max(t, mem) >= 1.5 else 'missed'} at n={ns[0]} — `{r['label']}` latency full/spectral "
            f"{ratio_text(t)}, peak memory {ratio_text(mem)} (the accuracy half is the leaderboard's)"
        )
    got = _ratios(bench, "pivoted/", ns[0])
    if got:
        r, t, mem, fl = got
        met = [name for name, value in (("FLOPs", fl or 0.0), ("memory", mem)) if value >= 2]
        out.append(
            f"**(c) cost half (≥ 2× lower attention memory or FLOPs at matched quality):** "
            f"{'met on ' + ' and '.join(met) if met else 'missed'} at n={ns[0]} — `{r['label']}` FLOPs full/pivoted "
            f"{ratio_text(fl, undefined='FLOPs not counted')}, peak memory {ratio_text(mem)}, latency {ratio_text(t)}"
        )
    for s in bench["summary"]["slopes"]:
        lab = s["label"]
        if lab.startswith("gpa/") and lab.endswith("m=log2") and s["mode"] == "forward_backward" and s["time_slope"]:
            out.append(
                f"**(a) O(n log n) cost with m = log₂ n:** `{lab}` time grows as n^{s['time_slope']:.2f}, memory "
                f"as n^{(s['memory_slope'] or float('nan')):.2f} over n={s['n_min']}…{s['n_max']} (n log n: "
                f"n^{_nlogn_slope(s['n_min'], s['n_max']):.2f})"
            )
    got = _ratios(bench, "polynomial", ns[-1])
    if got:
        r, t, mem, fl = got
        flops = ratio_text(fl, undefined="FLOPs not counted")
        out.append(
            f"**(d) exact degree-2 polynomial attention (528 features per head at d = 32):** at n={ns[-1]} "
            f"{ratio_text(t)} the speed of `full`, FLOPs full/polynomial {flops}, peak memory "
            f"{ratio_text(mem)}" + (f"; its FLOPs fall below softmax's for n > {ns[-1] / fl:.0f}" if fl else "")
        )
    return out
