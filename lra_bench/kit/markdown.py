"""The one markdown pipe table every report writes (bench, approx, compare, leaderboard, results_doc).

One helper so the tables look alike and a change of style is one edit; `escape` is for cells that hold free text
(run names, notes), where a `|` or a newline would break the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cell_text(cell: Any) -> str:
    """A cell as table text: `|` escaped and newlines folded, so free text cannot split the row."""
    return str(cell).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], escape: bool = False) -> list[str]:
    """`header` and `rows` as markdown lines (header, `|---|` rule, one line per row); `escape` cleans each body
    cell with `cell_text` (cells are taken as they are otherwise)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    fmt = cell_text if escape else str
    return lines + ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
