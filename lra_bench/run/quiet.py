"""What a run's terminal leaves to `run.log`: a person reads what runs, its progress and its summary.

Lightning talks about its own wiring on every run — "GPU available: False", "Seed set to 0", its model summary
(with "Total FLOPs: 0": it counts FLOPs only for a module with an `example_input_array`), "`Trainer.fit` stopped",
"Restoring states from the checkpoint", and warnings such as "callbacks used to create the checkpoint need to be
provided" when a checkpoint is tested without its training callbacks, which a test does not need. None of it is
about the user's experiment, and in a terminal it drowned the lines that are. Inside `quiet_terminal()` Lightning's
log records below WARNING and the warnings Lightning's own code raises go to `run.log` only (`runlog.to_log_only`;
Hydra's file handler already writes the log records there); Lightning's warning-level records, other libraries'
warnings and everything the harness prints still reach the terminal. Without an open `run.log` (DDP ranks > 0) a
warning is shown as usual, so nothing is lost.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lra_bench.run.runlog import LIGHTNING_LOGGERS, to_log_only


def lightning_dirs() -> tuple[str, ...]:
    """The source folders of Lightning's packages (a warning raised from a file under them is Lightning's)."""
    import lightning_fabric
    import pytorch_lightning

    return tuple(str(Path(str(pkg.__file__)).parent) for pkg in (pytorch_lightning, lightning_fabric))


class LightningInfoOffTerminal(logging.Filter):
    """On a handler that writes to the terminal: drops Lightning's records below WARNING. With `copy`, it first
    writes them to run.log (a handler of Lightning's own, where no Hydra file handler takes them there)."""

    def __init__(self, copy: bool) -> None:
        super().__init__()
        self.copy = copy

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not record.name.startswith(LIGHTNING_LOGGERS):
            return True
        if self.copy:
            to_log_only(record.getMessage())
        return False


def _terminal_handlers() -> list[tuple[logging.Handler, bool]]:
    """(handler, copy) for every plain stream handler that could show Lightning's records: the root's (Hydra's
    console handler: its file handler writes run.log) and Lightning's own, which nothing else copies to run.log."""
    found: list[tuple[logging.Handler, bool]] = [
        (h, False) for h in logging.getLogger().handlers if type(h) is logging.StreamHandler
    ]
    for name in LIGHTNING_LOGGERS:
        found += [(h, True) for h in logging.getLogger(name).handlers if type(h) is logging.StreamHandler]
    return found


@contextlib.contextmanager
def quiet_terminal() -> Iterator[None]:
    """Inside the block (and inside `runlog.tee_output`), Lightning's chatter goes to run.log only."""
    installed = [(handler, LightningInfoOffTerminal(copy)) for handler, copy in _terminal_handlers()]
    for handler, log_filter in installed:
        handler.addFilter(log_filter)
    show, folders = warnings.showwarning, lightning_dirs()

    def show_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None):
        if str(filename).startswith(folders) and to_log_only(
            warnings.formatwarning(message, category, filename, lineno, line)
        ):
            return
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = show_warning
    try:
        yield
    finally:
        warnings.showwarning = show
        for handler, log_filter in installed:
            handler.removeFilter(log_filter)
