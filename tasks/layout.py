"""Find files of the official `lra_release` archive under a data dir, at either nesting level.

The archive unpacks as `lra_release/lra_release/<task dirs>` with some task dirs also at
`lra_release/<task dirs>`; users also point `data_dir` at either of those folders directly.
"""

from __future__ import annotations

from pathlib import Path

NESTINGS = ("", "lra_release", "lra_release/lra_release")


def candidates(data_dir: str | Path, relative: str) -> list[Path]:
    root = Path(data_dir).expanduser()
    return [root / nest / relative if nest else root / relative for nest in NESTINGS]


def find_release_path(data_dir: str | Path, relative: str) -> Path | None:
    """The first existing `<data_dir>/<nesting>/<relative>`, or None."""
    for path in candidates(data_dir, relative):
        if path.exists():
            return path
    return None


class DataSourceError(FileNotFoundError):
    """Missing or malformed data: the message names the file, what was expected and how to get it."""
