"""From the sweep's rows to numbers that answer questions: speed-ups against `full`, GPA/Nyström at equal m,
log-log slopes, achieved rate, target verdicts; then `bench.md` and the PNG plots.

Everything here is a pure function of the rows (and the run's settings), so `docs/results.md` is rendered
from `bench.json` by the same code — numbers are never typed by hand.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from lra_bench.bench.stats import loglog_slope
from lra_bench.kit.figures import pyplot, save_figure
from lra_bench.kit.markdown import table

MODES = ("forward", "forward_backward")
MODE_TITLE = {"forward": "forward (inference, no grad)", "forward_backward": "forward + backward (training)"}


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def _labels(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in rows))


def in_scope(row: dict[str, Any], scope: str = "landmark") -> bool:
    """The methods the targets are about: `landmark` = registry attentions swept over m (a landmark count);
    `efficient` = every registry attention other than exact `full`."""
    if row.get("kind") != "attention" or row.get("attn") == "full":
        return False
    return scope == "efficient" or row.get("m") is not None


def speedups(rows: list[dict[str, Any]], baseline: str = "full") -> list[dict[str, Any]]:
    """t(baseline)/t(method) at each (mode, n) where both ran."""
    ok = _ok(rows)
    base = {(r["mode"], r["n"]): r["time_median_s"] for r in ok if r["label"] == baseline}
    return [
        {"label": r["label"], "mode": r["mode"], "n": r["n"], "speedup": base[(r["mode"], r["n"])] / r["time_median_s"]}
        for r in ok
        if r["label"] != baseline and (r["mode"], r["n"]) in base
    ]


def pair_ratios(rows: list[dict[str, Any]], num: str, den: str) -> list[dict[str, Any]]:
    """t(num)/t(den), each with its own default selector, at equal m, per (mode, n)."""
    ok = [r for r in _ok(rows) if r.get("default_selector", True)]
    den_rows = {(r["mode"], r["n"], str(r["m"])): r for r in ok if r["attn"] == den}
    pairs = [(r, den_rows.get((r["mode"], r["n"], str(r["m"])))) for r in ok if r["attn"] == num]
    return [
        {
            "num": r["label"],
            "den": d["label"],
            "mode": r["mode"],
            "n": r["n"],
            "m": r["m"],
            "ratio": r["time_median_s"] / d["time_median_s"],
        }
        for r, d in pairs
        if d is not None
    ]


def slopes(rows: list[dict[str, Any]], lo: int, hi: int, scope: str = "landmark") -> list[dict[str, Any]]:
    """Log-log slope of time and of peak memory against n over lo ≤ n ≤ hi, per (label, mode)."""
    ok = _ok(rows)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        groups[(r["label"], r["mode"])].append(r)
    out = []
    for (label, mode), rs in groups.items():
        ns = [r["n"] for r in rs]
        inside = [n for n in ns if lo <= n <= hi]
        out.append(
            {
                "label": label,
                "mode": mode,
                "n_min": min(inside) if inside else None,
                "n_max": max(inside) if inside else None,
                "points": len(inside),
                "time_slope": loglog_slope(ns, [r["time_median_s"] for r in rs], lo, hi),
                "memory_slope": loglog_slope(ns, [r["peak_mem_bytes"] for r in rs], lo, hi),
                "in_scope": in_scope(rs[0], scope),
            }
        )
    return out


def targets(rows: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Each configured target (`conf/bench.yaml: targets`) as {target, threshold, verdict (met/missed/not
    measured), detail}."""
    mode = spec.get("mode", "forward_backward")
    scope = spec.get("scope", "landmark")
    out = []
    labels_eff = [lab for lab in _labels(rows) if any(in_scope(r, scope) for r in rows if r["label"] == lab)]
    sp = {(s["label"], s["n"]): s["speedup"] for s in speedups(rows) if s["mode"] == mode}
    for n, need in sorted((int(k), float(v)) for k, v in (spec.get("speedup_vs_full") or {}).items()):
        got = {lab: sp.get((lab, n)) for lab in labels_eff}
        out.append(
            _verdict(f"speed-up vs full at n={n} ({mode})", f"≥ {need:g}×", got, lambda x, t=need: x >= t, "{:.1f}×")
        )
    ratio = spec.get("time_ratio_at_equal_m") or {}
    if ratio:
        num, den = ratio["pair"]
        rs = [r for r in pair_ratios(rows, num, den) if r["mode"] == mode]
        got = {f"{r['num']} n={r['n']}": r["ratio"] for r in rs}
        need = float(ratio["max"])
        out.append(
            _verdict(f"{num}/{den} time at equal m ({mode})", f"≤ {need:g}×", got, lambda x: x <= need, "{:.2f}×")
        )
    if spec.get("loglog_slope_max") is not None:
        lo, hi = (int(x) for x in spec.get("slope_range", [1024, 16384]))
        need = float(spec["loglog_slope_max"])
        sl = [s for s in slopes(rows, lo, hi, scope) if s["mode"] == mode and s["in_scope"]]
        for key, name in (("time_slope", "time"), ("memory_slope", "memory")):
            got = {s["label"]: s[key] for s in sl if s["points"] >= 2 and s["n_max"] == hi and s["n_min"] == lo}
            for s in sl:
                got.setdefault(s["label"], None)
            out.append(
                _verdict(
                    f"{name} slope on log-log, n={lo}…{hi} ({mode})", f"≤ {need:g}", got, lambda x: x <= need, "{:.2f}"
                )
            )
    if spec.get("matmul_rate_fraction_min") is not None:
        n = int(spec.get("rate_n", 16384))
        need = float(spec["matmul_rate_fraction_min"])
        rate = {r["label"]: r.get("rate_fraction") for r in reversed(_ok(rows)) if r["n"] == n and r["mode"] == mode}
        got = {lab: rate.get(lab) for lab in labels_eff}
        out.append(
            _verdict(
                f"achieved rate / matmul rate at n={n} ({mode})", f"≥ {need:.0%}", got, lambda x: x >= need, "{:.1%}"
            )
        )
    return out


#: how many unmeasured configurations a target's detail names one by one (more: a count)
MISSING_NAMED = 5


def _verdict(name: str, threshold: str, got: dict[str, float | None], passes: Any, fmt: str) -> dict[str, Any]:
    measured = {k: v for k, v in got.items() if v is not None}
    missing = sorted(k for k, v in got.items() if v is None)
    failing = sorted(k for k, v in measured.items() if not passes(v))
    if not measured:
        verdict = "not measured"
    elif failing:
        verdict = "missed"
    else:
        verdict = "met" if not missing else "met where measured"
    detail = []
    if failing:
        detail.append("missed by " + ", ".join(f"{k} ({fmt.format(measured[k])})" for k in failing))
    passing = sorted(k for k in measured if k not in failing)
    if passing:
        detail.append("met by " + ", ".join(f"{k} ({fmt.format(measured[k])})" for k in passing))
    if missing and not measured:
        detail.append(f"none of the {len(missing)} configurations ran at this length")
    elif len(missing) > MISSING_NAMED:
        detail.append(f"not measured for {len(missing)} configurations (listed in bench.json: `summary.targets`)")
    elif missing:
        detail.append("not measured: " + ", ".join(missing))
    return {
        "target": name,
        "threshold": threshold,
        "verdict": verdict,
        "values": measured,
        "failing": failing,
        "missing": missing,
        "detail": "; ".join(detail),
    }


def summarize_bench(rows: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    lo, hi = (int(x) for x in settings["targets"].get("slope_range", [1024, 16384]))
    num, den = settings["targets"].get("time_ratio_at_equal_m", {}).get("pair", ["gpa", "nystrom"])
    return {
        "speedups": speedups(rows),
        "pair_ratios": pair_ratios(rows, num, den),
        "slopes": slopes(rows, lo, hi, settings["targets"].get("scope", "landmark")),
        "targets": targets(rows, settings["targets"]),
    }


# ----------------------------------------------------------------------------------------------------- markdown


def _fmt_ms(s: float | None) -> str:
    if s is None:
        return "—"
    ms = s * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _cell_status(r: dict[str, Any]) -> str | None:
    if r.get("status") == "skipped":
        return "skip"
    return r["status"] if r.get("status") in ("error", "timeout") else None


def _n_table(head: str, ns: list[int], cells: dict[str, dict[int, str]]) -> list[str]:
    """One row per key of `cells`, one column per n; "—" where a row has no cell at that n."""
    return table([head, *[f"n={n}" for n in ns]], [[k, *[v.get(n, "—") for n in ns]] for k, v in cells.items()])


def _method_by_n_table(labels, ns, idx, mode, cell) -> list[str]:
    """One row per method, one column per n; a cell is `cell(record)` or the record's skip/error status."""
    found = {lab: {n: r for n in ns if (r := idx.get((lab, mode, n))) is not None} for lab in labels}
    return _n_table(
        "method", ns, {f"`{lab}`": {n: _cell_status(r) or cell(r) for n, r in rs.items()} for lab, rs in found.items()}
    )


def _setup_lines(data: dict[str, Any], ns: list[int]) -> list[str]:
    """The bullet list under the title: command, commit, hardware, shape, matmul yardstick, memory and FLOP notes —
    what a reader needs to judge the numbers below."""
    s, env, mm = data["settings"], data["env"], data["matmul"]
    hw = env.get("hardware", {})
    stopped = f"- **stopped early** by {data['stopped']}; the configurations after it were not measured"
    end = (mm.get("end") or {}).get("flops_per_s")
    return [
        f"- command: `{data['command']}`",
        *([stopped] if data.get("stopped") else []),
        f"- git commit: `{env.get('git_commit')}`; torch {env.get('packages', {}).get('torch')}; started "
        f"{data['started_at']}",
        f"- hardware: {hw.get('cpu')} ({hw.get('cpu_count')} logical CPUs, {hw.get('memory_gib')} GiB RAM); GPUs: "
        f"{', '.join(hw.get('gpus') or []) or 'none'}; device `{data['device']}`; torch threads {data['threads']}",
        f"- shape: B={s['batch_size']}, H={s['num_heads']}, d={s['head_dim']}, dtype {s['dtype']}, padding mask "
        f"{'on' if s['mask'] else 'off'}; n ∈ {ns}; warm-up {s['warmup']} (≤ {s['max_warmup_s']} s), repeats "
        f"{s['min_repeats']}–{s['repeats']} (stop after {s['max_time_s']} s of timed calls); "
        f"{'each configuration in its own process' if s['isolate'] else 'all configurations in one process'}",
        f"- matmul yardstick: fp32 {mm['start']['size']}² matmul, {mm['start']['flops_per_s'] / 1e9:.1f} GFLOP/s at "
        "the start"
        + (f", {end / 1e9:.1f} GFLOP/s at the end" if end else "")
        + " (median); achieved rates below are fractions of the larger of the two (the machine least disturbed by "
        "other processes)",
        f"- memory: {data['memory_note']}; budget {data['budget_note']}",
        "- FLOPs: counted per method by `lra_bench.bench.costs` (matmuls 2/MAC, elementwise work not counted); "
        "`FlopCounter / hand` = torch FlopCounterMode on the real code over the hand count (> 1: the code does "
        "more matmul work than the algorithm needs, e.g. one-hot matmuls for cluster means; FlopCounterMode does "
        "not see fused CPU SDPA kernels)",
    ]


def _speedup_lines(summ: dict[str, Any], mode: str, labels: list[str], ns: list[int]) -> list[str]:
    """The speed-up against `full` table of one mode (nothing when no speed-up was computed)."""
    sp = [x for x in summ["speedups"] if x["mode"] == mode]
    if not sp:
        return []
    cells = {f"`{lab}`": {x["n"]: f"{x['speedup']:.1f}×" for x in sp if x["label"] == lab} for lab in labels}
    cells.pop("`full`", None)
    return ["", "Speed-up against `full` (t_full / t_method).", "", *_n_table("method", ns, cells)]


def _pair_ratio_lines(summ: dict[str, Any], s: dict[str, Any], mode: str, ns: list[int]) -> list[str]:
    """The time ratio of the target's pair at equal m (GPA against Nyström), with what GPA's timing includes."""
    pr = [x for x in summ["pair_ratios"] if x["mode"] == mode]
    if not pr:
        return []
    num, den = s["targets"]["time_ratio_at_equal_m"]["pair"]
    out = ["", f"Time ratio `{num}` / `{den}` at equal m (each with its own default selector)."]
    if num == "gpa":
        out.append(
            "GPA's codebook is refreshed by k-means on the pooled batch at pass 1 and every `refresh_every` "
            "passes; the bench primes it before timing, so these are steady-state times (assignment to the "
            "codebook + cluster means). What a k-means costs per call shows in any `…/kmeans/…` row "
            "(per-sequence k-means++ and Lloyd to convergence at every call)."
        )
    by: dict[str, dict[int, str]] = defaultdict(dict)
    for x in pr:
        by[f"`{x['num']}` / `{x['den']}`"][x["n"]] = f"{x['ratio']:.2f}"
    return [*out, "", *_n_table("pair", ns, by)]


def _slope_row(x: dict[str, Any], rows: list[dict[str, Any]], mode: str) -> list[str]:
    """One method's slopes, its largest n, hand-counted GFLOP, the FlopCounter cross-check and its rate fraction."""
    mine = [r for r in _ok(rows) if r["label"] == x["label"] and r["mode"] == mode]
    big = max(mine, key=lambda r: r["n"])
    frac = big.get("rate_fraction")
    fl = big.get("flops")
    counted = [r for r in mine if r.get("flops_counted") and r.get("flops")]
    check = "—"
    if counted:
        c = max(counted, key=lambda r: r["n"])
        check = f"{c['flops_counted'] / c['flops']:.2f} (n={c['n']})"
    return [
        f"`{x['label']}`",
        "—" if x["time_slope"] is None else f"{x['time_slope']:.2f}",
        "—" if x["memory_slope"] is None else f"{x['memory_slope']:.2f}",
        f"{x['n_min']}…{x['n_max']}" if x["n_min"] else "—",
        str(big["n"]),
        "unknown" if fl is None else f"{fl / 1e9:.3g}",
        check,
        "—" if frac is None else f"{frac:.1%}",
    ]


SLOPE_HEADER = (
    "method",
    "time slope",
    "memory slope",
    "fit range",
    "n",
    "GFLOP (hand count)",
    "FlopCounter / hand",
    "rate / matmul",
)


def _mode_lines(data: dict[str, Any], mode: str, h: str, img_dir: str) -> list[str]:
    """One mode's section: time and memory by method and n, speed-ups, the pair ratio, slopes, and its plots."""
    rows, summ, s = data["rows"], data["summary"], data["settings"]
    idx = {(r["label"], r["mode"], r["n"]): r for r in rows}
    ns = sorted({r["n"] for r in rows})
    labels = _labels(rows)
    out = [
        "",
        f"{h}# {MODE_TITLE[mode]}",
        "",
        "Median time in ms (interquartile range in brackets); `skip` = over the memory budget, see below.",
        "",
        *_method_by_n_table(
            labels, ns, idx, mode, lambda r: f"{_fmt_ms(r['time_median_s'])} ({_fmt_ms(r['time_iqr_s'])})"
        ),
        "",
        "Peak memory in MiB (beyond the inputs; see the memory note above).",
        "",
        *_method_by_n_table(labels, ns, idx, mode, lambda r: f"{r['peak_mem_bytes'] / 2**20:.1f}"),
        *_speedup_lines(summ, mode, labels, ns),
        *_pair_ratio_lines(summ, s, mode, ns),
        "",
        f"Log-log slopes of time and memory against n (least squares over the measured n in "
        f"{s['targets'].get('slope_range')}), and the achieved rate at the largest n measured.",
        "",
        *table(SLOPE_HEADER, [_slope_row(x, rows, mode) for x in summ["slopes"] if x["mode"] == mode]),
    ]
    for metric in ("time", "memory"):
        name = f"{metric}_{mode}.png"
        if name in data.get("plots", []):
            out += ["", f"![{metric} {mode}]({img_dir}/{name})"]
    return out


def _profile_lines(profiles: list[dict[str, Any]], h: str) -> list[str]:
    """The torch.profiler top operators of each profiled configuration (nothing when none was profiled)."""
    if not profiles:
        return []
    out = ["", f"{h}# Where the time goes (torch.profiler, top operators by self time)"]
    for p in profiles:
        if p.get("error"):
            out += ["", f"`{p['label']}` at n={p['n']}: profiling failed — {p['error']}"]
            continue
        what = f"`{p['label']}` at n={p['n']}, {p['mode']}: {p['total_ms_per_call']:.1f} ms of operator self time"
        out += ["", f"{what} per call", ""]
        out += table(
            ["operator", "self ms / call", "share", "calls / call"],
            [
                [f"`{r['op']}`", f"{r['self_ms_per_call']:.2f}", f"{r['share']:.0%}", f"{r['calls_per_step']:.0f}"]
                for r in p["top"]
            ],
        )
    return out


def _load_and_failures(data: dict[str, Any], h: str) -> list[str]:
    """The machine's load average (why IQRs are reported) and the configurations that were skipped or failed."""
    rows, hw = data["rows"], data["env"].get("hardware", {})
    out: list[str] = []
    la, lb = data.get("load_average_start"), data.get("load_average_end")
    if la:
        out += [
            "",
            f"Machine load average (1/5/15 min) at the start: {', '.join(f'{x:.1f}' for x in la)}"
            + (f"; at the end: {', '.join(f'{x:.1f}' for x in lb)}" if lb else "")
            + f" — on {hw.get('cpu_count')} logical CPUs; other processes share them, which is why IQRs are reported.",
        ]
    bad = [r for r in rows if r.get("status") != "ok"]
    out += ["", f"{h}# Skipped and failed configurations", ""]
    if not bad:
        return [*out, "None."]
    return out + table(
        ["method", "n", "mode", "status", "why"],
        [
            [f"`{r['label']}`", str(r["n"]), r["mode"], r["status"], str(r.get("note") or r.get("error") or "")]
            for r in bad
        ],
    )


def render_markdown(data: dict[str, Any], h: str = "##", img_dir: str = ".") -> str:
    """bench.md: the run's setup, the computed targets, each mode's tables and plots, the profiles, the failures."""
    rows, summ, s = data["rows"], data["summary"], data["settings"]
    ns = sorted({r["n"] for r in rows})
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    out = [f"{h} Attention benchmark (`python -m lra_bench.bench`)", "", *_setup_lines(data, ns), ""]
    out += [f"{h}# Targets (computed; mode {s['targets'].get('mode')})", ""]
    out += table(
        ["target", "threshold", "verdict", "detail"],
        [[t["target"], t["threshold"], f"**{t['verdict']}**", t["detail"]] for t in summ["targets"]],
    )
    for mode in modes:
        out += _mode_lines(data, mode, h, img_dir)
    out += _profile_lines(data.get("profiles") or [], h)
    out += _load_and_failures(data, h)
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------------- plots


def plot(rows: list[dict[str, Any]], out_dir: Path, slope_range: tuple[int, int]) -> list[str]:
    """time_<mode>.png and memory_<mode>.png: log-log against n, one panel per landmark count m (methods
    without m — full, references, … — drawn dashed in every panel); legend entries carry the fitted slope."""
    plt = pyplot()

    ok = _ok(rows)
    lo, hi = slope_range
    written = []
    ms = list(dict.fromkeys(str(r["m"]) for r in ok if r["m"] is not None)) or ["None"]
    for mode in MODES:
        mrows = [r for r in ok if r["mode"] == mode]
        if not mrows:
            continue
        for metric, key, scale, unit in (
            ("time", "time_median_s", 1e3, "ms"),
            ("memory", "peak_mem_bytes", 2**-20, "MiB"),
        ):
            fig, axes = plt.subplots(1, len(ms), figsize=(6.5 * len(ms), 5), squeeze=False)
            for ax, m in zip(axes[0], ms):
                for lab in _labels(mrows):
                    rs = sorted((r for r in mrows if r["label"] == lab), key=lambda r: r["n"])
                    rm = str(rs[0]["m"]) if rs[0]["m"] is not None else None
                    if rm is not None and rm != m:
                        continue
                    xs = [r["n"] for r in rs]
                    ys = [max(r[key] * scale, 1e-6) for r in rs]
                    sl = loglog_slope(xs, ys, lo, hi)
                    txt = f"{lab}" + (f" (slope {sl:.2f})" if sl is not None else "")
                    ax.plot(xs, ys, "--" if rm is None else "-", marker="o", ms=3, label=txt)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("sequence length n")
                ax.set_ylabel(f"{metric} ({unit})")
                ax.set_title(f"{metric}, {mode}, m={m}")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
            written.append(save_figure(fig, out_dir / f"{metric}_{mode}.png").name)
    return written
