"""Writing a matplotlib figure the one way every report does: laid out, saved as a PNG, closed.

Closed, because a report draws many figures and pyplot keeps every open one alive; saved without the
`Software` metadata (the matplotlib version), so that the same numbers give the same bytes on any machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: Path, dpi: int = 110, tight: bool = True) -> Path:
    """Save `fig` to `path` (`tight`: `tight_layout` first) and close it; returns `path`."""
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return path
