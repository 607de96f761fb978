"""From per-(instance, seed, method, m) rows to the numbers that answer methods.md, as computed verdicts.

Mean ± sample std is taken over every (instance, seed) pair of a source: for synthetic sources one seed = one
freshly generated matrix (and the selectors' seed); for model sources the instances are (sequence, layer,
head) and each is scored under every selector seed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from lra_bench.bench.stats import mean_std

METRICS = ("matrix_residual", "output_residual", "ey_floor", "ey_ratio")


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± std of each metric per (source, group, label, m)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in _ok(rows):
        groups[(r["source"], r["group"], r["label"], r["m"])].append(r)
    out = []
    for (source, group, label, m), rs in groups.items():
        entry: dict[str, Any] = {
            "source": source,
            "group": group,
            "label": label,
            "m": m,
            "count": len(rs),
            "target": rs[0].get("target"),
            "rank_budget": rs[0].get("rank_budget"),
        }
        for key in METRICS:
            entry[key], entry[key + "_std"] = mean_std([r.get(key) for r in rs])
        out.append(entry)
    return out


def paired_reduction(
    rows: list[dict[str, Any]], better: str, base: str, metric: str = "matrix_residual", group: str = "selector"
) -> list[dict[str, Any]]:
    """1 − err(better)/err(base) on the same (instance, seed, m), summarised per (source, m)."""
    idx = {(r["source"], r["instance"], r["seed"], r["m"], r["label"]): r for r in _ok(rows) if r["group"] == group}
    per: dict[tuple, list[float]] = defaultdict(list)
    for (source, inst, seed, m, label), r in idx.items():
        if label != better:
            continue
        b = idx.get((source, inst, seed, m, base))
        if b is None or not b.get(metric) or r.get(metric) is None:
            continue
        per[(source, m)].append(1.0 - r[metric] / b[metric])
    out = []
    for (source, m), values in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        mean, std = mean_std(values)
        out.append(
            {
                "source": source,
                "m": m,
                "reduction": mean,
                "reduction_std": std,
                "wins": sum(v > 0 for v in values),
                "pairs": len(values),
            }
        )
    return out


def _claim_band(value: float, lo: float, hi: float) -> str:
    if value < lo:
        return "below the claimed band"
    if value > hi:
        return "above the claimed band"
    return "within the claimed band"


def verdict_kmeans(rows: list[dict[str, Any]], claim: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """GPA (a): does k-means cut Nyström error by 25–35% against uniform landmarks, and on which inputs?"""
    better, base = claim["kmeans"], claim["uniform"]
    lo, hi = (float(x) for x in claim["band"])
    red = paired_reduction(rows, better, base)
    if not red:
        return {
            "claim": "gpa_kmeans",
            "verdict": f"not measured (needs selectors {better} and {base})",
            "by_source": [],
        }
    beta = block_coherence_by_source(inputs)
    by_source = []
    for source in dict.fromkeys(r["source"] for r in red):
        rs = [r for r in red if r["source"] == source]
        mean = sum(r["reduction"] for r in rs) / len(rs)
        wins = sum(r["wins"] for r in rs)
        pairs = sum(r["pairs"] for r in rs)
        by_source.append(
            {
                "source": source,
                "mean_reduction": mean,
                "min_reduction": min(r["reduction"] for r in rs),
                "max_reduction": max(r["reduction"] for r in rs),
                "wins": wins,
                "pairs": pairs,
                "band": _claim_band(mean, lo, hi),
                "block_coherence": beta.get(source),
            }
        )
    for entry in by_source:
        rs = [r for r in red if r["source"] == entry["source"]]
        entry["reached_m"] = [r["m"] for r in rs if r["reduction"] >= lo]
        entry["worse_m"] = [r["m"] for r in rs if r["reduction"] < 0]
        best = max(rs, key=lambda r: r["reduction"])
        entry["best_m"], entry["best_reduction"] = best["m"], best["reduction"]
    reached = [s["source"] for s in by_source if s["reached_m"]]

    def ms(values: list[Any]) -> str:
        return "m=" + ",".join(str(m) for m in values)

    text = (
        f"k-means (`{better}`) vs uniform (`{base}`) landmarks under the same Nyström operator, relative Frobenius "
        "error reduction 1 − err(k-means)/err(uniform), mean over m: "
        + "; ".join(
            f"{s['source']} {s['mean_reduction']:+.0%} (best {s['best_reduction']:+.0%} at m={s['best_m']}; "
            f"k-means better in {s['wins']}/{s['pairs']} pairs)"
            for s in by_source
        )
        + ". "
        + (
            f"The claimed {lo:.0%}–{hi:.0%} (or more) is reached on "
            + ", ".join(f"{s['source']} ({ms(s['reached_m'])})" for s in by_source if s["reached_m"])
            + "; "
            if reached
            else f"The claimed {lo:.0%}–{hi:.0%} reduction is reached on none of the inputs; "
        )
        + (
            "not reached on " + ", ".join(s["source"] for s in by_source if not s["reached_m"]) + ". "
            if len(reached) < len(by_source)
            else ""
        )
        + (
            "k-means is worse than uniform on "
            + ", ".join(f"{s['source']} ({ms(s['worse_m'])})" for s in by_source if s["worse_m"])
            + "."
            if any(s["worse_m"] for s in by_source)
            else "k-means is never worse than uniform."
        )
    )
    return {"claim": "gpa_kmeans", "verdict": text, "reached_on": reached, "by_source": by_source, "per_m": red}


def block_coherence_by_source(inputs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean block-coherence β of each source's inputs (averaged over instances and m)."""
    acc: dict[str, list[float]] = defaultdict(list)
    for inp in inputs:
        for values in inp["per_m"].values():
            if values.get("block_coherence") is not None:
                acc[inp["source"]].append(values["block_coherence"])
    return {s: (sum(v) / len(v) if v else None) for s, v in acc.items()}


def verdict_floor(agg: list[dict[str, Any]], claim: dict[str, Any]) -> dict[str, Any]:
    """Where do pivoted and leverage selection stand against the optimum (ratio to the Eckart–Young floor)?"""
    labels = list(claim["labels"])
    table = defaultdict(dict)
    for a in agg:
        key = a["label"] if a["group"] == "selector" else f"attn:{a['label']}"
        if (a["label"] in labels and a["group"] == "selector") or key in labels:
            if a["ey_ratio"] is not None:
                table[(a["source"], key)][a["m"]] = a["ey_ratio"]
    rows = []
    for (source, key), by_m in table.items():
        vals = list(by_m.values())
        rows.append(
            {
                "source": source,
                "method": key,
                "mean_ratio": math.exp(sum(math.log(v) for v in vals) / len(vals)),  # geometric mean over m
                "min_ratio": min(vals),
                "max_ratio": max(vals),
                "by_m": by_m,
            }
        )
    if not rows:
        return {"claim": "floor_ratio", "verdict": "not measured", "rows": []}
    parts = []
    for source in dict.fromkeys(r["source"] for r in rows):
        rs = sorted((r for r in rows if r["source"] == source), key=lambda r: r["mean_ratio"])
        parts.append(f"{source}: " + ", ".join(f"{r['method']} {r['mean_ratio']:.2f}×" for r in rs))
    floors: dict[str, list[float]] = defaultdict(list)
    for a in agg:
        if a["group"] == "selector" and a["ey_floor"] is not None:
            floors[a["source"]].append(a["ey_floor"])
    tiny = [src for src, fl in floors.items() if fl and min(fl) < 0.01]
    best = defaultdict(int)
    for source in dict.fromkeys(r["source"] for r in rows):
        rs = [r for r in rows if r["source"] == source]
        best[min(rs, key=lambda r: r["mean_ratio"])["method"]] += 1
    text = (
        "Achieved error / Eckart–Young optimum at the same rank (1.00 = optimal), geometric mean over m, best "
        "first — "
        + "; ".join(parts)
        + ". Closest to the optimum most often: "
        + ", ".join(f"{k} ({v} input{'s' if v > 1 else ''})" for k, v in sorted(best.items(), key=lambda kv: -kv[1]))
        + "."
        + (
            f" On {', '.join(tiny)} A is nearly low-rank (the SVD floor falls below 1% of ‖A‖_F at the larger m), "
            "so every method's ratio is large there — compare the absolute errors in the tables."
            if tiny
            else ""
        )
    )
    return {"claim": "floor_ratio", "verdict": text, "rows": rows}


def verdict_rank(inputs: list[dict[str, Any]], d_model: int | None = None) -> dict[str, Any]:
    """Polynomial (d): numerical and stable rank of exp(QKᵀ/√d) against a degree-2 polynomial kernel."""
    acc: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    ns: dict[str, list[int]] = defaultdict(list)
    ds: dict[str, int] = {}
    for inp in inputs:
        if not inp.get("kernel_ranks"):
            continue
        ns[inp["source"]].append(inp["n"])
        ds[inp["source"]] = inp["d"]
        for kernel, vals in inp["kernel_ranks"].items():
            acc[inp["source"]][kernel].append((vals["numerical_rank"], vals["stable_rank"] or float("nan")))
    rows = []
    for source, kernels in acc.items():
        n_mean = sum(ns[source]) / len(ns[source])
        d = ds[source]
        row = {
            "source": source,
            "n": n_mean,
            "d": d,
            "bound_poly2": math.comb(d + 1, 2),
            "bound_poly2_inhom": math.comb(d + 2, 2),
        }
        for kernel, vals in kernels.items():
            row[f"{kernel}_numerical_rank"] = sum(v[0] for v in vals) / len(vals)
            row[f"{kernel}_stable_rank"] = sum(v[1] for v in vals) / len(vals)
        rows.append(row)
    if not rows:
        return {"claim": "poly_rank", "verdict": "not measured", "rows": []}
    parts = []
    informative = []
    for r in rows:
        note = "" if r["n"] > r["bound_poly2"] else " (n ≤ the degree-2 bound: uninformative)"
        if r["n"] > r["bound_poly2"]:
            informative.append(r)
        parts.append(
            f"{r['source']} (n={r['n']:.0f}): exp {r['exp_numerical_rank']:.0f} (stable {r['exp_stable_rank']:.2f}), "
            f"softmax {r['softmax_numerical_rank']:.0f} (stable {r['softmax_stable_rank']:.2f}), "
            f"degree-2 {r['poly2_numerical_rank']:.0f} (stable {r['poly2_stable_rank']:.2f}; bound C(d+1,2)="
            f"{r['bound_poly2']}){note}"
        )
    exceed = [r["source"] for r in informative if r["exp_numerical_rank"] > r["bound_poly2"]]
    within = [r["source"] for r in informative if r["poly2_numerical_rank"] <= r["bound_poly2"]]
    text = "Numerical rank (σ_i > tol·σ_1) and stable rank, mean over instances — " + "; ".join(parts) + ". "
    if informative:
        text += (
            f"The degree-2 kernel stays within its C(d+1,2) bound on {len(within)}/{len(informative)} informative "
            f"inputs (as the factorisation ⟨q,k⟩² = ⟨q⊗q, k⊗k⟩ requires); exp exceeds that bound on "
            f"{len(exceed)}/{len(informative)} ({', '.join(exceed) or 'none'}) — "
            + (
                "exp is not low-rank there, as the metric-transform result predicts."
                if exceed
                else (
                    "at this tolerance and temperature exp is numerically low-rank too: the theorem is about "
                    "exact rank, not numerical rank."
                )
            )
        )
    return {"claim": "poly_rank", "verdict": text, "rows": rows}


def verdict_pivoted_output(agg: list[dict[str, Any]], claim: dict[str, Any]) -> dict[str, Any]:
    """Residual-pivoted (c): lower output error than uniform Nyström landmarks at the same rank?"""
    piv = {(a["source"], a["m"]): a for a in agg if a["group"] == "attention" and a["label"] == claim["attention"]}
    uni = {(a["source"], a["m"]): a for a in agg if a["group"] == "selector" and a["label"] == claim["baseline"]}
    pairs = [(k, piv[k], uni[k]) for k in piv if k in uni and piv[k]["output_residual"] is not None]
    if not pairs:
        return {"claim": "pivoted_output", "verdict": "not measured", "rows": []}
    rows = [
        {
            "source": s,
            "m": m,
            "pivoted": p["output_residual"],
            "baseline": u["output_residual"],
            "lower": p["output_residual"] < u["output_residual"],
        }
        for (s, m), p, u in pairs
    ]
    wins = sum(r["lower"] for r in rows)
    text = (
        f"`{claim['attention']}` (C·(T·V) on a row sketch) has a lower output residual ‖(A−Â)V‖/‖AV‖ than Nyström with "
        f"`{claim['baseline']}` landmarks at the same m in {wins}/{len(rows)} (input, m) cells"
        + (
            "; it loses on " + ", ".join(sorted({r["source"] for r in rows if not r["lower"]})) + "."
            if wins < len(rows)
            else "."
        )
    )
    return {"claim": "pivoted_output", "verdict": text, "rows": rows}


def verdict_spectral(agg: list[dict[str, Any]]) -> dict[str, Any]:
    """Outlier-spectral (b): does a larger s lower the residual against the method's own target?"""
    own = [a for a in agg if a["group"] == "attention" and a.get("target") == "own" and a["m"] is not None]
    if not own:
        return {"claim": "spectral_s", "verdict": "not measured", "rows": []}
    rows, parts = [], []
    for label, source in dict.fromkeys((a["label"], a["source"]) for a in own):
        seq = sorted((a for a in own if a["label"] == label and a["source"] == source), key=lambda a: a["m"])
        res = [a["output_residual"] for a in seq]
        mono = all(b <= a + 1e-12 for a, b in zip(res, res[1:]))
        rows.append(
            {"label": label, "source": source, "m": [a["m"] for a in seq], "output_residual": res, "monotone": mono}
        )
        parts.append(f"{source}: {res[0]:.3f} → {res[-1]:.3f} ({'monotone' if mono else 'not monotone'})")
    mono_count = sum(r["monotone"] for r in rows)
    text = (
        f"Output residual of `{rows[0]['label']}` against its own target (the bounded affinity it estimates) "
        f"as s grows "
        f"from {rows[0]['m'][0]} to {rows[0]['m'][-1]}: "
        + "; ".join(parts)
        + f". Decreasing on {mono_count}/{len(rows)} inputs."
    )
    return {"claim": "spectral_s", "verdict": text, "rows": rows}


def summarize(rows: list[dict[str, Any]], inputs: list[dict[str, Any]], claims: dict[str, Any]) -> dict[str, Any]:
    agg = aggregate(rows)
    return {
        "aggregate": agg,
        "verdicts": [
            verdict_kmeans(rows, claims["kmeans"], inputs),
            verdict_floor(agg, claims["floor"]),
            verdict_rank(inputs),
            verdict_pivoted_output(agg, claims["pivoted"]),
            verdict_spectral(agg),
        ],
        "block_coherence": block_coherence_by_source(inputs),
    }
