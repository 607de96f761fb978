"""Format leaderboard rows as markdown, CSV and PNG plots (matplotlib Agg, no global pyplot state), and the main
table for the terminal (`print_summary`, rich: reading it needs no 150-line markdown file).

Nothing here computes a statistic: the numbers are `aggregate`'s, checked by tests; their formatting changes often.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from lra_bench.diagnostics import LOCALITY_WINDOWS
from lra_bench.kit.figures import agg_figure
from lra_bench.kit.markdown import table
from lra_bench.leaderboard import experiments, locality, uncertainty
from lra_bench.leaderboard.aggregate import REACH_KEYS
from lra_bench.leaderboard.published import TASK_LABELS, TASKS
from lra_bench.leaderboard.reproduced import MARGIN_PP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: what sets an experiment apart within one method's cell (group and wide rows alike); `variant_full` is the legend
EXPERIMENT_COLUMNS = ("rank_budget", "window", "variant", "variant_full", "conformance", "off_protocol", "deviations")
GROUP_COLUMNS = (
    "protocol",
    "task",
    "attn",
    "selector",
    *EXPERIMENT_COLUMNS,
    "fingerprint",
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
    *REACH_KEYS,
    *uncertainty.GROUP_COLUMNS,
)
WIDE_COLUMNS = (
    "kind",
    "source",
    "protocol",
    "method",
    "attn",
    "selector",
    *EXPERIMENT_COLUMNS,
    "pretraining",
    *TASKS,
    *(f"{t}_std" for t in TASKS),
    *(f"{t}_window" for t in TASKS),
    "failed_tasks",
    "avg5",
    "avg6",
    "pathx_counted_as_50",
    "flag",
    "note",
    *uncertainty.WIDE_COLUMNS,
)
AVG5_LABEL = "Avg-5"
AVG6_LABEL = "Avg-6 (Path-X ✗=50)"
#: the summary tables' score columns, in `_wide_cells`' order
SCORE_HEADER = (*(TASK_LABELS[t] for t in TASKS), AVG5_LABEL, AVG6_LABEL)
CONVENTIONS = (
    f"**{AVG5_LABEL}** = mean test accuracy over ListOps, Text, Retrieval, Image, Pathfinder (LRA paper "
    f"convention). **{AVG6_LABEL}** = mean over all six tasks with Path-X failed or not run counted as 50 "
    "(S4/Mega convention). Both only when all five other tasks have a result. (n=…) = seeds."
)
LOCALITY_NOTE = (
    f"**{locality.LABEL}**: per task, the `attn=local` experiment (exact softmax within w tokens on each side) with "
    "the best mean validation accuracy; its test accuracy and window w are shown. It is how much of a task a purely "
    "local model reaches (Miralles-González et al. 2025, arXiv 2501.14850); a method below it on a task has not "
    "shown that it uses longer-range context there."
)
NOT_COMPARABLE = (
    "Runs that changed a value of their protocol (`⚠ off-protocol`: the changed keys are listed) or whose records "
    "predate that check (`⚠ protocol unchecked`). Not comparable with the published rows above."
)


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def _acc(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "—"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def _wide_cells(row: dict[str, Any]) -> list[str]:
    failed = set(filter(None, str(row.get("failed_tasks") or "").split(",")))
    cells = []
    for task in TASKS:
        if row.get(task) is not None:
            n, window = row.get(f"{task}_n"), row.get(f"{task}_window")
            notes = ", ".join([*([f"n={n}"] if n else []), *([f"w={window}"] if window is not None else [])])
            cells.append(_acc(row[task], row.get(f"{task}_std")) + (f" ({notes})" if notes else ""))
        else:
            cells.append("✗" if task in failed else "—")
    avg6 = _num(row.get("avg6"))
    if row.get("avg6") is not None and row.get("pathx_counted_as_50"):
        avg6 += "*"
    return [*cells, _num(row.get("avg5")), avg6]


def _kept(row: dict[str, Any]) -> str:
    """Whether a row's runs kept their protocol: yes, no (and what they changed), or unchecked."""
    if row.get("conformance") == "off":
        return "no: " + str(row.get("deviations") or "").replace(",", ", ")
    return {"on": "yes"}.get(str(row.get("conformance")), "unchecked")


def _reach_distance(row: dict[str, Any]) -> str:
    """`d (d_exact)`: the expected token distance of the method's attention and of the exact softmax."""
    if row.get("attn_distance") is None:
        return "—"
    return f"{row['attn_distance']:.1f} ({_num(row.get('attn_distance_exact'), '{:.1f}')})"


def _reach_mass(row: dict[str, Any]) -> str:
    values = [row.get(f"mass_within_{w}") for w in LOCALITY_WINDOWS]
    return "—" if all(v is None for v in values) else "/".join(_num(v) for v in values)


#: the all-groups table: each column's header and its cell of a group row
GROUP_TABLE: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("protocol", lambda r: r["protocol"]),
    ("task", lambda r: TASK_LABELS.get(r["task"], r["task"])),
    ("attn", lambda r: r["attn"]),
    ("selector", lambda r: r["selector"] or "—"),
    (
        "landmarks / window",
        lambda r: f"w={r['window']}" if r.get("window") is not None else _num(r["rank_budget"], "{}"),
    ),
    ("variant", lambda r: r.get("variant") or "—"),
    ("protocol kept", _kept),
    ("pretraining", lambda r: r["pretraining"]),
    ("n", lambda r: r["n"]),
    ("seeds", lambda r: r["seeds"]),
    ("test acc", lambda r: _acc(r["test_acc_mean"], r["test_acc_std"])),
    ("val acc", lambda r: _acc(r["val_acc_mean"], r["val_acc_std"])),
    ("step (ms, median)", lambda r: _num(r["step_time_median_ms"], "{:.1f}")),
    ("tokens/s", lambda r: _num(r["tokens_per_s"], "{:,.0f}")),
    ("peak mem (MiB)", lambda r: _num(r["peak_memory_mib"], "{:,.0f}")),
    ("params", lambda r: _num(r["params"], "{:,}")),
    ("device", lambda r: r["device"]),
    ("attn distance (exact)", _reach_distance),
    ("mass ≤ " + "/".join(str(w) for w in LOCALITY_WINDOWS), _reach_mass),
)


def _summary_cells(row: dict[str, Any], tag_variant: bool = False) -> list[str]:
    """A summary table's method, source and score cells (markdown and terminal alike); `tag_variant` adds an
    experiment's variant tag to its method (the terminal's; leaderboard.md spells variants out in its legend)."""
    ours = row["kind"] in ("ours", locality.KIND)
    method = f"{row['method']}{row.get('flag') or ''}{experiments.mark(row.get('conformance'))}"
    if tag_variant and ours and row.get("variant"):
        method += f" {experiments.short_variant(row['variant'])}"
    return [method, "ours" if ours else f"published: {row['source']}", *_wide_cells(row)]


def _wide_table(rows: Sequence[dict[str, Any]], deviations: bool = False) -> list[str]:
    header = ["method", "source", *SCORE_HEADER, *(["changed from the protocol"] if deviations else [])]
    changed = [[str(row.get("deviations") or "—").replace(",", ", ")] if deviations else [] for row in rows]
    return table(header, [_summary_cells(row) + more for row, more in zip(rows, changed)], escape=True)


def _intro_lines(dirs: Sequence[str], n_files: int) -> list[str]:
    """The page's title and what its numbers mean (inputs, accuracy, spread, published rows, confidence)."""
    return [
        "# LRA leaderboard",
        "",
        f"From {n_files} `results.json` file(s) under: {', '.join(f'`{d}`' for d in dirs)}.",
        "Accuracies in percent: test accuracy at the best-validation checkpoint; `±` = sample standard "
        "deviation over seeds (ddof=1, shown only for n ≥ 2); n = number of seeds.",
        "Published rows come from the papers (see *Published reference rows*); they are shown beside ours "
        "and never enter our means.",
        f"Confidence {uncertainty.CLIPPED}.",
        "",
        "## Per-method summary (test accuracy)",
        "",
        CONVENTIONS,
        "`*` on Avg-6: Path-X counted as 50. `✗`: failed or unfinished (ours) / FAIL (published). `—`: not run.",
        "",
    ]


def _kept_and_apart(rows: Sequence[dict[str, Any]], protocol: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A protocol's rows that kept it (shown beside its published rows, ranked) and the others (shown apart)."""
    mine = [r for r in rows if str(r["protocol"]) == protocol]
    return [r for r in mine if r.get("conformance") == "on"], [r for r in mine if r.get("conformance") != "on"]


def _protocol_lines(
    protocol: str,
    mine: Sequence[dict[str, Any]],
    published: Sequence[dict[str, Any]],
    reproductions: Sequence[dict[str, Any]],
) -> list[str]:
    """One protocol's summary: our on-protocol rows beside the published ones, its reproductions' verdicts, and
    the off-protocol runs in a table of their own."""
    ours, apart = _kept_and_apart(mine, protocol)
    beside = [r for r in published if str(r["protocol"]) == protocol]
    out = [f"### protocol: {protocol}", "", *_wide_table([*ours, *beside]), ""]
    out += reproduction_block(protocol, reproductions)
    if apart:  # never beside a published row without its mark: in a table of their own
        out += [f"#### protocol: {protocol} — not comparable", "", NOT_COMPARABLE, ""]
        out += [*_wide_table(apart, deviations=True), ""]
    return out


def _published_lines(
    sources: dict[str, dict[str, Any]], published: Sequence[dict[str, Any]], protocols: list[str]
) -> list[str]:
    """The published tables of the protocols our runs followed, each with its citation and notes; the others named."""
    shown = [src for src in sources.values() if src.get("protocol") in protocols]  # the protocols our runs followed
    out = ["## Published reference rows (not ours)", "", CONVENTIONS, ""]
    if not shown:
        out += ["(none for the protocols of these runs)", ""]
    for src in shown:
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
    others = [src["label"] for src in sources.values() if src not in shown]
    if others:
        out += [f"Published tables of other protocols, not shown: {', '.join(others)} (all of them: "
                "`leaderboard_wide.csv`, `lra_bench/leaderboard/published.json`).", ""]  # fmt: skip
    return out


def _bookkeeping_lines(board: dict[str, Any]) -> list[str]:
    """What is in no table above: failed or unfinished runs, unreadable records, superseded runs, evaluations."""
    failures, unreadable = board["failures"], board["unreadable"]
    superseded, evaluations = board["superseded"], board["evaluations"]
    body = [
        [f["output_dir"], f["status"], f["task"], f["attn"], f["selector"] or "—", f["seed"], f["reason"]]
        for f in failures
    ]
    out = [f"## Failed or unfinished runs ({len(failures)})", ""]
    out += (
        table(["output dir", "status", "task", "attn", "selector", "seed", "reason"], body, escape=True)
        if body
        else ["None."]
    )
    out += ["", f"## Unreadable records ({len(unreadable)})", ""]
    body = [[u["path"], u["reason"]] for u in unreadable]
    out += table(["path", "reason"], body, escape=True) if body else ["None."]
    if superseded:
        out += ["", "## Superseded runs (same fingerprint and seed; the newest completed run is kept)", ""]
        out += table(["dropped", "seed", "kept"], [[s["path"], s["seed"], s["kept"]] for s in superseded], escape=True)
    if evaluations:
        out += ["", f"## Evaluated checkpoints ({len(evaluations)}; not training runs, in no table above)", ""]
        shown = ("output_dir", "status", "task", "attn", "checkpoint", "checkpoint_step")
        body = [[*(e[k] for k in shown), _num(e["test_acc"]), e["reason"] or "—"] for e in evaluations]
        out += table(
            ["output dir", "status", "task", "attn", "checkpoint", "step", "test acc", "error"], body, escape=True
        )
    return out


def render_markdown(board: dict[str, Any], plots: Sequence[Path], sections: Sequence[str] = ()) -> str:
    """The whole `leaderboard.md` from `board` (`build.build_leaderboard`'s result): summary by protocol (with its
    reproductions' verdicts beside its published rows, and the locality baselines beside its methods), `sections`
    (markdown lines: uncertainty, Pareto), published rows, groups, failures, bad files, then the `plots`."""
    rows, wide, published, baselines = board["rows"], board["wide"], board["published"], board["locality"]
    out = _intro_lines(board["dirs"], board["n_files"])
    if baselines:
        out += [LOCALITY_NOTE, ""]
    protocols = sorted({str(r["protocol"]) for r in wide})
    for protocol in protocols:
        out += _protocol_lines(protocol, [*wide, *baselines], published, board["reproductions"])
    if not protocols:
        out += ["(no completed runs)", ""]
    out += list(sections)
    out += _published_lines(board["published_sources"], published, protocols)
    out += ["## All groups (one experiment each: runs that differ only in their seed)", ""]
    header = [name for name, _ in GROUP_TABLE]
    body = [[cell(r) for _, cell in GROUP_TABLE] for r in rows]
    out += [*(table(header, body, escape=True) if body else ["(no completed runs)"]), *variant_legend(rows), ""]
    out += _bookkeeping_lines(board)
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


def task_figure(task: str, rows: Sequence[dict[str, Any]]) -> Figure:
    """Test accuracy against peak memory and against step time for one task, one point per group; the error bars
    are the leaderboard's 95% intervals (`uncertainty`), the same as the Pareto charts', and the title says so; the
    legend sits beside the axes, so it hides no point."""
    fig = agg_figure(figsize=(13, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = (("peak_memory_mib", "peak memory (MiB)"), ("step_time_median_ms", "median step time (ms)"))
    for ax, (key, xlabel) in zip(axes, panels):
        points = [(i, r) for i, r in enumerate(rows) if r.get(key) is not None and r.get("test_acc_mean") is not None]
        for i, r in points:  # a row's colour is the same in both panels
            label = f"{r['attn']}" + (f"/{r['selector']}" if r["selector"] else "")
            label += f" m={r['rank_budget']}" if r["rank_budget"] is not None else ""
            label += f" w={r['window']}" if r.get("window") is not None else ""
            label += f" +SPT({r['pretraining']})" if r.get("pretraining") not in (None, "none") else ""
            label += f" [{r['protocol']}]" + experiments.mark(r.get("conformance"))
            label += f" {experiments.short_variant(r.get('variant'))}" if r.get("variant") else ""
            mean, low, high = r["test_acc_mean"], r.get("test_acc_ci_low"), r.get("test_acc_ci_high")
            error = None if low is None else [[mean - low], [high - mean]]
            ax.errorbar(r[key], mean, yerr=error, fmt="o", color=f"C{i % 10}", capsize=3, label=label)
        if not points:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    legend = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    if legend:  # one legend for both panels (the same rows), outside the axes
        fig.legend(list(legend.values()), list(legend), loc="outside right center", fontsize="x-small")
    fig.suptitle(f"{TASK_LABELS.get(task, task)}: accuracy against cost\n({uncertainty.ERROR_BARS})", fontsize=10)
    return fig


def _interval_cell(row: dict[str, Any], key: str, rank_key: str) -> str:
    mean = row.get(key)
    if mean is None:
        return "—"
    lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    if lo is None:
        return f"{mean:.2f} (n=1)" if row.get(f"{key}_n") == 1 else f"{mean:.2f}"
    rank = row.get(rank_key)
    return f"{mean:.2f} [{lo:.2f}, {hi:.2f}]" + (f" #{rank}" if rank is not None else "")


def _interval_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    header = ["method", *SCORE_HEADER]
    body = [
        [
            r["method"] + experiments.mark(r.get("conformance")),
            *(_interval_cell(r, t, f"{t}_rank") for t in TASKS),
            _interval_cell(r, "avg5", "rank_avg5"),
            _interval_cell(r, "avg6", "rank_avg6"),
        ]
        for r in rows
    ]
    return table(header, body, escape=True)


def uncertainty_section(wide: Sequence[dict[str, Any]]) -> list[str]:
    """Our methods per protocol: every task and both averages as mean [95% CI] #rank (ties share a rank). Ranks
    only among the protocol's on-protocol rows; the others follow in a table of their own, marked and unranked."""
    ours = [r for r in wide if r.get("kind") == "ours"]
    if not ours:
        return []
    out = [
        "## Ranking with uncertainty (ours)",
        "",
        "Each cell: mean test accuracy [95% confidence interval] #rank. The interval is Student-t over the seeds "
        "(n ≥ 2; one seed has none); an average's interval combines its tasks' seed spreads (Welch–Satterthwaite), "
        f"and a Path-X counted as 50 in {AVG6_LABEL} adds none. Rank = 1 + the number of methods whose interval lies "
        "wholly above this one's, so methods whose intervals overlap are tied. Ranks are among the on-protocol rows "
        "of one protocol (and task) only; off-protocol (⚠) and unchecked rows are listed apart and never ranked. "
        f"The {uncertainty.CLIPPED}.",
        "",
        CONVENTIONS,
        "",
    ]
    for protocol in sorted({str(r["protocol"]) for r in ours}):
        ranked, apart = _kept_and_apart(ours, protocol)
        out += [f"### protocol: {protocol}", ""]
        out += [*_interval_table(ranked), ""] if ranked else ["(no on-protocol rows: nothing ranked)", ""]
        if apart:
            out += [f"#### protocol: {protocol} — not ranked (not known to follow the protocol)", ""]
            out += [*_interval_table(apart), ""]
    return out


def _reproduction_table(entries: Sequence[dict[str, Any]]) -> list[str]:
    header = ["published", "task / average", "published value", "ours (on-protocol)", "ours: mean [95% CI] (n)",
              "reproduced?"]  # fmt: skip
    body = []
    for e in entries:
        ci = f" [{e['ci_low']:.2f}, {e['ci_high']:.2f}]" if e.get("ci_low") is not None else ""
        target = {"avg5": AVG5_LABEL, "avg6": AVG6_LABEL}.get(e["target"], TASK_LABELS.get(e["target"], e["target"]))
        body.append(
            [
                f"{e['published_method']} ({e['published_source']})",
                target,
                f"{e['published']:.2f}",
                e["method"],
                f"{e['mean']:.2f}{ci} (n={e['n']})",
                e["verdict"],
            ]
        )
    return table(header, body, escape=True)


def reproduction_block(protocol: str, entries: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown beside a protocol's summary: does each published number of this protocol reproduce?"""
    mine = [e for e in entries if e["protocol"] == protocol]
    if not mine:
        return []
    return [
        f"#### protocol: {protocol} — do our runs reproduce the published numbers?",
        "",
        f"*reproduced*: our 95% Student-t interval over seeds (≥ 2 seeds) lies within the published value ± "
        f"{MARGIN_PP:g} pp (a published single run's own test-set noise); *not reproduced*: the published value lies "
        "outside our interval; *cannot tell*: inside it, but the interval reaches beyond the margin; *1 seed: "
        "cannot tell*: one seed has no interval. Only our on-protocol runs of "
        f"this protocol are compared. {AVG5_LABEL} = mean of the five tasks without Path-X (LRA convention); "
        f"{AVG6_LABEL} = mean of all six with Path-X FAIL or not run = 50 (S4/Mega convention), shown only when a "
        "real Path-X number enters it; published averages are recomputed from the published columns.",
        "",
        *_reproduction_table(mine),
        "",
    ]


def variant_legend(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every variant label that names only some of its differing keys, with all of them."""
    seen: dict[str, str] = {}
    for r in rows:
        if r.get("variant_full") and r.get("variant") != r.get("variant_full"):
            seen.setdefault(str(r["variant"]), str(r["variant_full"]))
    if not seen:
        return []
    out = ["", "Variant legend (labels that name only their first keys; every key their experiments differ in):", ""]
    return out + [f"- `{label}`: {full}" for label, full in sorted(seen.items())]


def _rich_table(title: str, rows: Sequence[dict[str, Any]]) -> Table:
    """The summary for a terminal: score columns no row has a number in are left out."""
    header, lines = ["method", "source", *SCORE_HEADER], [_summary_cells(row, tag_variant=True) for row in rows]
    kept = [i for i in range(len(header)) if i < 2 or any(line[i] != "—" for line in lines)]
    table = Table(title=title, title_justify="left", title_style="bold", header_style="bold")
    for i in kept:
        table.add_column(header[i], justify="left" if i < 2 else "right")
    for row, line in zip(rows, lines):
        table.add_row(*(line[i] for i in kept), style=None if row["kind"] == "ours" else "dim")
    return table


def print_summary(wide: Sequence[dict[str, Any]], published: Sequence[dict[str, Any]], console: Console) -> None:
    """One table per protocol of our runs: ours on protocol and the protocol's published rows, then ours apart."""
    protocols = sorted({str(r["protocol"]) for r in wide if r.get("kind") == "ours"})
    for protocol in protocols:
        comparable, apart = _kept_and_apart([r for r in wide if r.get("kind") == "ours"], protocol)
        beside = [r for r in published if str(r["protocol"]) == protocol]
        if comparable or beside:
            console.print(_rich_table(f"protocol {protocol}: test accuracy (%)", [*comparable, *beside]))
        if apart:
            title = f"protocol {protocol}: not comparable with its published rows (⚠ changed the protocol)"
            console.print(_rich_table(title, apart))
    if not protocols:
        console.print("(no completed runs: no table)")
