"""The locality study's numbers and its page: accuracy against window beside the methods, and how far each reaches.

Per arm (a window or a method): mean test accuracy over seeds with a 95% interval — Student-t over seeds when there
are two or more, else the Wilson interval of the one run's test accuracy over its test examples (test-set noise only,
and said so) — plus the median expected token distance of its attention and of the exact softmax of the same
queries and keys (`lra_bench.diagnostics.metrics.locality`). The best window is chosen on mean validation accuracy,
never on test. Everything here is formatting of the rows' numbers; nothing is measured.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from scipy import stats

from lra_bench.kit.figures import agg_figure, save_figure
from lra_bench.kit.markdown import table
from lra_bench.kit.numbers import median_of
from lra_bench.stats.summary import t_interval

PLOT = "locality.png"


def wilson(acc: float, examples: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of one accuracy measured on `examples` test examples."""
    hits = round(acc * examples)
    ci = stats.binomtest(hits, examples).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per arm (windows in increasing order, then the methods), over its completed seeds."""
    ordered = sorted(rows, key=lambda r: (r["window"] is None, r["window"] or 0))
    labels = list(dict.fromkeys(r["label"] for r in ordered))
    out = []
    for label in labels:
        mine = [r for r in rows if r["label"] == label]
        done = [r for r in mine if r["test_acc"] is not None]
        tests = [float(r["test_acc"]) for r in done]
        vals = [float(r["val_acc"]) for r in done if r["val_acc"] is not None]
        mean = statistics.fmean(tests) if tests else None
        sd = statistics.stdev(tests) if len(tests) > 1 else None
        interval, basis = None, None
        if len(tests) > 1:
            interval, basis = t_interval(mean, sd, len(tests)), "seeds"
        elif tests and done[0].get("test_examples"):
            interval, basis = wilson(tests[0], int(done[0]["test_examples"])), "test examples"
        out.append(
            {
                "label": label,
                "attn": mine[0]["attn"],
                "window": mine[0]["window"],
                "n": len(tests),
                "failed": len(mine) - len(done),
                "test_mean": mean,
                "test_sd": sd,
                "test_ci": interval,
                "ci_basis": basis,
                "val_mean": statistics.fmean(vals) if vals else None,
                "attn_distance": median_of([r["attn_distance"] for r in done]),
                "attn_distance_exact": median_of([r["attn_distance_exact"] for r in done]),
                "mass_within_16": median_of([r["mass_within_16"] for r in done]),
            }
        )
    return out


def best_window(summary: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The window with the best mean validation accuracy (ties: the smaller window)."""
    windows = [e for e in summary if e["window"] is not None and e["val_mean"] is not None]
    return min(windows, key=lambda e: (-e["val_mean"], e["window"])) if windows else None


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def _acc_cell(entry: dict[str, Any]) -> str:
    if entry["test_mean"] is None:
        return "—"
    cell = _pct(entry["test_mean"]) + (f" ± {100 * entry['test_sd']:.1f}" if entry["test_sd"] is not None else "")
    if entry["test_ci"] is not None:
        low, high = entry["test_ci"]
        cell += f" [{100 * low:.1f}, {100 * high:.1f}]"
    return cell


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if value is None else fmt.format(value)


def render_markdown(study: dict[str, Any], h: str = "#", img_dir: str = ".") -> str:
    summary, s = study["summary"], study["settings"]
    rows = study["rows"]
    first = next((r for r in rows if r["status"] == "completed"), rows[0] if rows else {})
    steps = sorted({r["train_steps"] for r in rows if r["train_steps"] is not None})
    bases = {e["ci_basis"] for e in summary if e["ci_basis"]}
    interval = {
        "seeds": "Student-t 95% interval over seeds",
        "test examples": "one seed: Wilson 95% interval over the test examples (test-set noise only, not seed noise)",
    }
    lines = [
        f"{h} Locality: accuracy against attention window on {first.get('task')} (`python -m lra_bench.locality`)",
        "",
        f"`attn=local` (exact softmax within w tokens on each side) at w ∈ {{{', '.join(map(str, s['windows']))}}} "
        f"beside {', '.join(f'`{m}`' for m in s['methods'])}, at equal budget: every run gets the same overrides "
        f"(`{' '.join(s['run_overrides'])}`), only the attention differs; seeds {', '.join(map(str, s['seeds']))}; "
        f"sequence length {first.get('seq_len')}, {', '.join(map(str, steps)) or '—'} training steps, protocol "
        f"`{first.get('protocol')}`. Test accuracy (%) at the best-validation checkpoint: mean ± sample std "
        f"[{'; '.join(interval[b] for b in sorted(bases)) or 'no interval'}]. *Distance*: median over layers, "
        "heads, probe sequences and seeds of the expected token distance Σ_ij A_ij |i − j| / n of the run's own "
        "attention (and, in brackets, of the exact softmax of the same queries and keys); *mass ≤ 16*: the share of "
        "attention within 16 tokens.",
        "",
    ]
    lines += table(
        ["attention", "test acc (%)", "val acc (%)", "seeds", "distance (exact)", "mass ≤ 16"],
        [
            [
                f"`{e['label']}`",
                _acc_cell(e),
                _pct(e["val_mean"]),
                f"{e['n']}" + (f" ({e['failed']} failed)" if e["failed"] else ""),
                f"{_num(e['attn_distance'])} ({_num(e['attn_distance_exact'])})",
                _num(e["mass_within_16"], "{:.2f}"),
            ]
            for e in summary
        ],
    )
    lines += ["", *reading(study), ""]
    if study.get("plot"):
        lines += [f"![accuracy against window]({img_dir}/{study['plot']})", ""]
    unequal = study.get("unequal_keys") or []
    lines.append(
        "Equal budget checked on the records: the runs' experiment identities differ only in the attention, its "
        "selector and the seed."
        if not unequal
        else f"**Not at equal budget**: the runs also differ in {unequal}."
    )
    hw = study["env"]["hardware"]
    codes = sorted({f"{c['commit'][:12]}{' (dirty)' if c.get('dirty') else ''}" for r in rows if (c := r.get("code"))})
    code = f"runs' code {', '.join(codes)}" if codes else f"git `{study['env']['git_commit']}`"
    lines += [
        "",
        f"Machine: {hw.get('cpu')}, {hw.get('cpu_count')} logical CPUs, {code}; "
        f"{study['wall_s']:.0f} s wall-clock for {len(rows)} runs; `uptime` before: `{study['uptime_before']}`; after: "
        f"`{study['uptime_after']}`. Reproduce: `{study['command']}`.",
    ]
    return "\n".join(lines) + "\n"


def reading(study: dict[str, Any]) -> list[str]:
    """What the table says, in sentences computed from it: the best window on validation against each method."""
    summary = study["summary"]
    best = best_window(summary)
    if best is None or best["test_mean"] is None:
        return ["No window completed: nothing to compare."]
    out = [
        f"Best window on validation: w = {best['window']}, test {_acc_cell(best)}."
        + (" It covers the whole sequence." if best["window"] >= (study["rows"][0].get("seq_len") or math.inf) else "")
    ]
    for e in summary:
        if e["window"] is not None or e["test_mean"] is None:
            continue
        diff = 100 * (e["test_mean"] - best["test_mean"])
        overlap = (
            e["test_ci"] is not None
            and best["test_ci"] is not None
            and e["test_ci"][0] <= best["test_ci"][1]
            and best["test_ci"][0] <= e["test_ci"][1]
        )
        verdict = "the intervals overlap: not distinguishable at this size" if overlap else "the intervals are apart"
        out.append(f"`{e['label']}`: test {_acc_cell(e)}, {diff:+.1f} points against the best window ({verdict}).")
    return [" ".join(out)]


def plot(study: dict[str, Any], out_dir: Path) -> str | None:
    """Test accuracy against window (log scale) with each method's accuracy as a horizontal line (band: its interval),
    and the expected attention distance against window beside it."""
    summary = study["summary"]
    windows = [e for e in summary if e["window"] is not None and e["test_mean"] is not None]
    methods = [e for e in summary if e["window"] is None and e["test_mean"] is not None]
    if not windows:
        return None
    fig = agg_figure(figsize=(11, 4.2), layout="constrained")
    acc, reach = fig.subplots(1, 2)
    xs = [e["window"] for e in windows]

    def errors(entries: list[dict[str, Any]]) -> list[list[float]]:
        low = [100 * (e["test_mean"] - e["test_ci"][0]) if e["test_ci"] else 0.0 for e in entries]
        high = [100 * (e["test_ci"][1] - e["test_mean"]) if e["test_ci"] else 0.0 for e in entries]
        return [low, high]

    acc.errorbar(xs, [100 * e["test_mean"] for e in windows], yerr=errors(windows), fmt="o-", capsize=3,
                 color="black", label="local (window w)")  # fmt: skip
    for i, e in enumerate(methods):
        color = f"C{i}"
        acc.axhline(100 * e["test_mean"], color=color, label=e["label"])
        if e["test_ci"]:
            acc.axhspan(100 * e["test_ci"][0], 100 * e["test_ci"][1], color=color, alpha=0.15)
    acc.set(xscale="log", xlabel="window w (tokens on each side)", ylabel="test accuracy (%)")
    acc.set_title("accuracy (bars/bands: 95% interval)")
    reach.plot(xs, [e["attn_distance"] for e in windows], "o-", color="black", label="local (window w)")
    for i, e in enumerate(methods):
        if e["attn_distance"] is not None:
            reach.axhline(e["attn_distance"], color=f"C{i}", label=e["label"])
    if any(e["attn_distance_exact"] is not None for e in windows):
        exact = [e["attn_distance_exact"] for e in windows]
        reach.plot(xs, exact, "s--", color="grey", label="exact softmax of the local runs' q, k")
    reach.set(xscale="log", xlabel="window w (tokens on each side)", ylabel="expected token distance")
    reach.set_title("how far attention reaches")
    for ax in (acc, reach):
        ax.set_xticks(xs, [str(x) for x in xs])  # the windows themselves, not powers of ten
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"Locality study: {study['rows'][0].get('task')}")
    save_figure(fig, out_dir / PLOT, tight=False)
    return PLOT
