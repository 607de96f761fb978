"""The leaderboard as a W&B run of its own: job_type `leaderboard`, in the sweep's W&B group, with the tables
(groups, methods, Pareto points) and every chart as an image.

Online only when asked (`--wandb online`, or `WANDB_MODE=online`); offline otherwise, so it needs no account and
writes `<out>/wandb/offline-run-*` for a later `wandb sync`. `WANDB_MODE=disabled` turns it off. The run's project,
entity and group default to the ones the sweep's runs logged under (`logger.wandb.*` in their records).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from lra_bench.record.reader import typed

Mode = Literal["online", "offline", "disabled"]
MODES: tuple[Mode, ...] = ("online", "offline", "disabled")
DEFAULT_PROJECT = "lra-bench"


def resolve_mode(requested: str | None = None) -> Mode:
    """The mode asked for, else `WANDB_MODE` when it names one, else offline."""
    if requested:
        if requested not in MODES:
            raise ValueError(f"W&B mode {requested!r}: use one of {', '.join(MODES)}")
        return next(mode for mode in MODES if mode == requested)
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    env = {"dryrun": "offline", "run": "online"}.get(env, env)
    return next((mode for mode in MODES if mode == env), "offline")


def settings_from_records(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The most common `logger.wandb.{project, entity, group}` among the records' resolved configs."""
    out: dict[str, Any] = {}
    for key in ("project", "entity", "group"):
        values = Counter(v for r in records if (v := typed(r).config_at(f"logger.wandb.{key}")) is not None)
        out[key] = values.most_common(1)[0][0] if values else None
    return out


def _table(wandb: Any, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Any:
    return wandb.Table(columns=list(columns), data=[[r.get(c) for c in columns] for r in rows], allow_mixed_types=True)


def log_to_wandb(
    table: dict[str, Any],
    mode: str | None = None,
    project: str | None = None,
    entity: str | None = None,
    group: str | None = None,
    name: str | None = None,
    directory: str | Path | None = None,
) -> Path | None:
    """Start a W&B run, log `table` (what `build_leaderboard` returned) and finish. Returns the run's local dir,
    or None when disabled or when W&B failed (the reason on stderr; the leaderboard files are written anyway)."""
    from lra_bench.leaderboard import pareto, render  # pandas: only when logging (the sweep callback imports this)

    mode = resolve_mode(mode)
    if mode == "disabled":
        return None
    defaults = table.get("wandb") or {}
    out = Path(directory) if directory is not None else Path(table["markdown"]).parent
    # named after the first dir read (the sweep's, the evidence's), not where its files went (`outputs/leaderboard`
    # for every command-line build)
    named_after = Path((table.get("dirs") or [out])[0]).resolve().name
    try:
        import wandb  # only when a run is logged: W&B is slow to import, and optional

        run = wandb.init(
            project=project or defaults.get("project") or DEFAULT_PROJECT,
            entity=entity or defaults.get("entity"),
            group=group or defaults.get("group"),
            job_type="leaderboard",
            name=name or f"leaderboard-{named_after}",
            dir=str(out),
            mode=mode,
            reinit="create_new",  # never log into (or finish) a run the caller has open
            config={"dirs": [str(d) for d in table.get("dirs", [])], "n_files": table.get("n_files")},
        )
        try:
            columns, points = pareto.points_table(table.get("pareto", []))
            payload: dict[str, Any] = {
                "leaderboard/groups": _table(wandb, table["rows"], render.GROUP_COLUMNS),
                "leaderboard/methods": _table(wandb, [*table["wide"], *table["published"]], render.WIDE_COLUMNS),
                "leaderboard/pareto": _table(wandb, [dict(zip(columns, p)) for p in points], columns),
            }
            for path in table.get("plots", []):
                payload[f"leaderboard/charts/{Path(path).stem}"] = wandb.Image(str(path))
            run.log(payload)
            run.summary.update(
                {
                    "n_files": table.get("n_files"),
                    "n_groups": len(table["rows"]),
                    "n_failed_or_unfinished": len(table.get("failures", [])),
                    "n_unreadable": len(table.get("unreadable", [])),
                }
            )
            run_dir = Path(run.dir).parent
        finally:
            run.finish()
    except Exception as err:  # no network, no key, a W&B bug: say so; the files are there already
        print(
            f"[lra-bench] could not log the leaderboard to W&B ({mode}): {type(err).__name__}: {err}", file=sys.stderr
        )
        return None
    return run_dir
