"""`python -m lra_bench.leaderboard DIR... [--out OUTDIR]`: one table from every `results.json` below DIRs.

Reads only result records, so it works offline and on a sweep that is still running. Writes into `--out`, never
into the dirs it reads: they may be committed evidence (`reproductions/`) that a table built from them must leave
byte for byte as it was. `build_leaderboard` is the same as a function, for the end-of-sweep callback.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lra_bench.kit.figures import save_figure
from lra_bench.kit.terminal import table_console
from lra_bench.leaderboard import aggregate as data
from lra_bench.leaderboard import locality, pareto, reproduced, uncertainty, wandb_log
from lra_bench.leaderboard import render as render
from lra_bench.leaderboard.published import load_published
from lra_bench.leaderboard.wandb_log import log_to_wandb

#: where `python -m lra_bench.leaderboard` writes without `--out` (relative to the current directory, as `outputs/`)
DEFAULT_OUT = Path("outputs") / "leaderboard"
MARKDOWN, CSV, WIDE_CSV = "leaderboard.md", "leaderboard.csv", "leaderboard_wide.csv"
REPRODUCED_CSV = "leaderboard_reproduced.csv"


def _task_plots(rows: list[dict], out: Path) -> list[Path]:
    """One accuracy plot per task, `leaderboard_<task>.png` in `out`, tasks in the leaderboard's order."""
    paths = []
    for task in sorted({r["task"] for r in rows}, key=data.task_order):
        task_rows = [r for r in rows if r["task"] == task]
        paths.append(save_figure(render.task_figure(task, task_rows), out / f"leaderboard_{task}.png", tight=False))
    return paths


def build_leaderboard(dirs: Sequence[str | Path], out_dir: str | Path, plots: bool = True) -> dict:
    """Collect, aggregate and write every output into `out_dir` (no default: nothing is written into the dirs read
    unless a caller asks, as the sweep callback does). Never raises on a bad record: it is listed under `unreadable`.
    Returns the board: paths `markdown`, `csv`, `wide_csv`, `reproduced_csv` and `plots` (the Pareto charts
    included); `rows` (one per group), `wide` (one per method, ours), `locality` (`locality.best_local_rows`),
    `published` (same shape) and `published_sources`; `reproductions` (one verdict per published number and matching
    on-protocol row of ours), `pareto` (`pareto.Chart`s); `failures`, `unreadable`, `superseded`, `evaluations`
    (evaluated checkpoints, never rows); `n_files`, `dirs` and `wandb` (the runs' W&B project/entity/group).
    """
    if not dirs:
        raise ValueError("build_leaderboard needs at least one directory")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    paths = data.find_results(dirs)
    records, unreadable = data.load_records(paths)
    failures = data.failures_of(records)
    evaluations = data.evaluations_of(records)
    rows, superseded = data.group_rows(records)
    wide = data.wide_rows(rows, failures)
    uncertainty.add_uncertainty(rows, wide)  # CI and tie-aware rank columns
    baselines = locality.best_local_rows(rows)  # per task, the best local window (when local runs are present)
    sources, published_rows = load_published()
    published = data.published_wide_rows(published_rows)
    verdicts = reproduced.reproductions(wide, published)

    plot_paths = _task_plots(rows, out) if plots else []
    charts, chart_notes = pareto.build_charts(rows, wide, out, plots)
    board: dict[str, Any] = {
        "reproductions": verdicts,
        "plots": [*plot_paths, *(c.path for c in charts if c.path is not None)],
        "pareto": charts,
        "dirs": [str(d) for d in dirs],
        "wandb": wandb_log.settings_from_records(records),
        "rows": rows,
        "wide": wide,
        "locality": baselines,
        "published": published,
        "published_sources": {k: dict(v) for k, v in sources.items()},
        "failures": failures,
        "unreadable": unreadable,
        "superseded": superseded,
        "evaluations": evaluations,
        "n_files": len(paths),
    }
    sections = [*render.uncertainty_section(wide), *pareto.pareto_section(charts, chart_notes)]
    board["markdown"] = out / MARKDOWN
    board["markdown"].write_text(render.render_markdown(board, plot_paths, sections))
    board["csv"] = render.write_csv(out / CSV, rows, render.GROUP_COLUMNS)
    board["wide_csv"] = render.write_csv(out / WIDE_CSV, [*wide, *baselines, *published], render.WIDE_COLUMNS)
    board["reproduced_csv"] = render.write_csv(out / REPRODUCED_CSV, verdicts, reproduced.COLUMNS)
    return board


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lra_bench.leaderboard",
        description="Leaderboard (markdown, CSV, PNG) from every results.json below the given directories: the main "
        f"table printed, the files written to --out ({DEFAULT_OUT}/ by default).",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories (searched recursively)")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"where the md/csv/png files (and --wandb's run) go (default: {DEFAULT_OUT}/ of the current directory; "
        "the DIRs read are never written)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--wandb",
        nargs="?",
        const="auto",
        choices=("auto", *wandb_log.MODES),
        help="also log the tables and charts to a W&B run (job_type leaderboard, the sweep's group): offline unless "
        "`online` is given or WANDB_MODE=online",
    )
    parser.add_argument("--wandb-group", help="W&B group (default: the sweep runs' logger.wandb.group)")
    parser.add_argument("--wandb-project", help="W&B project (default: the sweep runs' project)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        parser.exit(2, f"error: no such directory: {', '.join(missing)}\n")
    if not data.find_results(args.dirs):  # an empty table would look like a leaderboard of nothing: refuse
        where = ", ".join(map(str, args.dirs))
        parser.exit(2, f"error: no results.json under {where}; give the sweep or run dirs that hold the runs\n")
    result = build_leaderboard(args.dirs, args.out, plots=not args.no_plots)
    wandb_dir, wandb_failed = None, False
    if args.wandb:
        mode = wandb_log.resolve_mode(None if args.wandb == "auto" else args.wandb)
        wandb_dir = log_to_wandb(result, mode=mode, project=args.wandb_project, group=args.wandb_group)
        wandb_failed = wandb_dir is None and mode != "disabled"
    console = table_console(min_width=120, highlight=False)
    render.print_summary(result["wide"], result["published"], console)
    print(
        f"{result['n_files']} results.json: {len(result['rows'])} groups, {len(result['failures'])} failed or "
        f"unfinished, {len(result['unreadable'])} unreadable"
    )
    for path in (*(result[name] for name in ("markdown", "csv", "wide_csv", "reproduced_csv")), *result["plots"]):
        print(f"  {path}")
    if wandb_dir is not None:
        print(f"  W&B: {wandb_dir}")
    return 1 if wandb_failed else 0
