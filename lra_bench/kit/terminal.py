"""The rich Console every printed table goes through: the terminal's width on a terminal, and wide enough for any
row when the output is a pipe or a file.

rich makes a Console 80 columns wide when its output is not a terminal, so `python -m lra_bench.runs DIR > file`
folded every row's overrides one per line and `python -m lra_bench.compare A B | less` cut the comparison's
cells and wrapped its lines: a file has no width to fit, and a reader (or `grep`) wants a row on one line.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

#: the width of a Console that writes to no terminal: any table's natural width fits in it, so nothing folds
UNBOUNDED = 100_000


def table_console(min_width: int = 0, **options: Any) -> Console:
    """A Console (`options` as `rich.console.Console` takes them) as wide as the terminal, at least `min_width`;
    `UNBOUNDED` when the output is not a terminal (a table is drawn at its natural width, never wider)."""
    console = Console(**options)
    if not console.is_terminal:
        return Console(width=UNBOUNDED, **options)
    if console.width < min_width:
        console.width = min_width
    return console
