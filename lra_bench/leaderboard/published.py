"""Published LRA numbers (papers' tables) for the leaderboard, kept apart from our runs.

Why a data file: the numbers are facts with sources (paper, table, protocol), not code; keeping them in
`published.json` lets a reviewer check each against its citation, and keeps them out of our means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PUBLISHED_PATH = Path(__file__).with_name("published.json")

# Canonical task keys, in the LRA paper's column order; the first five make the 5-task average.
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
FIVE_TASKS = TASKS[:5]
TASK_LABELS = {
    "listops": "ListOps",
    "text": "Text",
    "retrieval": "Retrieval",
    "image": "Image",
    "pathfinder": "Pathfinder",
    "pathx": "Path-X",
}
# Path-X failure (or no run) counts as chance in the 6-task convention of S4/Mega.
PATHX_FAIL_SCORE = 50.0


@dataclass(frozen=True)
class PublishedRow:
    """One model's row of one published table; accuracies in percent, `None` = not run, "FAIL" = failed."""

    source: str
    source_label: str
    citation: str
    protocol: str | None
    model: str
    attn: str
    rank_budget: int | None
    scores: dict[str, float | str | None]
    avg_reported: float | None
    flag: str = ""
    avg_note: str = ""
    peak_memory_mb: float | None = None  # as published (xformers' "peak MB"), not converted


def load_published(path: Path = PUBLISHED_PATH) -> tuple[dict[str, dict[str, Any]], list[PublishedRow]]:
    """The sources (id -> label, citation, protocol, note) and every published row, in file order."""
    with open(path) as fh:
        data = json.load(fh)
    sources: dict[str, dict[str, Any]] = data["sources"]
    rows = []
    for raw in data["rows"]:
        src = sources[raw["source"]]
        peak_mb = raw.get("peak_memory_mb")
        rows.append(
            PublishedRow(
                source=raw["source"],
                source_label=src["label"],
                citation=src["citation"],
                protocol=src.get("protocol"),
                model=raw["model"],
                attn=raw["attn"],
                rank_budget=raw.get("rank_budget"),
                scores={task: raw.get(task) for task in TASKS},
                avg_reported=raw.get("avg_reported"),
                flag=raw.get("flag", ""),
                avg_note=raw.get("avg_note", ""),
                peak_memory_mb=float(peak_mb) if peak_mb is not None else None,
            )
        )
    return sources, rows
