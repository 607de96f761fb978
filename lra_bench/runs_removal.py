"""`python -m lra_bench.runs --remove`: delete the folders of the listed runs that may go, after asking.

Why: `make clean` takes the venv and every result at once; a researcher wants the failed and interrupted attempts
gone and the completed runs kept. What may go, of the runs the listing shows (its filters first):

- a `failed` or `interrupted` run, and a `stopped` one (killed: its record still says running, no process holds it);
- a `completed` run or an `evaluated` checkpoint only with `--include-completed`, asked for by name;
- never a run a process holds (`lra_bench.run.rundir`): checked again under the run dir's own lock at the moment of
  deletion, so a run resumed between the question and the answer is kept, and no run can start in a folder while it
  is being deleted;
- never a folder that holds another run that stays (a failed run whose `eval/` holds a kept evaluated record).

The runs that go are shown first as a table, and the question is asked on a terminal (`--yes` skips it; without a
terminal and without `--yes` the listing refuses before anything is read, `lra_bench.runs.main`). A `latest` link
left pointing at a removed folder is removed with it (`lra_bench.run.rundir`).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from lra_bench.config.validate import LINK
from lra_bench.errors import ConfigError
from lra_bench.run.rundir import RunDirLock

#: the statuses `--remove` deletes; `COMPLETED` only with `--include-completed`; any other (running) never
REMOVABLE = ("failed", "interrupted", "stopped")
COMPLETED = ("completed", "evaluated")
YES = ("y", "yes")

Row = dict[str, Any]


def _inside(path: Path, folder: Path) -> bool:
    return path != folder and folder in path.parents


def why_kept(row: Row, include_completed: bool) -> str | None:
    """Why a listed run stays by its status (None: it may go), worded to be counted (`2 completed (…)`)."""
    if row["status"] in REMOVABLE or (include_completed and row["status"] in COMPLETED):
        return None
    if row["status"] in COMPLETED:
        return f"{row['status']} (--include-completed removes them)"
    return f"{row['status']} (a process holds them)"


def removable(
    shown: Sequence[Row], every: Sequence[Row], include_completed: bool
) -> tuple[list[Row], list[tuple[Row, str]]]:
    """(the listed runs to remove, the listed runs kept with why): a run whose folder holds a run that stays (of
    every run found, listed or not) is kept, so deleting a folder never takes a kept run with it."""
    kept = [(row, why) for row in shown if (why := why_kept(row, include_completed)) is not None]
    chosen = [row for row in shown if why_kept(row, include_completed) is None]
    going = {row["run_dir"] for row in chosen}
    staying = [row["run_dir"] for row in every if row["run_dir"] not in going]
    holders = [row for row in chosen if any(_inside(other, row["run_dir"]) for other in staying)]
    kept += [(row, "holding a run that stays") for row in holders]
    return [row for row in chosen if row not in holders], kept


def kept_line(kept: Sequence[tuple[Row, str]]) -> str:
    """The kept runs counted by why, e.g. `kept: 2 completed (--include-completed removes them)`; empty for none."""
    counts = Counter(why for _, why in kept)
    return "kept: " + ", ".join(f"{n} {why}" for why, n in counts.items()) if counts else ""


def folder_size(path: Path) -> int:
    """Bytes in the files below `path` (what removing it frees), links not followed."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # gone meanwhile
                continue
    return total


def human(size: int) -> str:
    """`size` bytes as a person reads them: `812 B`, `3.4 MB`, `1.2 GB` (powers of 1000, as `df -H`)."""
    if size < 1000:
        return f"{size} B"
    scaled = float(size)
    for unit in ("kB", "MB", "GB"):
        scaled /= 1000
        if scaled < 1000:
            return f"{scaled:.1f} {unit}"
    return f"{scaled / 1000:.1f} TB"


def confirmed(console: Console, prompt: str) -> bool:
    """Whether the person at the terminal answered yes (an empty answer or end of input is no)."""
    try:
        return console.input(prompt, markup=False).strip().lower() in YES
    except EOFError:
        return False


def unlink_stale_latest(run_dir: Path) -> None:
    """Remove `<run dir>/../latest` when it pointed at the removed run (a dangling link resolves nowhere)."""
    link = run_dir.parent / LINK
    if link.is_symlink() and not link.exists() and Path(os.readlink(link)).name == run_dir.name:
        link.unlink()


def delete_run(run_dir: Path) -> str | None:
    """Delete one run dir under its own lock; the reason it stays, or None when it is gone (also when it went
    already, inside a folder removed before it: an evaluated checkpoint's record in its run's `eval/`)."""
    if not run_dir.is_dir():
        return None
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except ConfigError as err:  # a process took it since the listing
        return str(err)
    try:
        shutil.rmtree(run_dir)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    finally:
        lock.release()
    unlink_stale_latest(run_dir)
    return None


def remove_listed(
    shown: Sequence[Row],
    every: Sequence[Row],
    include_completed: bool,
    ask: bool,
    draw: Callable[[Sequence[Row]], None],
    console: Console,
) -> int:
    """Show the runs that go, ask (unless `ask` is False), delete them: exit status 0 when all went (or none was
    to go), 1 when the answer was no or a folder could not be removed."""
    going, kept = removable(shown, every, include_completed)
    note = kept_line(kept)
    if not going:
        console.print(f"nothing to remove among the {len(shown)} runs listed" + (f"; {note}" if note else ""))
        return 0
    draw(going)
    if note:
        console.print(note)
    dirs = [row["run_dir"] for row in going]
    size = human(sum(folder_size(d) for d in dirs if not any(_inside(d, other) for other in dirs)))
    question = f"remove these {len(going)} run folders ({size})? [y/N] "
    if ask and not confirmed(console, question):
        console.print("nothing removed")
        return 1
    failures = [(row, delete_run(row["run_dir"])) for row in going]
    for row, reason in failures:
        if reason is not None:
            print(f"not removed: {row['path']}: {reason}", file=sys.stderr)
    removed = sum(reason is None for _, reason in failures)
    console.print(f"removed {removed} of {len(going)} run folders")
    return 0 if removed == len(going) else 1
