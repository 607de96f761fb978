"""`python -m lra_bench.leaderboard DIR... [--out OUTDIR]`: one table from every `results.json` below DIRs.

Reads only result records (DESIGN §4), so it works offline, on any cluster filesystem, and on a sweep that
is still running. Writes `leaderboard.md`, `leaderboard.csv` (one row per group), `leaderboard_wide.csv`
(one row per method, ours and published) and `leaderboard_<task>.png`. `build_leaderboard` is the same
thing as a function, for a Hydra `on_multirun_end` callback.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lra_bench.leaderboard import aggregate as data
from lra_bench.leaderboard import render as render
from lra_bench.leaderboard.published import load_published

MARKDOWN, CSV, WIDE_CSV = "leaderboard.md", "leaderboard.csv", "leaderboard_wide.csv"


def build_leaderboard(dirs: Sequence[str | Path], out_dir: str | Path | None = None, plots: bool = True) -> dict:
    """Collect, aggregate and write every output; return their paths and the rows.

    Returns a dict with `markdown`, `csv`, `wide_csv` (paths), `plots` (paths), `rows` (one per group),
    `wide` (one per method, ours), `published` (published rows, same shape), `published_sources`,
    `failures`, `unreadable`, `superseded` and `n_files`. Never raises on a bad record: it is listed under `unreadable`.
    """
    if not dirs:
        raise ValueError("build_leaderboard needs at least one directory")
    out = Path(out_dir) if out_dir is not None else Path(dirs[0])
    out.mkdir(parents=True, exist_ok=True)

    paths = data.find_results(dirs)
    records, unreadable = data.load_records(paths)
    failures = data.failures_of(records)
    rows, superseded = data.group_rows(records)
    wide = data.wide_rows(rows, failures)
    sources, published_rows = load_published()
    published = data.published_wide_rows(published_rows)

    plot_paths: list[Path] = []
    if plots:
        tasks = sorted({r["task"] for r in rows}, key=data.task_order)
        for task in tasks:
            task_rows = [r for r in rows if r["task"] == task]
            plot_paths.append(render.plot_task(out / f"leaderboard_{task}.png", task, task_rows))

    md_path = out / MARKDOWN
    md_path.write_text(
        render.render_markdown(
            [str(d) for d in dirs],
            len(paths),
            rows,
            wide,
            published,
            sources,
            failures,
            unreadable,
            superseded,
            plot_paths,
        )
    )
    csv_path = render.write_csv(out / CSV, rows, render.GROUP_COLUMNS)
    wide_path = render.write_csv(out / WIDE_CSV, [*wide, *published], render.WIDE_COLUMNS)
    return {
        "markdown": md_path,
        "csv": csv_path,
        "wide_csv": wide_path,
        "plots": plot_paths,
        "rows": rows,
        "wide": wide,
        "published": published,
        "published_sources": {k: dict(v) for k, v in sources.items()},
        "failures": failures,
        "unreadable": unreadable,
        "superseded": superseded,
        "n_files": len(paths),
    }


def log_to_wandb(table: dict[str, Any] | Sequence[dict[str, Any]], key: str = "leaderboard") -> bool:
    """Log the grouped rows as a `wandb.Table`, only when a W&B run is active and online.

    Offline or disabled runs (our default, DESIGN §7) are left alone: an offline sync of a table built
    after the fact would land in a run that never produced it. Returns whether anything was logged.
    """
    try:
        import wandb
    except ImportError:
        return False
    run = getattr(wandb, "run", None)
    if run is None or getattr(run, "offline", True) or getattr(run, "disabled", False):
        return False
    rows = list(table["rows"] if isinstance(table, dict) else table)
    if not rows:
        return False
    columns = list(rows[0])
    run.log({key: wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])})
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lra_bench.leaderboard",
        description="Leaderboard (markdown, CSV, PNG) from every results.json below the given directories.",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep or run directories (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the first DIR)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--wandb", action="store_true", help="also log the table to the active online W&B run")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        parser.exit(2, f"error: no such directory: {', '.join(missing)}\n")
    if not data.find_results(args.dirs):  # an empty table would look like a leaderboard of nothing: refuse
        where = ", ".join(map(str, args.dirs))
        parser.exit(2, f"error: no results.json under {where}; give the sweep or run dirs that hold the runs\n")
    result = build_leaderboard(args.dirs, args.out, plots=not args.no_plots)
    if args.wandb:
        log_to_wandb(result)
    print(
        f"{result['n_files']} results.json: {len(result['rows'])} groups, {len(result['failures'])} failed or "
        f"unfinished, {len(result['unreadable'])} unreadable"
    )
    for name in ("markdown", "csv", "wide_csv"):
        print(f"  {result[name]}")
    for plot in result["plots"]:
        print(f"  {plot}")
    return 0
