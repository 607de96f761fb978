"""Drawing and writing a matplotlib figure the one way every report does.

`agg_figure`: a figure drawn by the Agg canvas outside pyplot's global state (nothing to close, no backend chosen
for the process); `pyplot`: pyplot on the Agg backend, for the reports drawn through it; `save_figure`: laid out,
saved as a PNG, closed. Closed, because a report draws many figures and pyplot keeps every open one alive; saved
without the `Software` metadata (the matplotlib version), so that the same numbers give the same bytes on any
machine.

matplotlib loads only when a figure is drawn (each import below is inside its function): the report commands answer
`--help` and bad arguments without it, and `python -m lra_bench.runs` reads curves' metrics through a module that
also draws them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def agg_figure(**options: Any) -> Figure:
    """`matplotlib.figure.Figure(**options)` with an Agg canvas attached."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # (matplotlib only when drawing: see above)
    from matplotlib.figure import Figure

    fig = Figure(**options)
    FigureCanvasAgg(fig)
    return fig


def pyplot() -> Any:
    """`matplotlib.pyplot`, with the Agg backend chosen first (no display is needed or used)."""
    import matplotlib  # (matplotlib only when drawing: see above)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110, tight: bool = True) -> Path:
    """Save `fig` to `path` (`tight`: `tight_layout` first) and close it; returns `path`."""
    import matplotlib.pyplot as plt  # (matplotlib only when drawing: see above)

    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return path
