"""A run that cannot start for want of data leaves no folder behind.

Hydra makes the run dir, writes `.hydra/` and opens `run.log` in it before the run's code starts, and the run then
writes its `running` record, the config tree and its lock file. `python run.py task=text` with no IMDB anywhere
left that folder behind as a `failed` run, which `python -m lra_bench.runs` and the leaderboard list beside the
runs that trained, though nothing was run: the data was missing, not the experiment wrong. So `run.py` asks
`is_new` when a single run starts and, when the run ends on a `DataSourceError` (raised while the data is found
and prepared, before the first step), `remove_unstarted` deletes that folder and the folders above it that are
left empty, up to the output root. A folder that held anything before (an earlier run's record, log or
checkpoints: a resume) is never removed, and keeps its record as it was: the refused run never took it over.
A refused config (`ConfigError`) keeps its `failed` record, as before.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lra_bench.run.runlog import LOG_NAME


def is_new(output_dir: Path, hydra_subdir: str | None) -> bool:
    """Whether `output_dir` holds nothing but what Hydra wrote for this job: its `hydra_subdir` (`.hydra`) and an
    empty `run.log`. Asked before the run writes anything."""
    try:
        entries = list(output_dir.iterdir())
    except FileNotFoundError:
        return True
    for entry in entries:
        hydra_own = entry.name == hydra_subdir and entry.is_dir() and not entry.is_symlink()
        empty_log = entry.name == LOG_NAME and entry.is_file() and entry.stat().st_size == 0
        if not (hydra_own or empty_log):
            return False
    return True


def remove_unstarted(output_dir: Path, output_root: Path) -> None:
    """Delete `output_dir`, a new run folder whose run never started, and the folders above it that this leaves
    empty, up to `output_root` (kept). A folder with anything else in it (another run, the `latest` link) stays."""
    shutil.rmtree(output_dir, ignore_errors=True)
    root = output_root.expanduser().resolve()
    folder = output_dir.parent.resolve()
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()  # only an empty folder
        except OSError:
            return
        folder = folder.parent
