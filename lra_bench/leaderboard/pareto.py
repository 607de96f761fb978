"""The LRA paper's picture (Tay et al. 2021, Figure 3) for any sweep: accuracy against speed, memory as bubble area
(what the axes are: `pareto_section`'s text).

* Speed is relative to full attention at the same protocol, task, sequence length and device, on a log scale (2×
  faster sits as far right of 1 as 2× slower sits left of it). The reference is the one on-protocol, from-scratch
  `full` row of that key: an off-protocol `full` (bf16, more steps) runs at another speed, and taking whichever
  `full` row came last would move every point. No such row, or several (variants): no ratio, a note says why.
* On CPU runs peak memory is the process's peak RSS (see `lra_bench.run.metrics`).
* The Pareto frontier is taken among the on-protocol points only: an off-protocol or unchecked point is drawn
  (hollow, marked ⚠) but neither on the frontier nor allowed to push an on-protocol point off it.
* The average chart takes each method row's own task rows (`task_fingerprints`: same conformance and variant),
  never another experiment's of the same method.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import geometric_mean
from typing import TYPE_CHECKING, Any

from lra_bench.kit.figures import agg_figure, save_figure
from lra_bench.kit.markdown import table
from lra_bench.leaderboard import experiments
from lra_bench.leaderboard.aggregate import row_label, values_at
from lra_bench.leaderboard.published import FIVE_TASKS, TASK_LABELS, TASKS
from lra_bench.leaderboard.uncertainty import ERROR_BARS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REFERENCE = "full"
REFERENCE_KEYS = ("protocol", "task", "seq_len", "device")
BUBBLE = 2000.0  # marker area (points²) of the largest memory
AVERAGE_TITLE = "LRA 5-task average (Path-X not counted)"
#: the on-protocol `full` rows of each (protocol, task, length, device): exactly one is the speed reference
References = dict[tuple[Any, ...], list[dict[str, Any]]]


@dataclass
class Point:
    method: str
    protocol: str
    speed: float  # relative to full attention (> 1 = faster)
    accuracy: float  # percent
    memory: float  # MiB (task chart) or relative to full attention (average chart)
    ci: tuple[float, float] | None = None
    on_frontier: bool = False
    comparable: bool = True  # on-protocol: may be on the frontier


@dataclass
class Chart:
    protocol: str
    target: str  # a task key or "avg5"
    points: list[Point]
    memory_label: str
    path: Path | None = None

    @property
    def title(self) -> str:
        what = AVERAGE_TITLE if self.target == "avg5" else TASK_LABELS.get(self.target, self.target)
        return f"{what} [{self.protocol}]: accuracy, speed and memory"

    @property
    def frontier(self) -> list[Point]:
        return sorted((p for p in self.points if p.on_frontier), key=lambda p: p.speed)


def mark_frontier(points: Sequence[Point]) -> None:
    """A comparable point is on the frontier when no other comparable point is at least as fast and as accurate,
    and better in one; a point that is not comparable (off-protocol, unchecked) never is, and never beats one."""
    comparable = [p for p in points if p.comparable]
    for p in points:
        p.on_frontier = p.comparable and not any(
            q is not p
            and q.speed >= p.speed
            and q.accuracy >= p.accuracy
            and (q.speed > p.speed or q.accuracy > p.accuracy)
            for q in comparable
        )


def _references(rows: Sequence[dict[str, Any]]) -> References:
    """Every on-protocol, from-scratch `full` row with a step time, by (protocol, task, length, device): the
    candidates for the speed reference (exactly one is needed)."""
    refs: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if (
            r.get("attn") == REFERENCE
            and r.get("conformance") == "on"
            and r.get("pretraining") in (None, "none")
            and r.get("seq_len") is not None
            and r.get("step_time_median_ms")
        ):
            refs.setdefault(values_at(r, REFERENCE_KEYS), []).append(r)
    return refs


def _relative(row: dict[str, Any], refs: References) -> tuple[float, float | None] | str:
    """(speed, memory) of a group row relative to its full-attention reference, or why there is none."""
    if row.get("seq_len") is None or not row.get("step_time_median_ms"):
        return "no sequence length or step time recorded"
    found = refs.get(values_at(row, REFERENCE_KEYS), [])
    if not found:
        return "no on-protocol full-attention run with the same protocol, task, sequence length and device"
    if len(found) > 1:
        variants = "; ".join(r.get("variant") or "—" for r in found)
        return f"several on-protocol full-attention runs with the same key ({variants}): no single reference"
    ref = found[0]
    speed = ref["step_time_median_ms"] / row["step_time_median_ms"]
    mem = row.get("peak_memory_mib")
    ref_mem = ref.get("peak_memory_mib")
    return speed, (mem / ref_mem if mem is not None and ref_mem else None)


def _label(row: dict[str, Any]) -> str:
    """The method, its variant and pretraining, and ⚠ when it is not known to follow its protocol."""
    return row_label(row) + experiments.mark(row.get("conformance"))


def task_charts(rows: Sequence[dict[str, Any]], notes: list[str]) -> list[Chart]:
    refs = _references(rows)
    charts: dict[tuple[str, str], Chart] = {}
    for row in rows:
        if row.get("test_acc_mean") is None:
            continue
        rel = _relative(row, refs)
        key = (str(row.get("protocol")), str(row.get("task")))
        if isinstance(rel, str) or row.get("peak_memory_mib") is None:
            why = rel if isinstance(rel, str) else "no peak memory recorded"
            notes.append(f"{_label(row)} on {key[1]} [{key[0]}]: left out of the chart, no speed ratio drawn ({why})")
            continue
        ci = (row["test_acc_ci_low"], row["test_acc_ci_high"]) if row.get("test_acc_ci_low") is not None else None
        chart = charts.setdefault(key, Chart(key[0], key[1], [], "peak memory (MiB)"))
        on = row.get("conformance") == "on"
        chart.points.append(
            Point(_label(row), key[0], rel[0], row["test_acc_mean"], row["peak_memory_mib"], ci, comparable=on)
        )
    return [charts[k] for k in sorted(charts, key=lambda k: (k[0], TASKS.index(k[1]) if k[1] in TASKS else 99))]


def average_charts(rows: Sequence[dict[str, Any]], wide: Sequence[dict[str, Any]]) -> list[Chart]:
    """Methods with an LRA 5-task average and a full-attention reference on each of the five tasks."""
    refs = _references(rows)
    by_fingerprint = {row.get("fingerprint"): row for row in rows}
    charts: dict[str, Chart] = {}
    for method in wide:
        if method.get("kind") != "ours" or method.get("avg5") is None:
            continue
        own = method.get("task_fingerprints") or {}
        tasks = {t: by_fingerprint[own[t]] for t in FIVE_TASKS if own.get(t) in by_fingerprint}
        rel = [_relative(tasks[t], refs) if t in tasks else None for t in FIVE_TASKS]
        if any(r is None or isinstance(r, str) or r[1] is None for r in rel):
            continue
        protocol = str(method.get("protocol"))
        ci = (method["avg5_ci_low"], method["avg5_ci_high"]) if method.get("avg5_ci_low") is not None else None
        chart = charts.setdefault(protocol, Chart(protocol, "avg5", [], "peak memory relative to full attention"))
        speed, memory = geometric_mean([r[0] for r in rel]), geometric_mean([r[1] for r in rel])  # type: ignore[index,misc]
        label = method["method"] + experiments.mark(method.get("conformance"))
        on = method.get("conformance") == "on"
        chart.points.append(Point(label, protocol, speed, method["avg5"], memory, ci, comparable=on))
    return [charts[k] for k in sorted(charts)]


def chart_figure(chart: Chart) -> Figure:
    """Bubble chart with the frontier as a step line (matplotlib Agg, no global pyplot state); its error bars are
    the leaderboard's intervals (`uncertainty.ERROR_BARS`), as the per-task plots' are."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # matplotlib only when drawing (kit.figures)

    fig = agg_figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.subplots()
    biggest = max(p.memory for p in chart.points)
    points = sorted(chart.points, key=lambda p: (p.speed, p.accuracy))
    for i, p in enumerate(points):
        color = f"C{i % 10}"
        ax.scatter([p.speed], [p.accuracy], s=BUBBLE * p.memory / biggest, color=color, alpha=0.45,
                   edgecolors="black", linewidths=0.8, zorder=2,
                   facecolors=color if p.comparable else "none",
                   linestyles="solid" if p.comparable else "--")  # fmt: skip
        if p.ci is not None:
            ax.errorbar([p.speed], [p.accuracy], yerr=[[p.accuracy - p.ci[0]], [p.ci[1] - p.accuracy]],
                        fmt="none", ecolor=color, capsize=3, linewidth=1, zorder=3)  # fmt: skip
        above = i % 2 == 0  # alternate labels above/below, so neighbours do not print over each other
        gap = math.sqrt(BUBBLE * p.memory / biggest / math.pi) + 3  # the bubble's radius in points, and a bit
        ax.annotate(f"{p.method}{' ★' if p.on_frontier else ''}", (p.speed, p.accuracy),
                    xytext=(0, gap if above else -gap), textcoords="offset points", ha="center",
                    va="bottom" if above else "top", fontsize=8, color=color, zorder=4)  # fmt: skip
    front = chart.frontier
    if len(front) > 1:
        ax.step([p.speed for p in front], [p.accuracy for p in front], where="post", color="black",
                linestyle="--", linewidth=1, label="Pareto frontier (★)", zorder=1)  # fmt: skip
    else:
        ax.plot([], [], " ", label=f"Pareto frontier (★): {front[0].method}" if front else "Pareto frontier: —")
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":", zorder=0)
    ax.set_xscale("log")
    speeds = [p.speed for p in chart.points]
    ax.set_xlim(min(speeds + [1.0]) / 1.5, max(speeds + [1.0]) * 1.5)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    accs = [v for p in chart.points for v in (*(p.ci or ()), p.accuracy)]
    pad = max(1.0, 0.12 * (max(accs) - min(accs)))
    ax.set_ylim(min(accs) - pad, max(accs) + pad)
    ax.set_xlabel("training speed relative to on-protocol full attention (its median step time / the method's)")
    ax.set_ylabel("LRA 5-task average test accuracy (%)" if chart.target == "avg5" else "test accuracy (%)")
    digits = 2 if chart.target == "avg5" else 0
    for fraction in (0.25, 0.5, 1.0):  # size key: area ∝ memory from 0, so half the area = half the memory
        ax.scatter([], [], s=BUBBLE * fraction, color="grey", alpha=0.3, edgecolors="black", linewidths=0.5,
                   label=f"{fraction * biggest:,.{digits}f}")  # fmt: skip
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, labelspacing=3.4, borderpad=1.6,
              title=f"bubble area ∝\n{chart.memory_label}", title_fontsize=8, frameon=False)  # fmt: skip
    ax.grid(alpha=0.3, which="major")
    ax.set_title(f"{chart.title}\n({ERROR_BARS})", fontsize=10)
    return fig


def build_charts(
    rows: Sequence[dict[str, Any]], wide: Sequence[dict[str, Any]], out_dir: Path, plots: bool = True
) -> tuple[list[Chart], list[str]]:
    """Every chart this sweep supports (the 5-task average per protocol, then each task with ≥ 2 methods), with
    their frontiers marked and (when `plots`) PNGs written as `leaderboard_pareto_<protocol>_<target>.png`."""
    notes: list[str] = []
    charts = [c for c in (*average_charts(rows, wide), *task_charts(rows, notes)) if len(c.points) >= 2]
    for chart in charts:
        mark_frontier(chart.points)
        if plots:
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", chart.protocol)
            path = Path(out_dir) / f"leaderboard_pareto_{slug}_{chart.target}.png"
            chart.path = save_figure(chart_figure(chart), path, tight=False)
    return charts, notes


def pareto_section(charts: Sequence[Chart], notes: Sequence[str]) -> list[str]:
    """Markdown: each chart's image, its points and its frontier."""
    if not charts and not notes:
        return []
    out = [
        "## Speed, accuracy and memory (the LRA paper's Figure 3)",
        "",
        "x: training speed relative to the on-protocol full-attention run of the same protocol, task, sequence "
        "length and device (median step times; > 1 = faster); a row without exactly one such run gets no ratio and "
        "is listed below the charts. y: test accuracy; on the average chart the LRA 5-task average (ListOps, Text, "
        "Retrieval, Image, Pathfinder; Path-X not counted). Bubble area ∝ peak memory. ★ = on the Pareto frontier, "
        "taken among on-protocol points only (no other on-protocol method is both at least as fast and at least as "
        "accurate); ⚠ points (off-protocol or unchecked, hollow in the charts) are shown but never on it.",
        "",
    ]
    for chart in charts:
        out += [f"### {chart.title}", ""]
        if chart.path is not None:
            out += [f"![{chart.path.stem}]({chart.path.name})", ""]
        body = [
            [
                p.method,
                f"{p.speed:.2f}×",
                f"{p.accuracy:.2f}",
                f"{p.ci[0]:.2f} – {p.ci[1]:.2f}" if p.ci else "—",
                f"{p.memory:.2f}" if chart.target == "avg5" else f"{p.memory:,.0f}",
                "★" if p.on_frontier else "",
            ]
            for p in sorted(chart.points, key=lambda p: -p.speed)
        ]
        out += table(["method", "speed vs full", "accuracy (%)", "95% CI", chart.memory_label, "frontier"], body)
        out += ["", f"Pareto frontier: {', '.join(p.method for p in chart.frontier)}.", ""]
    out += [f"- {n}" for n in notes]
    return out + ([""] if notes else [])


def points_table(charts: Sequence[Chart]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of every chart's points (for W&B)."""
    columns = ["protocol", "target", "method", "speed_vs_full", "accuracy", "ci_low", "ci_high", "memory", "frontier"]
    data = [
        [c.protocol, c.target, p.method, p.speed, p.accuracy, *(p.ci or (None, None)), p.memory, p.on_frontier]
        for c in charts
        for p in c.points
    ]
    return columns, data
