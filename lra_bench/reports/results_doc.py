"""`python -m lra_bench.reports.results_doc` — render docs/results.md from a bench run and an approx run
(`make results`) (and, with `--spt DIR`, the self-pretraining study's section from `DIR/spt_study.json`; with
`--locality DIR`, the locality study's from `DIR/locality.json`).

Every number in the document is read from `bench.json` / `approx.json` and formatted by code; the verdicts are
computed. Rerun instead of editing. The page is what a person reads in five minutes: each target and claim one
line with its verdict and its figures. The full tables go beside it, not into it (`TABLES_DIR`): every timed
configuration and every approximation evaluation as CSV, and both inputs as JSON (summaries recomputed), with the
plots in `img/`; each app's own markdown (`bench.md`, `approx.md` in its run dir) renders those tables for reading.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

from lra_bench.approx.report import CLAIM_TITLES

CATEGORIES = (
    ("depthwise conv skip", re.compile(r"conv")),
    ("fused SDPA", re.compile(r"scaled_dot_product|flash")),
    ("matmul", re.compile(r"\b(aten::)?(bmm|mm|matmul|addmm|baddbmm|linalg_|_linalg)")),
    ("softmax", re.compile(r"softmax")),
)


def categorize(profile: dict[str, Any]) -> dict[str, float]:
    """Share of the profiled self time by category (matmul, conv, softmax, fused SDPA, the rest)."""
    shares: dict[str, float] = {}
    for row in profile["top"]:
        name = next((cat for cat, rx in CATEGORIES if rx.search(row["op"])), "elementwise, copies, indexing")
        shares[name] = shares.get(name, 0.0) + row["share"]
    covered = sum(r["share"] for r in profile["top"])
    if covered < 0.999:
        shares["other (below the top operators)"] = 1.0 - covered
    return shares


def _rows(bench: dict[str, Any], label_prefix: str, mode: str = "forward_backward") -> list[dict[str, Any]]:
    return [
        r for r in bench["rows"] if r["label"].startswith(label_prefix) and r["mode"] == mode and r["status"] == "ok"
    ]


def efficiency_claims(bench: dict[str, Any]) -> list[str]:
    """The methods' efficiency claims, checked on the bench numbers (forward + backward), with verdicts."""
    out: list[str] = []
    ok = [r for r in bench["rows"] if r["mode"] == "forward_backward" and r["status"] == "ok"]
    idx = {(r["label"], r["n"]): r for r in ok}
    ns = sorted({r["n"] for r in ok})

    def pick(prefix: str, n: int) -> dict[str, Any] | None:
        cands = [r for (lab, nn), r in idx.items() if lab.startswith(prefix) and nn == n]
        return next((r for r in cands if str(r.get("m")) == "64"), cands[0] if cands else None)

    def ratios(prefix: str, n: int) -> tuple[dict[str, Any], float, float, float | None] | None:
        r, f = pick(prefix, n), idx.get(("full", n))
        if r is None or f is None:
            return None
        fl = f["flops"] / r["flops"] if r.get("flops") and f.get("flops") else None
        return r, f["time_median_s"] / r["time_median_s"], f["peak_mem_bytes"] / max(r["peak_mem_bytes"], 1), fl

    if not ns:
        return out
    n0 = ns[0]
    got = ratios("spectral/", n0)
    if got:
        r, t, mem, _ = got
        verdict = "met" if max(t, mem) >= 1.5 else "missed"
        out.append(
            f"**(b) efficiency half (≥ 1.5× lower attention memory or latency than full; the accuracy half is the "
            f"leaderboard's):** {verdict} at n={n0} — `{r['label']}` latency ratio full/spectral {t:.2f}×, peak-memory "
            f"ratio {mem:.2f}× (against `full` = PyTorch's fused SDPA kernel, which already needs O(n) memory)."
        )
    got = ratios("pivoted/", n0)
    if got:
        r, t, mem, fl = got
        met = [name for name, value in (("FLOPs", fl or 0.0), ("memory", mem)) if value >= 2]
        verdict = f"met on {' and '.join(met)}" if met else "missed"
        out.append(
            f"**(c) cost half (≥ 2× lower attention memory or FLOPs at matched quality):** {verdict} at n={n0} — "
            f"`{r['label']}` FLOP ratio full/pivoted {fl or float('nan'):.1f}×, peak-memory ratio {mem:.2f}×, "
            f"latency ratio {t:.2f}× (quality: its approximation rows below)."
        )
    for s in bench["summary"]["slopes"]:
        lab = s["label"]
        if lab.startswith("gpa/") and lab.endswith("m=log2") and s["mode"] == "forward_backward" and s["time_slope"]:
            out.append(
                f"**(a) O(n log n) cost with m = log₂ n:** `{lab}` time grows as n^{s['time_slope']:.2f} and memory "
                f"as n^{(s['memory_slope'] or float('nan')):.2f} over n={s['n_min']}…{s['n_max']} "
                f"(n log n over that range is n^{_nlogn_slope(s['n_min'], s['n_max']):.2f})."
            )
    got = ratios("polynomial", ns[-1])
    if got:
        r, t, mem, fl = got
        out.append(
            f"**(d) exact degree-2 polynomial attention (C(d+1,2) = 528 features per head at d = 32):** at n={ns[-1]} "
            f"{t:.2f}× the speed of `full`, FLOP ratio full/polynomial {fl or float('nan'):.1f}×, peak-memory ratio "
            f"{mem:.2f}×"
            + (f"; its FLOPs fall below softmax's for n > {ns[-1] / fl:.0f} (FLOP ratio ∝ n)." if fl else ".")
        )
    return out


def _nlogn_slope(lo: int, hi: int) -> float:
    import math

    return math.log((hi * math.log(hi)) / (lo * math.log(lo))) / math.log(hi / lo)


def shown_path(path: str) -> str:
    """A run dir as the reader can use it: relative to the dir `make results` ran in, when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def inputs_section(bench: dict[str, Any] | None, approx: dict[str, Any] | None) -> list[str]:
    """What this document was computed from: the two runs (command, commit, load) and the trained checkpoint."""
    out = ["## Inputs", ""]
    if bench:
        la, lb = bench.get("load_average_start"), bench.get("load_average_end")
        fmt = lambda xs: "/".join(f"{x:.2f}" for x in xs)  # noqa: E731
        load = f"; load average (1/5/15 min) {fmt(la)} at the start, {fmt(lb)} at the end" if la and lb else ""
        out.append(
            f"- benchmark: `{shown_path(bench['output_dir'])}` — `{bench['command']}` "
            f"(git `{bench['env']['git_commit']}`){load}"
        )
    else:
        out.append("- benchmark: none given (no speed or memory numbers below)")
    if approx:
        out.append(
            f"- approximation study: `{shown_path(approx['output_dir'])}` — `{approx['command']}` (git "
            f"`{approx['env']['git_commit']}`, {approx['seconds']:.0f} s)"
        )
        for name in ("trained", "random_model"):
            info = approx["sources"].get(name)
            if not info:
                continue
            what = (
                f"checkpoint `{info.get('ckpt')}` (step {info.get('global_step')}, val acc {info.get('run_val_acc')}, "
                f"majority share {info.get('run_majority_share')})"
                if info.get("ckpt")
                else f"the same architecture freshly initialised (seed {info.get('init_seed')})"
            )
            out.append(
                f"- model source `{name}`: {what}, task {info.get('task')}, attention {info.get('attn')}, "
                f"{info.get('data')}, {info.get('instances')} instances (sequence × layer × head)"
            )
    else:
        out.append("- approximation study: none given (no verdicts on the claims below)")
    return [*out, ""]


#: the folder beside the page (relative to it) that holds the full tables
TABLES_DIR = "results"


def write_tables(bench: dict[str, Any] | None, approx: dict[str, Any] | None, folder: Path) -> list[str]:
    """Every row of the two inputs as CSV and the inputs themselves as JSON in `folder`; returns the file names."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, data in (("bench", bench), ("approx", approx)):
        if not data:
            continue
        pd.json_normalize(data["rows"]).to_csv(folder / f"{kind}_rows.csv", index=False)
        (folder / f"{kind}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        written += [f"{kind}_rows.csv", f"{kind}.json"]
    return written


def render(bench: dict[str, Any] | None, approx: dict[str, Any] | None, img: str) -> str:
    out = ["# Results: attention speed, memory and approximation quality", ""]
    out.append(
        "> Generated by `make results` (`python -m lra_bench.reports.results_doc`) from the `bench.json` and "
        "`approx.json` of the runs named below. Do not edit by hand: every number and verdict is computed — rerun."
    )
    out.append("")
    out += inputs_section(bench, approx)
    out.append("## Where we stand")
    out.append("")
    if bench:
        hw = bench["env"]["hardware"]
        out.append(
            f"Measured on: {hw.get('cpu')}, {hw.get('cpu_count')} logical CPUs, {hw.get('memory_gib')} GiB RAM, "
            f"torch threads {bench['threads']}, device `{bench['device']}`, git `{bench['env']['git_commit']}`."
        )
        out.append("")
        out.append("### Targets (CPU, forward + backward)")
        out.append("")
        out.append("| target | threshold | verdict | detail |")
        out.append("|---|---|---|---|")
        for t in bench["summary"]["targets"]:
            out.append(f"| {t['target']} | {t['threshold']} | **{t['verdict']}** | {t['detail']} |")
        profiles = [p for p in bench.get("profiles") or [] if not p.get("error")]
        if profiles:
            out.append("")
            out.append(
                "What limits them — share of operator self time by kind (torch.profiler at the largest n, "
                f"forward + backward; every operator in `{TABLES_DIR}/bench.json`):"
            )
            out.append("")
            cats = [c for c, _ in CATEGORIES] + ["elementwise, copies, indexing", "other (below the top operators)"]
            out.append("| method | ms / call | " + " | ".join(cats) + " |")
            out.append("|---|---|" + "---|" * len(cats))
            for p in profiles:
                sh = categorize(p)
                cells = [f"{sh[c]:.0%}" if c in sh else "—" for c in cats]
                out.append(
                    f"| `{p['label']}` (n={p['n']}) | {p['total_ms_per_call']:.0f} | " + " | ".join(cells) + " |"
                )
    out.append("")
    out.append("### The methods' claims")
    out.append("")
    if approx:
        for v in approx["summary"]["verdicts"]:
            out.append(f"- **{CLAIM_TITLES.get(v['claim'], v['claim'])}** {v['verdict']}")
    if bench:
        for line in efficiency_claims(bench):
            out.append(f"- {line}")
        out.append(
            "- Ratios against `full` compare with PyTorch's fused flash-attention kernel (O(n) memory), not with a "
            "materialised n×n softmax; `sdpa_math` in the tables is that materialising baseline."
        )
    out += ["", "## The full tables", ""]
    for kind, data, app in (("bench", bench, "lra_bench.bench"), ("approx", approx, "lra_bench.approx")):
        if data:
            out.append(
                f"- `{TABLES_DIR}/{kind}_rows.csv`: all {len(data['rows'])} rows of `python -m {app}`; "
                f"`{TABLES_DIR}/{kind}.json`: the run itself (settings, summary, environment)"
            )
    plots = [*(bench or {}).get("plots", []), *(approx or {}).get("plots", [])]
    if plots:
        out.append("- plots: " + ", ".join(f"[{Path(p).stem}]({img}/{p})" for p in plots))
    out += [
        "",
        "## GPU",
        "",
        "Not run yet. `scripts/gpu/check.sh --out DIR` runs every GPU stage in one command (docs/architecture.md); "
        "its numbers belong here, with the node's hardware line.",
    ]
    return "\n".join(out) + "\n"


def refresh(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """Recompute the summaries (verdicts included) from the stored rows with the current code, so the document
    never mixes numbers from one version with verdict logic from another."""
    if kind == "bench":
        from lra_bench.bench.report import summarize_bench

        data["summary"] = summarize_bench(data["rows"], data["settings"])
    else:
        from lra_bench.approx.summary import summarize

        data["summary"] = summarize(data["rows"], data["inputs"], data["settings"]["claims"])
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, help="a bench run dir (holds bench.json)")
    parser.add_argument("--approx", type=Path, help="an approx run dir (holds approx.json)")
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"))
    parser.add_argument(
        "--spt",
        type=Path,
        action="append",
        help="an spt_study dir (spt_study.json; repeatable); alone: only that section",
    )
    parser.add_argument(
        "--locality",
        type=Path,
        action="append",
        help="a locality study dir (locality.json; repeatable); alone: only that section",
    )
    parser.add_argument(
        "--step",
        type=Path,
        action="append",
        help="a training-step measurement (JSON with title, command, rows; repeatable); alone: only that section",
    )
    args = parser.parse_args(argv)
    img_dir = args.out.parent / "img"
    img_dir.mkdir(parents=True, exist_ok=True)
    loaded: dict[str, Any] = {}
    for key, folder, name in (("bench", args.bench, "bench.json"), ("approx", args.approx, "approx.json")):
        if folder is None:
            continue
        data = json.loads((folder / name).read_text())
        for png in data.get("plots", []):
            shutil.copy2(folder / png, img_dir / png)
        loaded[key] = refresh(key, data)
    if loaded:
        write_tables(loaded.get("bench"), loaded.get("approx"), args.out.parent / TABLES_DIR)
    if loaded or (args.spt is None and args.step is None and args.locality is None):
        text = render(loaded.get("bench"), loaded.get("approx"), img="img")
    else:  # only the study given: keep the document, replace (or add) its section
        text = args.out.read_text() if args.out.exists() else ""
    if args.spt:
        text = with_section(
            text, "spt_study", spt_body([json.loads((d / "spt_study.json").read_text()) for d in args.spt])
        )
    if args.step:
        text = with_section(text, "train_step", step_body([json.loads(p.read_text()) for p in args.step]))
    if args.locality:
        text = with_section(text, "locality", locality_body(args.locality, img_dir))
    previous = args.out.read_text() if args.out.exists() else ""
    for name in KEPT_SECTIONS:  # a render without a section's inputs keeps that section as the document had it
        text = keep_section(text, previous, name)
    args.out.write_text(text)
    print(f"wrote {args.out}")


def markers(name: str) -> tuple[str, str]:
    """The comments around a section that is rendered apart (it takes hours to rerun, so a full render keeps it)."""
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


#: sections rendered from their own inputs, kept by a full render: the self-pretraining studies, the training step,
#: the locality studies
KEPT_SECTIONS = ("spt_study", "train_step", "locality")


def keep_section(text: str, previous: str, name: str) -> str:
    """`text` with the `name` section of `previous` (if it has one) appended."""
    begin, end = markers(name)
    if begin not in previous or end not in previous or begin in text:
        return text
    section = begin + previous.split(begin, 1)[1].split(end, 1)[0] + end + "\n"
    return text.rstrip("\n") + "\n\n" + section


def with_section(text: str, name: str, body: str) -> str:
    """`text` with the `name` section (between its markers) replaced by `body`, or appended."""
    begin, end = markers(name)
    section = f"{begin}\n{body.rstrip()}\n{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + section + rest.split(end, 1)[1].lstrip("\n")
    return text.rstrip("\n") + "\n\n" + section


def spt_body(studies: list[dict[str, Any]]) -> str:
    from lra_bench.reports.spt_study import render_markdown as spt_markdown

    body = "\n".join(spt_markdown(study, h="##") for study in studies)
    note = (
        "> Rendered from each study's `spt_study.json` by "
        "`python -m lra_bench.reports.results_doc --spt DIR [--spt DIR …]`."
    )
    return f"{note}\n\n{body}"


def locality_body(folders: list[Path], img_dir: Path) -> str:
    """The locality studies' pages (`python -m lra_bench.locality`), their plots copied beside the document under
    a name per study folder."""
    from lra_bench.locality.report import render_markdown as locality_markdown

    parts = []
    for folder in folders:
        study = json.loads((folder / "locality.json").read_text())
        if study.get("plot"):
            name = f"locality-{folder.resolve().name}.png"
            shutil.copy2(folder / study["plot"], img_dir / name)
            study["plot"] = name
        parts.append(locality_markdown(study, h="##", img_dir=img_dir.name))
    note = (
        "> Rendered from each study's `locality.json` by "
        "`python -m lra_bench.reports.results_doc --locality DIR [--locality DIR …]`."
    )
    return note + "\n\n" + "\n".join(parts)


def step_body(runs: list[dict[str, Any]]) -> str:
    """The training-step table(s) of `python -m lra_bench.bench.step --json FILE` runs, each with its conditions."""
    from lra_bench.bench.step import StepTiming, markdown

    lines = [
        "## The faithful training step against the matmul limit",
        "",
        "The protocol's own network, loss, backward and AdamW step (`python -m lra_bench.bench.step`), beside this "
        "machine's fp32 matmul rate measured in the same process; *step / limit* is the step time over the time its "
        "FLOPs would take at that rate; *whole protocol* projects 5000 steps plus 100 evaluations of 62 batches.",
        "",
    ]
    for run in runs:
        rows = [StepTiming(**row) for row in run["rows"]]
        lines += [f"**{run['title']}** — `{run['command']}`", "", *markdown(rows), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
