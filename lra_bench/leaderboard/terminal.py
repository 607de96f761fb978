"""The leaderboard's main table in the terminal: `leaderboard.md`'s per-method summary, drawn by rich.

`python -m lra_bench.leaderboard` used to print only the paths of what it wrote; a researcher then opened a
150-line markdown file to read one table. This prints that table — per protocol, our on-protocol methods beside the
published rows of the same protocol, then our runs that are not comparable, marked — with the same cells as the
markdown (`render._wide_cells`: mean ± sd over seeds, (n=…), ✗ failed, — not run). Task columns that no row has are
left out, so a ListOps-only sweep is a narrow table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from lra_bench.leaderboard.experiments import short_variant
from lra_bench.leaderboard.published import TASK_LABELS, TASKS
from lra_bench.leaderboard.render import AVG5_LABEL, AVG6_LABEL, MARKS, _wide_cells


def _table(title: str, rows: Sequence[dict[str, Any]]) -> Table:
    cells = {id(row): _wide_cells(row) for row in rows}
    columns = [*(TASK_LABELS[t] for t in TASKS), AVG5_LABEL, AVG6_LABEL]
    kept = [i for i in range(len(columns)) if any(cells[id(row)][i] != "—" for row in rows)]
    table = Table(title=title, title_justify="left", title_style="bold", header_style="bold")
    table.add_column("method")
    table.add_column("source")
    for i in kept:
        table.add_column(columns[i], justify="right")
    for row in rows:
        ours = row["kind"] == "ours"
        method = f"{row['method']}{row.get('flag') or ''}{MARKS.get(str(row.get('conformance')), '') if ours else ''}"
        if ours and row.get("variant"):  # what sets it apart; a long list as its tag (leaderboard.md spells it out)
            method += f" {short_variant(row['variant'])}"
        source = "ours" if ours else f"published: {row['source']}"
        table.add_row(method, source, *(cells[id(row)][i] for i in kept), style=None if ours else "dim")
    return table


def print_summary(wide: Sequence[dict[str, Any]], published: Sequence[dict[str, Any]], console: Console) -> None:
    """One table per protocol of our runs: ours on protocol and the protocol's published rows, then ours apart."""
    protocols = sorted({str(r["protocol"]) for r in wide if r.get("kind") == "ours"})
    for protocol in protocols:
        ours = [r for r in wide if r.get("kind") == "ours" and str(r["protocol"]) == protocol]
        comparable = [r for r in ours if r.get("conformance") == "on"]
        beside = [r for r in published if str(r["protocol"]) == protocol]
        if comparable or beside:
            console.print(_table(f"protocol {protocol}: test accuracy (%)", [*comparable, *beside]))
        apart = [r for r in ours if r.get("conformance") != "on"]
        if apart:
            title = f"protocol {protocol}: not comparable with its published rows (⚠ changed the protocol)"
            console.print(_table(title, apart))
    if not protocols:
        console.print("(no completed runs: no table)")
