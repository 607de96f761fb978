"""Accuracy against cost on `docs/reproductions.md`: per attention, the mean test accuracy and its 95% interval over
completed on-protocol seeds beside the median training-step time and peak memory of the same runs — the LRA
paper's Figure 3 (accuracy against speed and memory), from our runs.

Comparable rows only: a step time depends on the machine and on the encoder's kernel path, and the reproductions
run on whichever CPU type a session draws. So the cost columns and the figure use the runs of one machine and path —
the CPU (name, identity and vector unit) and `model.kernels` that most completed runs share (`Run.timing`) — and an
attention with no run there is listed without cost. Accuracy is over every completed seed (it does not depend on
the machine beyond fp32 rounding). Both cost measures are of the whole training step and process, measured while
the other core ran another reproduction (the load is in each record).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lra_bench.kit.figures import pyplot, save_figure
from lra_bench.kit.markdown import table
from lra_bench.kit.numbers import median_of
from lra_bench.leaderboard.reproduced import reproduction_interval
from lra_bench.reproduction_runs import Run, completed

COST_FIGURE = "reproductions_cost.png"


@dataclass(frozen=True)
class CostRow:
    attn: str
    accuracy: float  # mean test accuracy, %
    interval: tuple[float, float] | None  # 95% t-interval, % (≥ 2 seeds)
    seeds: int
    step_s: float | None  # median over this attention's runs on the reference machine
    memory_mib: float | None
    timed_runs: int  # how many runs the cost columns are over


def cost_rows(runs: Sequence[Run]) -> tuple[list[CostRow], str | None]:
    """One row per attention with a completed seed, and the machine and kernel path the cost columns are from: the
    one most completed runs were timed on (`Run.timing`; ties: the first in name order)."""
    done = {attn: mine for attn in sorted({r.attn for r in runs}) if (mine := completed(runs, attn))}
    counts = Counter(r.timing for mine in done.values() for r in mine)
    where = min(counts, key=lambda m: (-counts[m], m)) if counts else None
    rows = []
    for attn, mine in done.items():
        accs = [100 * float(r.test_acc or 0.0) for r in mine]
        timed = [r.typed.metrics for r in mine if r.timing == where]
        step, memory = median_of(m.step_time_median_s for m in timed), median_of(m.peak_memory_mib for m in timed)
        rows.append(
            CostRow(attn, statistics.fmean(accs), reproduction_interval(accs), len(accs), step, memory, len(timed))
        )
    return rows, where


def cost_section(runs: Sequence[Run], figure: str | None) -> list[str]:
    rows, where = cost_rows(runs)
    lines = ["## Accuracy against cost", ""]
    if not rows:
        return [*lines, "No completed seed yet.", ""]
    body = [
        [
            r.attn,
            f"{r.accuracy:.2f}" + (f" [{r.interval[0]:.2f}, {r.interval[1]:.2f}]" if r.interval else ""),
            str(r.seeds),
            f"{r.step_s:.3f} s" if r.step_s is not None else "— (not run on this machine and path)",
            f"{r.memory_mib:,.0f} MiB" if r.memory_mib is not None else "—",
            str(r.timed_runs),
        ]
        for r in rows
    ]
    header = ["attention", "test acc % (95% CI)", "seeds", "step time (median)", "peak memory", "runs timed"]
    lines += [
        f"Cost columns from the runs on {where} (the machine and kernel path most completed runs share; a step "
        "time from another is not comparable), whole training step and process, the other core running another "
        "reproduction.",
        "",
        *table(header, body),
        "",
    ]
    if figure and any(r.step_s is not None for r in rows):
        lines += [f"![accuracy against step time and peak memory]({figure})", ""]
    return lines


def plot_cost(runs: Sequence[Run], path: Path) -> Path | None:
    """Accuracy (mean, 95% interval) against step time and against peak memory; None (and no file) without a
    timed row."""
    rows, where = cost_rows(runs)
    rows = [r for r in rows if r.step_s is not None and r.memory_mib is not None]
    if not rows:
        path.unlink(missing_ok=True)
        return None
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, label, value in (
        (axes[0], "training step time (s, median)", lambda r: r.step_s),
        (axes[1], "peak memory (MiB)", lambda r: r.memory_mib),
    ):
        for r in rows:
            low, high = r.interval or (r.accuracy, r.accuracy)
            ax.errorbar(value(r), r.accuracy, yerr=[[r.accuracy - low], [high - r.accuracy]], fmt="o", capsize=3)
            ax.annotate(f"{r.attn} ({r.seeds})", (value(r), r.accuracy), textcoords="offset points", xytext=(5, 4))
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("ListOps test accuracy (%, mean and 95% CI; seeds)")
    fig.suptitle(f"Accuracy against cost — timed on {where}", fontsize=9)
    return save_figure(fig, path)
