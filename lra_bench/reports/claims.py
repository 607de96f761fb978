"""The approximation half of docs/results.md's "Where we stand": each claim of the methods one line with its
verdict and the figures that decide it, read from the structured verdicts of `lra_bench.approx.summary`.

The study's own verdict paragraphs (every input, solve and m) stay in `approx.json` and in the approx.md rendered
beside the page; a line here says what a reader needs first: met or not, on how many inputs, by how much.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lra_bench.approx.report import CLAIM_TITLES
from lra_bench.kit.numbers import ratio_text


def share_verdict(hits: int, total: int) -> str:
    """met (all), partly met (some), missed (none) or not measured (no case) — for a claim tested case by case."""
    if not total:
        return "not measured"
    return "met" if hits == total else ("partly met" if hits else "missed")


def reduction_text(value: float) -> str:
    """k-means' error reduction against uniform; past −100% as the ratio of the two errors (a reduction of −2564%
    reads as a figure, "k-means 26.6× uniform's error" says what happened)."""
    return f"{value:+.0%}" if value >= -1 else f"none (k-means {ratio_text(1 - value)} uniform's error)"


def kmeans_line(v: dict[str, Any]) -> str:
    """(a): on how many inputs the claimed reduction is reached per solve, and the mean reduction per input."""
    per_solve = v.get("per_solve") or {}
    if not per_solve:
        return f"**not measured** — {v['verdict']}"
    main = v["solve"]
    by_source = per_solve[main]["by_source"]
    measured = [s for s in by_source if "mean_reduction" in s]
    reached = [s["source"] for s in measured if s.get("reached_m")]
    figures = ", ".join(f"{s['source']} {reduction_text(s['mean_reduction'])}" for s in measured)
    others = "; ".join(
        f"{solve}: {sum(1 for s in p['by_source'] if s.get('reached_m'))}/{len(p['by_source'])}"
        for solve, p in per_solve.items()
        if solve != main
    )
    unmeasurable = len(by_source) - len(measured)
    if not measured:
        return (
            f"**not measured** — {main} solve: uniform worse than Â = 0 on every pair of all {unmeasurable} inputs"
            + (f" (reached with the other solves: {others})" if others else "")
        )
    return (
        f"**{share_verdict(len(reached), len(measured))}** — {main} solve: reached on {len(reached)}/{len(measured)} "
        f"inputs ({', '.join(reached) or 'none'}); mean error reduction against uniform: {figures}"
        + (f"; {unmeasurable} not measurable (uniform worse than Â = 0)" if unmeasurable else "")
        + (f" (reached with the other solves: {others})" if others else "")
    )


def floor_line(v: dict[str, Any]) -> str:
    """(a, c): the selection closest to the optimum on each input, and how often the stable solve exploded."""
    rows = [r for r in v.get("rows") or [] if r["pooled_ratio"] is not None]
    if not rows:
        return f"**not measured** — {v['verdict']}"
    best = []
    for source in dict.fromkeys(r["source"] for r in rows):
        mine = [
            r for r in rows if r["source"] == source and (r["solve"] == "stable" or r["method"].startswith("attn:"))
        ]
        if mine:
            top = min(mine, key=lambda r: r["pooled_ratio"])
            best.append(f"{source} {top['method']} {ratio_text(top['pooled_ratio'], top['limit'])}")
    exploded = [r for r in rows if r["limit"] is not None and r["pooled_ratio"] > r["limit"]]
    return (
        f"**measured** — error / Eckart–Young floor, best per input: {', '.join(best)}; "
        f"{len(exploded)}/{len(rows)} (input, method, solve) cells worse than Â = 0"
    )


def solves_line(v: dict[str, Any]) -> str:
    """(instrument): the share of selector evaluations worse than Â = 0 under each core solve, over all inputs."""
    rows = v.get("rows") or []
    if not rows:
        return f"**not measured** — {v['verdict']}"
    totals: dict[str, list[int]] = {}
    for r in rows:
        acc = totals.setdefault(r["solve"], [0, 0])
        acc[0] += r["worse"]
        acc[1] += r["total"]
    return "**measured** — worse than Â = 0: " + ", ".join(
        f"{solve} solve {w}/{t} ({w / t:.0%})" for solve, (w, t) in totals.items() if t
    )


def rank_line(v: dict[str, Any]) -> str:
    """(d): on how many informative inputs exp(QKᵀ/√d) exceeds the degree-2 kernel's rank bound."""
    rows = [r for r in v.get("rows") or [] if r["n"] > r["bound_poly2"]]
    if not rows:
        return "**not measured** — no input longer than the degree-2 bound C(d+1,2)"
    exceed = [r for r in rows if r["exp_numerical_rank"] > r["bound_poly2"]]
    figures = ", ".join(f"{r['source']} {r['exp_numerical_rank']:.0f} vs {r['bound_poly2']}" for r in rows)
    return (
        f"**exp above the bound on {len(exceed)}/{len(rows)} informative inputs** — numerical rank of exp vs "
        f"C(d+1,2): {figures}"
    )


def pivoted_line(v: dict[str, Any]) -> str:
    """(c): in how many (input, m) cells residual-pivoted attention has the lower output error than uniform."""
    rows = v.get("rows") or []
    parts, verdicts = [], []
    for solve in ("stable", "training"):
        cells = [r for r in rows if f"lower_{solve}" in r]
        if cells:
            wins = sum(r[f"lower_{solve}"] for r in cells)
            parts.append(f"lower than uniform ({solve} solve) in {wins}/{len(cells)} (input, m) cells")
            verdicts.append(share_verdict(wins, len(cells)))
    if not parts:
        return "**not measured**"
    return f"**{verdicts[0]}** — " + "; ".join(parts)


def spectral_line(v: dict[str, Any]) -> str:
    """(b): on how many inputs the residual falls as s grows, with its first and last value."""
    rows = v.get("rows") or []
    if not rows:
        return "**not measured**"
    mono = sum(r["monotone"] for r in rows)
    figures = ", ".join(f"{r['source']} {r['output_residual'][0]:.3g} → {r['output_residual'][-1]:.3g}" for r in rows)
    return f"**{share_verdict(mono, len(rows))}** — residual falls with s on {mono}/{len(rows)} inputs: {figures}"


LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "gpa_kmeans": kmeans_line,
    "floor_ratio": floor_line,
    "solves": solves_line,
    "poly_rank": rank_line,
    "pivoted_output": pivoted_line,
    "spectral_s": spectral_line,
}


def claim_lines(verdicts: list[dict[str, Any]]) -> list[str]:
    """One markdown bullet per claim: its title, then its verdict and deciding figures."""
    out = []
    for v in verdicts:
        line = LINES.get(v["claim"], lambda v: v["verdict"])(v)
        out.append(f"- {CLAIM_TITLES.get(v['claim'], v['claim'])} {line}")
    return out
