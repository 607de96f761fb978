"""approx.md and the PNG plots, rendered from approx.json's content (so docs/results.md reuses them)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

CLAIM_TITLES = {
    "gpa_kmeans": "(a) GPA — does k-means cut Nyström error by 25–35% against uniform landmarks, and where?",
    "floor_ratio": "(a, c) Pivoted and leverage selection against the optimum (ratio to the Eckart–Young floor)",
    "pivoted_output": "(c) Residual-pivoted attention — lower output error than uniform Nyström at equal rank?",
    "spectral_s": "(b) Outlier-spectral — does a larger s lower the residual?",
    "poly_rank": "(d) Rank of exp(QKᵀ/√d) against a degree-2 polynomial kernel of the same inputs",
}


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def _pm(mean: float | None, std: float | None, digits: int = 3) -> str:
    if mean is None:
        return "—"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std else f"{mean:.{digits}f}"


def render_markdown(data: dict[str, Any], h: str = "##", img_dir: str = ".") -> str:
    s, summ, env = data["settings"], data["summary"], data["env"]
    hw = env.get("hardware", {})
    out = [f"{h} Approximation study (`python -m lra_bench.approx`)", ""]
    out.append(f"- command: `{data['command']}`")
    out.append(
        f"- git commit: `{env.get('git_commit')}`; torch {env.get('packages', {}).get('torch')}; "
        f"{hw.get('cpu')} ({hw.get('cpu_count')} logical CPUs), torch threads {data['threads']}; "
        f"{data['seconds']:.0f} s"
    )
    out.append(
        f"- landmark counts m ∈ {s['landmarks']}; seeds {s['seeds']}; synthetic n={s['n']}, d={s['d']}; "
        f"numerical-rank tolerance {s['rank_tol']}"
    )
    op = s["operator"]
    out.append(
        f"- selector group: every selector under `{op}` with {s.get('operator_params') or 'its defaults'} "
        "(paper defaults otherwise); attention group: every registered attention but `full`, paper defaults "
        "and its own selector"
    )
    for source, info in data["sources"].items():
        out.append(f"- source `{source}`: {info}")
    out.append(
        "- metrics from `lra_bench/diagnostics/metrics.py`: relative error ‖A−Â‖_F/‖A‖_F, output residual "
        "‖(A−Â)V‖_F/‖AV‖_F, Eckart–Young floor √Σ_{i>r}σ_i² / ‖A‖_F at the method's rank budget r and the ratio "
        "of the achieved error to it; block-coherence β (our definition): k-means the queries into r clusters "
        "and take the share of A's rank-r leverage Σℓ_i that the highest-leverage token of each cluster holds"
    )
    out += ["", f"{h}# Verdicts (computed from the numbers below)", ""]
    for v in summ["verdicts"]:
        out.append(f"- **{CLAIM_TITLES.get(v['claim'], v['claim'])}** {v['verdict']}")
    kv = next((v for v in summ["verdicts"] if v["claim"] == "gpa_kmeans"), None)
    if kv and kv.get("per_m"):
        out += [
            "",
            "k-means vs uniform, error reduction 1 − err(k-means)/err(uniform) per m (mean ± std over pairs):",
            "",
        ]
        ms = sorted({r["m"] for r in kv["per_m"]})
        by = defaultdict(dict)
        for r in kv["per_m"]:
            by[r["source"]][r["m"]] = r
        beta = summ.get("block_coherence", {})
        body = [
            [
                f"`{src}`",
                *[
                    (
                        f"{v[m]['reduction']:+.0%} ± {v[m]['reduction_std']:.0%} ({v[m]['wins']}/{v[m]['pairs']})"
                        if m in v
                        else "—"
                    )
                    for m in ms
                ],
                "—" if beta.get(src) is None else f"{beta[src]:.2f}",
            ]
            for src, v in by.items()
        ]
        out += _table(["input", *[f"m={m}" for m in ms], "block-coherence β"], body)
    out += ["", f"{h}# Inputs", ""]
    inputs = data["inputs"]
    ms_all = [str(m) for m in s["landmarks"]]
    body = []
    for source in dict.fromkeys(i["source"] for i in inputs):
        ins = [i for i in inputs if i["source"] == source]
        nmean = sum(i["n"] for i in ins) / len(ins)
        ra = sum(i["rank_a"] for i in ins) / len(ins)
        sr = sum(i["stable_rank_a"] or 0 for i in ins) / len(ins)
        cells = []
        for m in ms_all:
            vals = [i["per_m"][m] for i in ins if m in i["per_m"]]
            if not vals:
                cells.append("—")
                continue
            fl = sum(v["ey_floor"] or 0 for v in vals) / len(vals)
            bc = [v["block_coherence"] for v in vals if v["block_coherence"] is not None]
            cells.append(f"{fl:.3f} / {sum(bc) / len(bc):.2f}" if bc else f"{fl:.3f} / —")
        body.append([f"`{source}`", str(len(ins)), f"{nmean:.0f}", f"{ra:.0f}", f"{sr:.2f}", *cells])
    out += _table(["input", "instances", "n", "rank A", "stable rank A", *[f"m={m}: floor / β" for m in ms_all]], body)
    rk = next((v for v in summ["verdicts"] if v["claim"] == "poly_rank"), None)
    if rk and rk["rows"]:
        out += [
            "",
            "Kernel ranks on the same logits L = qkᵀ/√d (numerical rank / stable rank, mean over instances):",
            "",
        ]
        out += _table(
            ["input", "n", "exp(L)", "softmax(L)", "L∘L", "(1+L)∘(1+L)", "degree-2 bound C(d+1,2) / C(d+2,2)"],
            [
                [
                    f"`{r['source']}`",
                    f"{r['n']:.0f}",
                    *[
                        f"{r[f'{k}_numerical_rank']:.0f} / {r[f'{k}_stable_rank']:.2f}"
                        for k in ("exp", "softmax", "poly2", "poly2_inhom")
                    ],
                    f"{r['bound_poly2']} / {r['bound_poly2_inhom']}",
                ]
                for r in rk["rows"]
            ],
        )
    agg = summ["aggregate"]
    for source in dict.fromkeys(a["source"] for a in agg):
        out += ["", f"{h}# Input `{source}`", ""]
        rows = [a for a in agg if a["source"] == source]
        ms = sorted({a["m"] for a in rows if a["m"] is not None})
        for metric, title in (
            ("matrix_residual", "relative error ‖A−Â‖_F/‖A‖_F, mean ± std (ratio to the Eckart–Young floor)"),
            ("output_residual", "output residual ‖(A−Â)V‖_F/‖AV‖_F, mean ± std"),
        ):
            out += [f"{title}:", ""]
            labels = list(dict.fromkeys((a["group"], a["label"]) for a in rows))
            idx = {(a["group"], a["label"], a["m"]): a for a in rows}
            body = []
            floor_cells = []
            for m in ms:
                fl = [
                    a["ey_floor"]
                    for a in rows
                    if a["m"] == m and a["group"] == "selector" and a["ey_floor"] is not None
                ]
                floor_cells.append(f"{sum(fl) / len(fl):.3f}" if fl else "—")
            if metric == "matrix_residual":
                body.append(["**SVD floor (rank m)**", "", *floor_cells, ""])
            for group, label in labels:
                cells = []
                for m in ms:
                    a = idx.get((group, label, m))
                    if a is None:
                        cells.append("—")
                        continue
                    cell = _pm(a[metric], a[metric + "_std"])
                    if metric == "matrix_residual" and a["ey_ratio"] is not None:
                        cell += f" ({a['ey_ratio']:.2f}×)"
                    cells.append(cell)
                fixed = idx.get((group, label, None))
                extra = ""
                if fixed is not None:
                    extra = _pm(fixed[metric], fixed[metric + "_std"]) + f" (r={fixed['rank_budget']})"
                    if metric == "matrix_residual" and fixed["ey_ratio"] is not None:
                        extra += f" ({fixed['ey_ratio']:.2f}×)"
                tgt = " †" if any(a.get("target") == "own" for a in rows if a["label"] == label) else ""
                body.append([f"`{label}`{tgt}", group, *cells, extra])
            out += _table(["method", "group", *[f"m={m}" for m in ms], "fixed rank"], body)
            out.append("")
        if any(a.get("target") == "own" for a in rows):
            out.append("† scored against its own target operator (not softmax), see the verdict on (b).")
            out.append("")
        name = f"approx_{source}.png"
        if name in data.get("plots", []):
            out.append(f"![{source}]({img_dir}/{name})")
    errs = [r for r in data["rows"] if r.get("status") != "ok"]
    out += ["", f"{h}# Failed evaluations", ""]
    if not errs:
        out.append("None.")
    else:
        seen = {}
        for r in errs:
            seen.setdefault((r["label"], r.get("error") or r.get("status")), []).append(r)
        out += _table(
            ["method", "count", "why"],
            [[f"`{label}`", str(len(v)), str(why)] for (label, why), v in seen.items()],
        )
    return "\n".join(out) + "\n"


def plot(data: dict[str, Any], out_dir: Path) -> list[str]:
    """approx_<source>.png: relative error against m per selector (left) and per attention (right), with the
    SVD floor dashed; error bars = std over (instance, seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = data["summary"]["aggregate"]
    written = []
    for source in dict.fromkeys(a["source"] for a in agg):
        rows = [a for a in agg if a["source"] == source and a["m"] is not None]
        fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
        for ax, group in zip(axes, ("selector", "attention")):
            grp = [a for a in rows if a["group"] == group and a.get("target") != "own"]
            for label in dict.fromkeys(a["label"] for a in grp):
                pts = sorted((a for a in grp if a["label"] == label), key=lambda a: a["m"])
                ax.errorbar(
                    [a["m"] for a in pts],
                    [a["matrix_residual"] for a in pts],
                    yerr=[a["matrix_residual_std"] or 0 for a in pts],
                    marker="o",
                    ms=3,
                    capsize=2,
                    label=label,
                )
            fl = defaultdict(list)
            for a in rows:
                if a["group"] == "selector" and a["ey_floor"] is not None:
                    fl[a["m"]].append(a["ey_floor"])
            if fl:
                xs = sorted(fl)
                ax.plot(xs, [sum(fl[x]) / len(fl[x]) for x in xs], "k--", lw=2, label="SVD floor (rank m)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("landmarks m")
            what = "selectors under the Nyström operator" if group == "selector" else "attentions (paper defaults)"
            ax.set_title(f"{source}: {what}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        axes[0].set_ylabel("‖A − Â‖_F / ‖A‖_F")
        fig.tight_layout()
        name = f"approx_{source}.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written
