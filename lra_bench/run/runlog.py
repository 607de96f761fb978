"""`run.log`: the run's whole log, not only what went through Python's `logging`.

Hydra's job logging writes `logging` records (Lightning's messages) to `<run dir>/run.log`; everything the run
`print`s — data generation, resume and signal messages, status lines, the summary, the one-line error, a failure's
traceback — went only to the terminal. `tee_output` copies stdout and stderr into the same file for the duration of
a run, line by line (appended, so Hydra's records and ours interleave in order): a progress bar's redraws (text
before a `\r`) and terminal colours are dropped from the file, and a failure to write the file (a full disk) never
disturbs the run.
The streams keep their own behaviour (`isatty`, `fileno`, encoding), so bars and colours still adapt to the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class _LogFile:
    """The file side shared by both streams: complete lines only, redraws and colours removed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: IO[str] | None = open(path, "a", encoding="utf-8", errors="replace")
        self.pending: dict[int, str] = {}

    def write(self, stream_id: int, text: str) -> None:
        if self.fh is None:
            return
        buffered = self.pending.get(stream_id, "") + text
        *lines, rest = buffered.split("\n")
        self.pending[stream_id] = rest[-4096:]
        if not lines:
            return
        try:
            for line in lines:
                line = ANSI.sub("", line.rsplit("\r", 1)[-1])
                self.fh.write(line + "\n")
            self.fh.flush()
        except (OSError, ValueError):  # disk full, file closed: the terminal still gets everything
            self.close()

    def close(self) -> None:
        fh, self.fh = self.fh, None
        if fh is not None:
            with contextlib.suppress(OSError, ValueError):
                for rest in self.pending.values():
                    if rest.strip():
                        fh.write(ANSI.sub("", rest.rsplit("\r", 1)[-1]) + "\n")
                fh.close()


class _Tee:
    """A text stream that writes through to `stream` and copies to the log file."""

    def __init__(self, stream: Any, log: _LogFile) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._log.write(id(self), text)
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, errors, buffer, …
        return getattr(self._stream, name)


LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric")


def route_lightning_logs_to_hydra() -> None:
    """Lightning, imported before any logging is configured (the pre-flight builds the task's data module), gives
    its loggers their own stderr handler and stops them propagating: its records then bypass Hydra's handlers (the
    console format and run.log). Call inside the Hydra app, after Hydra configured logging."""
    if not logging.getLogger().handlers:
        return
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
        logger.propagate = True


@contextlib.contextmanager
def tee_output(path: Path | None) -> Iterator[None]:
    """Copy stdout and stderr into `path` (appending) inside the block; `None` copies nothing."""
    if path is None:
        yield
        return
    try:
        log = _LogFile(Path(path))
    except OSError:  # an unwritable run dir is reported by the run's own checks
        yield
        return
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)  # type: ignore[assignment]
    try:
        yield
    except Exception:  # Hydra prints the traceback after this block: the run's log gets it too
        log.write(0, traceback.format_exc())
        raise
    finally:
        sys.stdout, sys.stderr = out, err
        log.close()
