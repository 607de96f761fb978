"""`python -m lra_bench.reports.results_doc` — render docs/results.md from a bench and an approx run (`make results`);
`--spt`, `--locality`, `--step`: those studies' sections (`sections`).

Every number is read from `bench.json` / `approx.json` and formatted by code; the verdicts are computed: rerun
instead of editing. The page is what a person reads in five minutes (at most PAGE_LINES lines): each target and claim
one line with its verdict and deciding figure (`standing`, `claims`), every ratio by `kit.numbers.ratio_text`. The
full tables go beside it (`TABLES_DIR`): each app's own markdown, every row as CSV, both inputs as JSON (summaries
recomputed), and the plots in `img/`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from lra_bench.approx.report import render_markdown as approx_markdown
from lra_bench.bench.report import render_markdown as bench_markdown
from lra_bench.bench.report import summarize_bench
from lra_bench.reports.claims import claim_lines
from lra_bench.reports.sections import (
    KEPT_SECTIONS,
    STEP_CSV,
    keep_section,
    locality_body,
    markers,
    spt_body,
    step_body,
    with_section,
    write_step_csv,
)
from lra_bench.reports.standing import efficiency_claims, profile_table, target_line

__all__ = ["keep_section", "main", "markers", "render", "shown_path", "spt_body", "with_section", "write_tables"]


def shown_path(path: str) -> str:
    """A run dir as the reader can use it: relative to the dir `make results` ran in, when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def _share(value: Any) -> str:
    """A stored accuracy as a reader reads it (4 decimals; the JSON beside the page keeps every digit)."""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


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
                f"checkpoint `{info.get('ckpt')}` (step {info.get('global_step')}, "
                f"val acc {_share(info.get('run_val_acc'))}, "
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


#: the most lines the page may have (issue 21: read in five minutes); more is a renderer bug, said when writing
PAGE_LINES = 250

#: the folder beside the page (relative to it) that holds the full tables: each run's rows as CSV (`<kind>_rows.csv`),
#: the run itself (`<kind>.json`) and its app's own markdown of them (`<kind>.md`; their plots are the page's, in img/)
TABLES_DIR = "results"


def write_tables(bench: dict[str, Any] | None, approx: dict[str, Any] | None, folder: Path) -> list[str]:
    """Every row of the two inputs as CSV and the inputs themselves as JSON in `folder`; returns the file names."""
    import pandas as pd  # only when tables are written: `--help` and a bad argument stay fast

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, data in (("bench", bench), ("approx", approx)):
        if not data:
            continue
        pd.json_normalize(data["rows"]).to_csv(folder / f"{kind}_rows.csv", index=False)
        (folder / f"{kind}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
        written += [f"{kind}_rows.csv", f"{kind}.json"]
    return written


def write_full_markdown(bench: dict[str, Any] | None, approx: dict[str, Any] | None, folder: Path, img: str) -> None:
    """bench.md and approx.md in `folder`: every table of each run for reading (the apps' own renderers)."""
    for kind, data, render_full in (("bench", bench, bench_markdown), ("approx", approx, approx_markdown)):
        if data:
            (folder / f"{kind}.md").write_text(render_full(data, h="#", img_dir=img))


def bench_standing(bench: dict[str, Any]) -> list[str]:
    """Where the machine stands on the targets: the conditions, one line per target, what limits the methods."""
    hw = bench["env"]["hardware"]
    ns = sorted({r["n"] for r in bench["rows"]})
    out = [
        f"Measured on: {hw.get('cpu')}, {hw.get('cpu_count')} logical CPUs, {hw.get('memory_gib')} GiB RAM, "
        f"torch threads {bench['threads']}, device `{bench['device']}`, git `{bench['env']['git_commit']}`.",
        "",
        "### Targets (CPU, forward + backward)",
        "",
        *(target_line(t, ns) for t in bench["summary"]["targets"]),
    ]
    profiles = [p for p in bench.get("profiles") or [] if not p.get("error")]
    if profiles:
        out += [
            "",
            "What limits them — share of operator self time by kind (torch.profiler at the largest n, "
            f"forward + backward; every operator in `{TABLES_DIR}/bench.json`):",
            "",
            *profile_table(profiles),
        ]
    return out


def tables_lines(bench: dict[str, Any] | None, approx: dict[str, Any] | None, img: str) -> list[str]:
    """Links to what sits beside the page: each run's tables (markdown, CSV, JSON) and the plots."""
    out = ["## The full tables", ""]
    for kind, data, app in (("bench", bench, "lra_bench.bench"), ("approx", approx, "lra_bench.approx")):
        if data:
            out.append(
                f"- `python -m {app}`: [every table]({TABLES_DIR}/{kind}.md); all {len(data['rows'])} rows as "
                f"[CSV]({TABLES_DIR}/{kind}_rows.csv); [the run itself]({TABLES_DIR}/{kind}.json) (settings, summary, "
                "environment)"
            )
    plots = [*(bench or {}).get("plots", []), *(approx or {}).get("plots", [])]
    if plots:
        out.append("- plots: " + ", ".join(f"[{Path(p).stem}]({img}/{p})" for p in plots))
    return out


GPU_NOTE = [
    "## GPU",
    "",
    "Not run yet. `scripts/gpu/check.sh --out DIR` runs every GPU stage in one command (docs/architecture.md); "
    "its numbers belong here, with the node's hardware line.",
]


def render(bench: dict[str, Any] | None, approx: dict[str, Any] | None, img: str) -> str:
    """The page: inputs, the targets and claims one line each with verdict and figure, links to the full tables."""
    out = [
        "# Results: attention speed, memory and approximation quality",
        "",
        "> Generated by `make results` (`python -m lra_bench.reports.results_doc`) from the `bench.json` and "
        "`approx.json` of the runs named below. Do not edit by hand: every number and verdict is computed — rerun.",
        "",
        *inputs_section(bench, approx),
        "## Where we stand",
        "",
    ]
    if bench:
        out += bench_standing(bench)
    out += ["", "### The methods' claims", ""]
    if approx:
        out += claim_lines(approx["summary"]["verdicts"])
    if bench:
        out += [f"- {line}" for line in efficiency_claims(bench)]
        out.append(
            "- Ratios against `full` compare with PyTorch's fused flash-attention kernel (O(n) memory), not with a "
            "materialised n×n softmax; `sdpa_math` in the tables is that materialising baseline."
        )
    out += ["", *tables_lines(bench, approx, img), "", *GPU_NOTE]
    return "\n".join(out) + "\n"


def refresh(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """Recompute the summaries (verdicts included) from the stored rows with the current code, so the document
    never mixes numbers from one version with verdict logic from another."""
    if kind == "bench":
        data["summary"] = summarize_bench(data["rows"], data["settings"])
    else:
        from lra_bench.approx.summary import summarize  # torch (its metrics): only for an approx run

        data["summary"] = summarize(data["rows"], data["inputs"], data["settings"]["claims"])
    return data


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bench", type=Path, help="a bench run dir (holds bench.json)")
    parser.add_argument("--approx", type=Path, help="an approx run dir (holds approx.json)")
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"))
    for flag, what in (
        ("--spt", "an spt_study dir (spt_study.json; repeatable); alone: only that section"),
        ("--locality", "a locality study dir (locality.json; repeatable); alone: only that section"),
        (
            "--step",
            "a training-step measurement (JSON with title, command, rows; repeatable); alone: only that section",
        ),
    ):
        parser.add_argument(flag, type=Path, action="append", help=what)
    return parser.parse_args(argv)


def load_runs(args: argparse.Namespace, img_dir: Path) -> dict[str, Any]:
    """The bench and approx runs given, their summaries recomputed, their plots copied into `img_dir`."""
    loaded: dict[str, Any] = {}
    for key, folder, name in (("bench", args.bench, "bench.json"), ("approx", args.approx, "approx.json")):
        if folder is None:
            continue
        data = json.loads((folder / name).read_text())
        # named by the folder this page read it from (it may have been made in another checkout or on another
        # machine, whose absolute path means nothing to a reader), relative to the repository when below it
        data["output_dir"] = shown_path(str(folder))
        for png in data.get("plots", []):
            shutil.copy2(folder / png, img_dir / png)
        loaded[key] = refresh(key, data)
    return loaded


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    img_dir = args.out.parent / "img"
    img_dir.mkdir(parents=True, exist_ok=True)
    tables = args.out.parent / TABLES_DIR
    loaded = load_runs(args, img_dir)
    if loaded:
        write_tables(loaded.get("bench"), loaded.get("approx"), tables)
        write_full_markdown(loaded.get("bench"), loaded.get("approx"), tables, img=f"../{img_dir.name}")
    if loaded or (args.spt is None and args.step is None and args.locality is None):
        text = render(loaded.get("bench"), loaded.get("approx"), img=img_dir.name)
    else:  # only the study given: keep the document, replace (or add) its section
        text = args.out.read_text() if args.out.exists() else ""
    if args.spt:
        studies = [json.loads((d / "spt_study.json").read_text()) for d in args.spt]
        text = with_section(text, "spt_study", spt_body(studies))
    if args.step:
        runs = [json.loads(p.read_text()) for p in args.step]
        write_step_csv(runs, tables / STEP_CSV)
        text = with_section(text, "train_step", step_body(runs, TABLES_DIR))
    if args.locality:
        text = with_section(text, "locality", locality_body(args.locality, img_dir))
    previous = args.out.read_text() if args.out.exists() else ""
    for name in KEPT_SECTIONS:  # a render without a section's inputs keeps that section as the document had it
        text = keep_section(text, previous, name)
    args.out.write_text(text)
    lines = len(text.splitlines())
    over = f", over the {PAGE_LINES} a page may have" if lines > PAGE_LINES else ""
    print(f"wrote {args.out} ({lines} lines{over})")


if __name__ == "__main__":
    main()
