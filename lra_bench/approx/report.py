"""approx.md and the PNG plots, rendered from approx.json's content (so docs/results.md reuses them)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from lra_bench.kit.figures import pyplot, save_figure
from lra_bench.kit.markdown import table
from lra_bench.kit.numbers import ratio_text

#: relative errors below this are drawn at it (a floor of 1e-15 would otherwise stretch the axis over 16 decades)
PLOT_FLOOR = 1e-4

CLAIM_TITLES = {
    "gpa_kmeans": "(a) GPA — does k-means cut Nyström error by 25–35% against uniform landmarks, and where?",
    "solves": "(instrument) How often is a Nyström evaluation worse than Â = 0, by core solve?",
    "floor_ratio": "(a, c) Pivoted and leverage selection against the optimum (ratio to the Eckart–Young floor)",
    "pivoted_output": "(c) Residual-pivoted attention — lower output error than uniform Nyström at equal rank?",
    "spectral_s": "(b) Outlier-spectral — does a larger s lower the residual?",
    "poly_rank": "(d) Rank of exp(QKᵀ/√d) against a degree-2 polynomial kernel of the same inputs",
}


def _reduction_cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "—"
    excl = f"; {r['excluded']} excl." if r["excluded"] else ""
    if not r["pairs"]:
        return f"not measurable{excl}"
    return f"{r['reduction_median']:+.0%} ({r['wins']}/{r['pairs']}{excl})"


def _error_cell(a: dict[str, Any], metric: str) -> str:
    """Median (pooled ratio to the floor) [k/N worse than Â = 0]."""
    cell = "—" if a[metric] is None else f"{a[metric]:.3f}"
    if metric == "matrix_residual":
        if a.get("ey_ratio") is not None:
            cell += f" ({ratio_text(a['ey_ratio'], a.get('ey_ratio_limit'))})"
        elif a.get("floor_flagged"):
            cell += " (floor < 1%)"
        if a.get("worse_than_zero"):
            cell += f" [{a['worse_than_zero']}/{a['count']} ≥ 1]"
    return cell


def _setup_lines(data: dict[str, Any]) -> list[str]:
    """The bullet list under the title: command, commit, machine, settings, sources and what each metric means."""
    s, env = data["settings"], data["env"]
    hw = env.get("hardware", {})
    return [
        f"- command: `{data['command']}`",
        f"- git commit: `{env.get('git_commit')}`; torch {env.get('packages', {}).get('torch')}; "
        f"{hw.get('cpu')} ({hw.get('cpu_count')} logical CPUs), torch threads {data['threads']}; "
        f"{data['seconds']:.0f} s",
        f"- landmark counts m ∈ {s['landmarks']}; seeds {s['seeds']}; synthetic n={s['n']}, d={s['d']}; "
        f"numerical-rank tolerance {s['rank_tol']}",
        f"- selector group: every selector under `{s['operator']}` with {s.get('operator_params') or 'its defaults'} "
        f"(paper defaults otherwise), under the core solves {s.get('solves') or ['training']} — `training` = the "
        "operator's own pseudo-inverse in fp32, `stable` = `models.attention.numerics.stable_pinv` in fp64 (exact "
        "where the landmarks determine A); attention group: every registered attention but `full`, paper defaults "
        "and its own selector",
        *(f"- source `{source}`: {info}" for source, info in data["sources"].items()),
        "- metrics from `lra_bench/diagnostics/metrics.py`: relative error ‖A−Â‖_F/‖A‖_F, output residual "
        "‖(A−Â)V‖_F/‖AV‖_F, Eckart–Young floor √Σ_{i>r}σ_i² / ‖A‖_F at the method's rank budget r and the ratio "
        "of the achieved error to it; block-coherence β (our definition): k-means the queries into r clusters "
        "and take the share of A's rank-r leverage Σℓ_i that the highest-leverage token of each cluster holds",
    ]


def _kmeans_lines(summ: dict[str, Any]) -> list[str]:
    """The k-means vs uniform reduction per input, solve and m, with each input's block-coherence β."""
    kv = next((v for v in summ["verdicts"] if v["claim"] == "gpa_kmeans"), None)
    if not (kv and kv.get("per_solve")):
        return []
    out = [
        "",
        "k-means vs uniform, error reduction 1 − err(k-means)/err(uniform) per m (median over pairs; k-means "
        "better in w/p pairs; pairs whose uniform error is ≥ 1 are excluded and counted; `oracle` = the best "
        "middle matrix for each selector's factors, i.e. what the landmarks allow whatever the solve):",
        "",
    ]
    ms = sorted({r["m"] for v in kv["per_solve"].values() for r in v["per_m"]})
    beta = summ.get("block_coherence", {})
    body = []
    for solve, v in kv["per_solve"].items():
        by: dict[str, dict[Any, Any]] = defaultdict(dict)
        for r in v["per_m"]:
            by[r["source"]][r["m"]] = r
        for src, per_m in by.items():
            body.append(
                [
                    f"`{src}`",
                    solve,
                    *[_reduction_cell(per_m.get(m)) for m in ms],
                    "—" if beta.get(src) is None else f"{beta[src]:.2f}",
                ]
            )
    return out + table(["input", "solve", *[f"m={m}" for m in ms], "block-coherence β"], body)


def _input_row(source: str, ins: list[dict[str, Any]], ms_all: list[str]) -> list[str]:
    """One source's size, ranks and, per m, its mean Eckart–Young floor and block-coherence β."""
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
        cells.append(f"{fl:.3f} / {sum(bc) / len(bc):.2f}" if bc else f"{fl:.3f} / undefined (m > rank A)")
    return [f"`{source}`", str(len(ins)), f"{nmean:.0f}", f"{ra:.0f}", f"{sr:.2f}", *cells]


def _inputs_lines(data: dict[str, Any], h: str) -> list[str]:
    """The inputs table, and the kernel ranks of claim (d) when the study measured them."""
    inputs, ms_all = data["inputs"], [str(m) for m in data["settings"]["landmarks"]]
    out = ["", f"{h}# Inputs", ""]
    body = [
        _input_row(source, [i for i in inputs if i["source"] == source], ms_all)
        for source in dict.fromkeys(i["source"] for i in inputs)
    ]
    out += table(["input", "instances", "n", "rank A", "stable rank A", *[f"m={m}: floor / β" for m in ms_all]], body)
    rk = next((v for v in data["summary"]["verdicts"] if v["claim"] == "poly_rank"), None)
    if not (rk and rk["rows"]):
        return out
    out += ["", "Kernel ranks on the same logits L = qkᵀ/√d (numerical rank / stable rank, mean over instances):", ""]
    return out + table(
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


METRIC_TITLES = (
    (
        "matrix_residual",
        "relative error ‖A−Â‖_F/‖A‖_F, median over instances and seeds (pooled ratio Σerr/Σfloor to the "
        "Eckart–Young floor at the effective rank; [k/N ≥ 1] = evaluations worse than Â = 0)",
    ),
    ("output_residual", "output residual ‖(A−Â)V‖_F/‖AV‖_F, median over instances and seeds"),
)


def _metric_table(rows: list[dict[str, Any]], metric: str, ms: list[int]) -> list[str]:
    """One source's table of `metric` by method and m (the SVD floor first for the matrix error)."""
    labels = list(dict.fromkeys((a["group"], a["label"], a["solve"]) for a in rows))
    idx = {(a["group"], a["label"], a["solve"], a["m"]): a for a in rows}
    body = []
    if metric == "matrix_residual":
        floor_cells = []
        for m in ms:
            fl = [a["ey_floor"] for a in rows if a["m"] == m and a["group"] == "selector" and a["ey_floor"]]
            floor_cells.append(f"{sum(fl) / len(fl):.3f}" if fl else "—")
        body.append(["**SVD floor (rank m)**", "", "", *floor_cells, ""])
    for group, label, solve in labels:
        keys = [(group, label, solve, m) for m in ms]
        cells = [_error_cell(idx[key], metric) if key in idx else "—" for key in keys]
        fixed = idx.get((group, label, solve, None))
        extra = "" if fixed is None else _error_cell(fixed, metric) + f" (r={fixed['rank_budget_nominal']})"
        tgt = " †" if any(a.get("target") == "own" for a in rows if a["label"] == label) else ""
        body.append([f"`{label}`{tgt}", group, solve if group == "selector" else "own", *cells, extra])
    return table(["method", "group", "solve", *[f"m={m}" for m in ms], "fixed rank"], body)


def _source_lines(data: dict[str, Any], source: str, h: str, img_dir: str) -> list[str]:
    """One input's section: its error and output-residual tables, and its plot."""
    out = ["", f"{h}# Input `{source}`", ""]
    rows = [a for a in data["summary"]["aggregate"] if a["source"] == source]
    ms = sorted({a["m"] for a in rows if a["m"] is not None})
    for metric, title in METRIC_TITLES:
        out += [f"{title}:", "", *_metric_table(rows, metric, ms), ""]
    if any(a.get("target") == "own" for a in rows):
        out += [
            "† scored against the operator it stands for, not softmax (`target_pair`: spectral's bounded affinity, "
            "see the verdict on (b); Skyformer's Gaussian kernel).",
            "",
        ]
    name = f"approx_{source}.png"
    if name in data.get("plots", []):
        out.append(
            f"![{source}]({img_dir}/{name})\n\n(Plot: errors below {PLOT_FLOOR:g} — including a floor of "
            "≈ 0 when A has rank ≤ m — are drawn at that value, marked ▼; the dotted line at 1 is Â = 0.)"
        )
    return out


def _failure_lines(data: dict[str, Any], h: str) -> list[str]:
    """The failed evaluations, one row per method and reason with how often."""
    errs = [r for r in data["rows"] if r.get("status") != "ok"]
    out = ["", f"{h}# Failed evaluations", ""]
    if not errs:
        return [*out, "None."]
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in errs:
        seen.setdefault((r["label"], r.get("error") or r.get("status")), []).append(r)
    return out + table(
        ["method", "count", "why"], [[f"`{label}`", str(len(v)), str(why)] for (label, why), v in seen.items()]
    )


def render_markdown(data: dict[str, Any], h: str = "##", img_dir: str = ".") -> str:
    """approx.md: the study's setup, the verdicts, the inputs, each input's tables and plot, the failures."""
    summ = data["summary"]
    out = [f"{h} Approximation study (`python -m lra_bench.approx`)", "", *_setup_lines(data)]
    out += ["", f"{h}# Verdicts (computed from the numbers below)", ""]
    for v in summ["verdicts"]:
        out.append(f"- **{CLAIM_TITLES.get(v['claim'], v['claim'])}** {v['verdict']}")
    out += _kmeans_lines(summ)
    out += _inputs_lines(data, h)
    for source in dict.fromkeys(a["source"] for a in summ["aggregate"]):
        out += _source_lines(data, source, h, img_dir)
    out += _failure_lines(data, h)
    return "\n".join(out) + "\n"


def clip_for_plot(values: list[float | None]) -> tuple[list[float | None], list[bool]]:
    """Values below PLOT_FLOOR drawn at PLOT_FLOOR, and which were clipped (the plot says so)."""
    clipped = [v is not None and v < PLOT_FLOOR for v in values]
    return [None if v is None else max(v, PLOT_FLOOR) for v in values], clipped


PANELS = (
    ("selector", "stable", "selectors, stable solve"),
    ("selector", "training", "selectors, training solve"),
    ("selector", "oracle", "selectors, best middle matrix (oracle)"),
    ("attention", "training", "attentions (paper defaults)"),
)


def draw_source(axes: Any, rows: list[dict[str, Any]], source: str) -> None:
    """The three panels of one source: relative error against m, the SVD floor dashed, Â = 0 dotted."""
    fl = defaultdict(list)
    for a in rows:
        if a["group"] == "selector" and a["ey_floor"] is not None:
            fl[a["m"]].append(a["ey_floor"])
    any_clipped = False
    for ax, (group, solve, what) in zip(axes, PANELS):
        grp = [a for a in rows if a["group"] == group and a["solve"] == solve and a.get("target") != "own"]
        for label in dict.fromkeys(a["label"] for a in grp):
            pts = sorted((a for a in grp if a["label"] == label), key=lambda a: a["m"])
            ys, clipped = clip_for_plot([a["matrix_residual"] for a in pts])
            xs = [a["m"] for a in pts]
            (line,) = ax.plot(xs, ys, marker="o", ms=3, label=label)
            low = [(x, y) for x, y, c in zip(xs, ys, clipped) if c]
            if low:
                any_clipped = True
                ax.plot(*zip(*low), "v", color=line.get_color(), ms=7)
        if fl:
            xs = sorted(fl)
            ys, clipped = clip_for_plot([sum(fl[x]) / len(fl[x]) for x in xs])
            any_clipped = any_clipped or any(clipped)
            ax.plot(xs, ys, "k--", lw=2, label="SVD floor (rank m)")
        ax.axhline(1.0, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(bottom=PLOT_FLOOR * 0.7)
        ax.set_xlabel("landmarks m")
        ax.set_title(f"{source}: {what}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="upper right")
    axes[0].set_ylabel("median ‖A − Â‖_F / ‖A‖_F")
    if any_clipped:
        axes[0].annotate(
            f"▼ below {PLOT_FLOOR:g}, drawn at {PLOT_FLOOR:g}", xy=(0.02, 0.02), xycoords="axes fraction", fontsize=7
        )


def plot(data: dict[str, Any], out_dir: Path) -> list[str]:
    """approx_<source>.png: median relative error against m — selectors under the stable and the training
    solve and the oracle middle matrix, attentions at their defaults — with the SVD floor dashed and Â = 0
    dotted; values below PLOT_FLOOR are clipped to it and marked."""
    plt = pyplot()

    agg = data["summary"]["aggregate"]
    written = []
    for source in dict.fromkeys(a["source"] for a in agg):
        rows = [a for a in agg if a["source"] == source and a["m"] is not None]
        fig, axes = plt.subplots(1, len(PANELS), figsize=(22, 5), sharey=True)
        draw_source(axes, rows, source)
        written.append(save_figure(fig, out_dir / f"approx_{source}.png", dpi=100).name)
    return written
