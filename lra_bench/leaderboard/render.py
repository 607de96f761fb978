"""Format leaderboard rows as markdown, CSV and PNG plots (matplotlib Agg, no global pyplot state).

Why separate from the numbers: formatting changes often and is checked by eye; the aggregation in
`leaderboard_data` is checked by tests. Nothing here computes a statistic.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lra_bench.leaderboard.published import TASK_LABELS, TASKS

GROUP_COLUMNS = (
    "protocol",
    "task",
    "attn",
    "selector",
    "num_landmarks",
    "pretraining",
    "n",
    "seeds",
    "test_acc_mean",
    "test_acc_std",
    "val_acc_mean",
    "val_acc_std",
    "step_time_median_ms",
    "tokens_per_s",
    "peak_memory_mib",
    "params",
    "device",
)
WIDE_COLUMNS = (
    "kind",
    "source",
    "protocol",
    "method",
    "attn",
    "selector",
    "num_landmarks",
    "pretraining",
    *TASKS,
    *(f"{t}_std" for t in TASKS),
    "failed_tasks",
    "avg5",
    "avg6",
    "pathx_counted_as_50",
    "flag",
    "note",
)
AVG5_LABEL = "Avg-5"
AVG6_LABEL = "Avg-6 (Path-X ✗=50)"
CONVENTIONS = (
    f"**{AVG5_LABEL}** = mean test accuracy over ListOps, Text, Retrieval, Image, Pathfinder (LRA paper "
    f"convention). **{AVG6_LABEL}** = mean over all six tasks with Path-X failed or not run counted as 50 "
    "(S4/Mega convention). Both only when all five other tasks have a result. (n=…) = seeds."
)


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def _acc(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "—"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def clean(cell: Any) -> str:
        return str(cell).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(clean(c) for c in row) + " |" for row in rows]
    return lines


def _wide_cells(row: dict[str, Any]) -> list[str]:
    failed = set(filter(None, str(row.get("failed_tasks") or "").split(",")))
    cells = []
    for task in TASKS:
        if row.get(task) is not None:
            n = row.get(f"{task}_n")
            cells.append(_acc(row[task], row.get(f"{task}_std")) + (f" (n={n})" if n else ""))
        else:
            cells.append("✗" if task in failed else "—")
    avg6 = _num(row.get("avg6"))
    if row.get("avg6") is not None and row.get("pathx_counted_as_50"):
        avg6 += "*"
    return [*cells, _num(row.get("avg5")), avg6]


def _wide_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    header = ["method", "source", *(TASK_LABELS[t] for t in TASKS), AVG5_LABEL, AVG6_LABEL]
    body = []
    for row in rows:
        source = "ours" if row["kind"] == "ours" else f"published: {row['source']}"
        body.append([f"{row['method']}{row.get('flag') or ''}", source, *_wide_cells(row)])
    return _md_table(header, body)


def render_markdown(
    dirs: Sequence[str],
    n_files: int,
    rows: Sequence[dict[str, Any]],
    wide: Sequence[dict[str, Any]],
    published: Sequence[dict[str, Any]],
    sources: dict[str, dict[str, Any]],
    failures: Sequence[dict[str, Any]],
    unreadable: Sequence[dict[str, str]],
    superseded: Sequence[dict[str, Any]],
    plots: Sequence[Path],
) -> str:
    """The whole `leaderboard.md`: summary by protocol, published rows, groups, failures, bad files."""
    out = [
        "# LRA leaderboard",
        "",
        f"From {n_files} `results.json` file(s) under: {', '.join(f'`{d}`' for d in dirs)}.",
        "Accuracies in percent: test accuracy at the best-validation checkpoint; `±` = sample standard "
        "deviation over seeds (ddof=1, shown only for n ≥ 2); n = number of seeds.",
        "Published rows come from the papers (see *Published reference rows*); they are shown beside ours "
        "and never enter our means.",
        "",
        "## Per-method summary (test accuracy)",
        "",
        CONVENTIONS,
        "`*` on Avg-6: Path-X counted as 50. `✗`: failed or unfinished (ours) / FAIL (published). `—`: not run.",
        "",
    ]
    protocols = sorted({str(r["protocol"]) for r in wide})
    for protocol in protocols:
        ours = [r for r in wide if str(r["protocol"]) == protocol]
        beside = [r for r in published if str(r["protocol"]) == protocol]
        out += [f"### protocol: {protocol}", "", *_wide_table([*ours, *beside]), ""]
    if not protocols:
        out += ["(no completed runs)", ""]

    out += ["## Published reference rows (not ours)", "", CONVENTIONS, ""]
    for src in sources.values():
        mine = [r for r in published if r["source"] == src["label"]]
        protocol = f"`{src['protocol']}`" if src.get("protocol") else "none of ours (own recipe)"
        out += [
            f"### {src['label']}",
            "",
            f"Source: {src['citation']}. Protocol: {protocol}. {src.get('note', '')}",
            "",
            *_wide_table(mine),
            "",
        ]
        notes = [f"- {r['method']}: {r['note']}" for r in mine if r.get("note")]
        memory = [f"{r['method']} {r['peak_memory_mb']:.0f}" for r in mine if r.get("peak_memory_mb") is not None]
        if memory:
            notes.append(f"- peak memory as published (MB): {', '.join(memory)}")
        if notes:
            out += [*notes, ""]

    out += ["## All groups (protocol × task × attn × selector × landmarks × pretraining)", ""]
    header = [
        "protocol",
        "task",
        "attn",
        "selector",
        "landmarks",
        "pretraining",
        "n",
        "seeds",
        "test acc",
        "val acc",
        "step (ms, median)",
        "tokens/s",
        "peak mem (MiB)",
        "params",
        "device",
    ]
    body = [
        [
            r["protocol"],
            TASK_LABELS.get(r["task"], r["task"]),
            r["attn"],
            r["selector"] or "—",
            _num(r["num_landmarks"], "{}"),
            r["pretraining"],
            r["n"],
            r["seeds"],
            _acc(r["test_acc_mean"], r["test_acc_std"]),
            _acc(r["val_acc_mean"], r["val_acc_std"]),
            _num(r["step_time_median_ms"], "{:.1f}"),
            _num(r["tokens_per_s"], "{:,.0f}"),
            _num(r["peak_memory_mib"], "{:,.0f}"),
            _num(r["params"], "{:,}"),
            r["device"],
        ]
        for r in rows
    ]
    out += [*(_md_table(header, body) if body else ["(no completed runs)"]), ""]

    out += [f"## Failed or unfinished runs ({len(failures)})", ""]
    if failures:
        body = [
            [f["output_dir"], f["status"], f["task"], f["attn"], f["selector"] or "—", f["seed"], f["reason"]]
            for f in failures
        ]
        out += _md_table(["output dir", "status", "task", "attn", "selector", "seed", "reason"], body)
    else:
        out.append("None.")
    out += ["", f"## Unreadable records ({len(unreadable)})", ""]
    out += _md_table(["path", "reason"], [[u["path"], u["reason"]] for u in unreadable]) if unreadable else ["None."]
    if superseded:
        out += ["", "## Superseded runs (same group and seed; the latest finished run is kept)", ""]
        out += _md_table(["dropped", "seed", "kept"], [[s["path"], s["seed"], s["kept"]] for s in superseded])
    if plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(out) + "\n"


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return path


def plot_task(path: Path, task: str, rows: Sequence[dict[str, Any]]) -> Path:
    """Test accuracy against peak memory and against step time for one task, one point per group."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    panels = (("peak_memory_mib", "peak memory (MiB)"), ("step_time_median_ms", "median step time (ms)"))
    for ax, (key, xlabel) in zip(axes, panels):
        points = [r for r in rows if r.get(key) is not None and r.get("test_acc_mean") is not None]
        for i, r in enumerate(points):
            label = f"{r['attn']}" + (f"/{r['selector']}" if r["selector"] else "")
            label += f" m={r['num_landmarks']}" if r["num_landmarks"] is not None else ""
            label += f" +SPT({r['pretraining']})" if r.get("pretraining") not in (None, "none") else ""
            label += f" [{r['protocol']}]"
            ax.errorbar(
                r[key],
                r["test_acc_mean"],
                yerr=r["test_acc_std"] or 0.0,
                fmt="o",
                color=f"C{i % 10}",
                capsize=3,
                label=label,
            )
        if not points:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        if points:
            ax.legend(fontsize="x-small", loc="best")
    fig.suptitle(f"{TASK_LABELS.get(task, task)}: accuracy against cost (mean ± std over seeds)")
    fig.savefig(path, dpi=110)
    return path
