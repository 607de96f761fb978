"""A line of its own while progress bars are on screen: every line a run prints while it trains goes through `say`.

A plain `print` beside a live bar lands inside the bar's line (the bar redraws with `\\r` and never ends its line).
Here, below the run, so that the parts a run uses (its checkpoints, signals, recorder, the diagnostics callback) print
the same way without importing the run's terminal handling (`lra_bench.run.terminal`).
"""

from __future__ import annotations

import sys
from typing import Any

from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm


def say(message: str, file: Any = None) -> None:
    """Print `message` on a line of its own, also while progress bars are on screen: tqdm's `write` (through
    Lightning's `Tqdm`, the class of its bars) clears the live bars, prints and draws them again below. Never
    raises (it runs in signal handlers too, where a broken pipe would land in the middle of a step)."""
    stream = file if file is not None else sys.stdout
    try:
        Tqdm.write(message, file=stream)
        stream.flush()
    except (OSError, ValueError):
        pass
