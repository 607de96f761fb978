"""`python -m lra_bench.runs [DIR...] [--task T] [--attn A] [--status S] [--where KEY=VALUE] [--sort started]
[--remove [--yes] [--include-completed]]`: every run, one line each.

Where did my run go, did it finish, and how well did it do? The overrides shown leave out logistics; the folder is
relative to the current directory so it pastes into `ckpt_path=`, `compare` or `evaluate`. A record that still says
`running` while no process holds its run dir was killed: shown as `stopped`, at the last step its CSV log holds.
Reads only records and small files, so it is fast on a live sweep. `--remove` (`lra_bench.runs_removal`) tidies a
results dir without `make clean`, which takes every result and the venv with it.

Exit status 0 with the table; 2 with one line for a missing DIR, a DIR holding no run, or `--remove` with no
terminal to ask on and no `--yes`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from lra_bench.kit.terminal import table_console
from lra_bench.leaderboard.aggregate import find_results, load_records
from lra_bench.record.curves import read_metrics
from lra_bench.record.identity import LOGISTICS
from lra_bench.record.reader import lookup, typed
from lra_bench.run.rundir import is_held
from lra_bench.runs_removal import remove_listed

DEFAULT_DIRS = ("outputs", "multirun")
#: a run's own overrides that its columns already show
SHOWN = ("task", "attn", "selector")
STATUS_STYLE = {"completed": "green", "evaluated": "cyan", "running": "yellow", "failed": "red", "stopped": "red"}
#: `--sort`: each order's key of a row (the default first: grouped by task and attention, oldest first in a group)
SORTS = {
    "task": lambda row: (row["task"], row["attn"], row["started"]),
    "started": lambda row: (row["started"], row["task"], row["attn"]),
}


def overrides_of(run_dir: Path) -> list[str]:
    """The command-line overrides that made the run, without logistics and without what other columns show."""
    try:
        items = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
    except Exception:  # no Hydra folder (an `evaluate` record) or an unreadable one: nothing to show
        return []
    kept = []
    for item in map(str, items):
        key = item.split("=", 1)[0].lstrip("+~")
        if key in SHOWN or any(key == p or key.startswith(p + ".") or key.startswith(p + "/") for p in LOGISTICS):
            continue
        kept.append(item)
    return kept


def status_of(record: dict[str, Any], run_dir: Path) -> str:
    """The record's status, except `stopped` for a `running` record that no live process holds (killed)."""
    status = str(record.get("status"))
    return "stopped" if status == "running" and not is_held(run_dir) else status


def step_of(record: dict[str, Any], run_dir: Path) -> str:
    """`reached/planned`: the record's steps when it finished, else the last step in the run's CSV log."""
    read = typed(record)
    planned = read.run.planned_steps or read.config_at("trainer.max_steps")
    if read.evaluation:
        return f"ckpt {read.evaluation.get('checkpoint_step')}"
    reached = read.metrics.train_steps
    if reached is None:
        logged = read_metrics(run_dir)
        reached = int(logged["step"].max()) if logged is not None and not logged.empty else 0
    return f"{reached}/{planned}" if planned else str(reached)


def shown_path(path: Path) -> str:
    """The run dir relative to the current directory when it lies below it, else absolute."""
    relative = os.path.relpath(path, Path.cwd())
    return str(path) if relative.startswith("..") else relative


def started_of(record: dict[str, Any]) -> dt.datetime | None:
    """When the run first started: the earliest of its record's `run.started_at` and its attempts' starts (a resumed
    run's record carries the start of the attempt that wrote it; its first segment says when the run began)."""
    run = typed(record).run
    segments = [seg for seg in run.segments or [] if isinstance(seg, dict)]
    times = []
    for stamp in [run.started_at, *(seg.get("started_at") for seg in segments)]:
        try:
            moment = dt.datetime.fromisoformat(str(stamp))
        except ValueError:  # absent (None) or not a timestamp: nothing to show
            continue
        times.append(moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc))
    return min(times, default=None)


def _when(moment: dt.datetime | None) -> str:
    """A start in the reader's local time to the minute (what the clock on the wall said), `—` when unknown."""
    return "—" if moment is None else moment.astimezone().strftime("%Y-%m-%d %H:%M")


def _percent(value: Any) -> str:
    return "—" if value is None else f"{100 * float(value):.2f}"


def row_of(record: dict[str, Any]) -> dict[str, Any]:
    run_dir = Path(record["_path"]).parent
    read, started = typed(record), started_of(record)
    return {
        "status": status_of(record, run_dir),
        "task": str(record.get("task")),
        "attn": str(record.get("attn")) + (f"/{record['selector']}" if record.get("selector") else ""),
        "overrides": " ".join(overrides_of(run_dir)),
        "val": _percent(read.metrics.val_acc),
        "test": _percent(read.metrics.test_acc),
        "step": step_of(record, run_dir),
        "started": (started.timestamp() if started else float("-inf")),  # sorts a run of unknown start first
        "when": _when(started),
        "run_dir": run_dir,
        "path": shown_path(run_dir),
        "config": read.config,
    }


def matches(row: dict[str, Any], args: argparse.Namespace) -> bool:
    filters = ((args.task, row["task"]), (args.attn, row["attn"].split("/")[0]), (args.status, row["status"]))
    if any(allowed and value not in allowed for allowed, value in filters):
        return False
    where = (condition.partition("=") for condition in args.where)
    return all(str(lookup(row["config"], key)) == value for key, _, value in where)


def render(rows: Sequence[dict[str, Any]], console: Console) -> None:
    """The table, never narrower than its cells need: only the overrides fold; every other cell stays whole (a
    path that must paste, a number that must not read `…`), so a line longer than the terminal wraps there."""
    table = Table(header_style="bold", pad_edge=False, box=None)
    for name in ("status", "task", "attention"):
        table.add_column(name, no_wrap=True)
    longest = max((len(item) for row in rows for item in row["overrides"].split()), default=0)
    table.add_column("overrides", overflow="fold", min_width=min(max(longest, 16), 48))  # one override per line
    for name in ("val %", "test %", "step"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("run dir", no_wrap=True)
    for row in rows:
        style = STATUS_STYLE.get(row["status"], "")
        cells = (row[key] or "—" for key in ("task", "attn", "overrides", "val", "test", "step", "when", "path"))
        table.add_row(f"[{style}]{row['status']}[/]" if style else row["status"], *cells)
    needed = Measurement.get(console, console.options.update_width(100_000), table).minimum
    console.width = max(console.width, needed + 2)  # (+2: the measure leaves out the last column's edge)
    console.print(table)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lra_bench.runs",
        description="Every run below DIRs, one line each: status, task, attention, overrides, best val and test "
        "accuracy (%), step reached / planned, when it started (local time), run dir. --remove deletes the failed, "
        "interrupted and stopped runs listed (asks first).",
    )
    p.add_argument("dirs", nargs="*", type=Path, help=f"dirs searched recursively (default: {', '.join(DEFAULT_DIRS)})")
    p.add_argument("--task", nargs="+", default=[], help="only these tasks")
    p.add_argument("--attn", nargs="+", default=[], help="only these attentions")
    p.add_argument(
        "--status",
        nargs="+",
        default=[],
        choices=("completed", "running", "stopped", "interrupted", "failed", "evaluated"),
        help="only runs in these states (stopped: the record says running but no process holds the run dir)",
    )
    p.add_argument(
        "--where",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="only runs whose resolved config has KEY=VALUE, e.g. seed=1 optim.lr=0.002",
    )
    p.add_argument(
        "--sort",
        choices=tuple(SORTS),
        default=next(iter(SORTS)),
        help="row order: by task and attention (default), or by when each run started, oldest first",
    )
    p.add_argument(
        "--remove",
        action="store_true",
        help="delete the folders of the failed, interrupted and stopped runs listed (after the filters), after "
        "showing them and asking; never a run a process holds",
    )
    p.add_argument("--yes", action="store_true", help="with --remove: do not ask (needed without a terminal)")
    p.add_argument(
        "--include-completed",
        action="store_true",
        help="with --remove: completed runs and evaluated checkpoints listed go too",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    bad = [w for w in args.where if "=" not in w or not w.split("=", 1)[0]]
    if bad:
        p.exit(2, f"error: --where {bad[0]!r}: expected KEY=VALUE with a dotted config key, e.g. seed=1\n")
    for flag in ("yes", "include_completed"):
        if getattr(args, flag) and not args.remove:
            p.exit(2, f"error: --{flag.replace('_', '-')} goes with --remove, which was not given\n")
    if args.remove and not args.yes and not sys.stdin.isatty():
        p.exit(2, "error: --remove asks before deleting, and there is no terminal to ask on: add --yes\n")
    dirs = args.dirs or [Path(d) for d in DEFAULT_DIRS if Path(d).is_dir()]
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        p.exit(2, f"error: no such directory: {', '.join(missing)}\n")
    paths = find_results(dirs) if dirs else []
    if not paths:
        where = ", ".join(map(str, dirs)) or f"{' or '.join(DEFAULT_DIRS)} (neither exists here)"
        p.exit(2, f"error: no results.json under {where}; give the output or sweep dirs that hold the runs\n")
    records, unreadable = load_records(paths)
    rows = sorted((row_of(r) for r in records), key=SORTS[args.sort])
    shown = [r for r in rows if matches(r, args)]
    console = table_console(highlight=False)
    if args.remove:
        return remove_listed(shown, rows, args.include_completed, not args.yes, lambda go: render(go, console), console)
    if shown:
        render(shown, console)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(Counter(r["status"] for r in shown).items()))
    console.print(f"{len(shown)} of {len(rows)} runs" + (f": {summary}" if summary else ""))
    if any(r["status"] == "stopped" for r in shown):
        console.print("stopped: killed while running (no process holds its run dir); the same command resumes it")
    for bad_record in unreadable:
        print(f"unreadable: {bad_record['path']}: {bad_record['reason']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
