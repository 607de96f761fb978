"""`run.log`: the run's whole log, not only what went through Python's `logging`.

Hydra's job logging writes `logging` records (Lightning's messages) to `<run dir>/run.log`; everything the run
`print`s — data generation, resume and signal messages, status lines, the summary, the one-line error, a failure's
traceback — went only to the terminal. `tee_output` copies stdout and stderr into the same file for the duration of
a run, line by line (appended, so Hydra's records and ours interleave in order): a progress bar's redraws (text
before a `\r`) and terminal colours are dropped from the file, and a failure to write the file (a full disk) never
disturbs the run.
The streams keep their own behaviour (`isatty`, `fileno`, encoding), so bars and colours still adapt to the terminal.

A terminal that goes away never stops the run. Ctrl-C under `python run.py … 2>&1 | tee log` sends SIGINT to the
whole pipeline: `tee` dies, and every later write to stdout/stderr fails with EPIPE — the signal's own message, a
status line, the "saved last.ckpt" line — raising inside whatever the run was doing (the save at the step boundary
was lost that way), and Python's final flush of stdout turned the exit status into 120. A stream whose write fails
is therefore pointed at /dev/null (Python's own advice for SIGPIPE), and the run goes on writing `run.log` alone.

What the terminal leaves out (Lightning's chatter, the config tree: `lra_bench.run.quiet`) still reaches the file,
through `to_log_only`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

LOG_NAME = "run.log"  # Hydra's job log of run.py (`<job name>.log`), which the tees append to
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOG_ONLY = -1  # the stream id of text that goes to the file only (the tees use their own ids)


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


def silence(stream: Any) -> None:
    """Point `stream`'s file descriptor at /dev/null: what it still buffers, and later writes (Python's flush at
    exit, logging handlers holding the stream), then succeed and go nowhere."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)


class _Tee:
    """A text stream that writes through to `stream` (until that fails: see the module docstring) and copies to the
    log file."""

    def __init__(self, stream: Any, log: _LogFile) -> None:
        self._stream, self._log = stream, log
        self._lost = False

    def _lose_stream(self) -> None:
        self._lost = True
        silence(self._stream)

    def write(self, text: str) -> int:
        if not self._lost:
            try:
                self._stream.write(text)
            except BlockingIOError:  # a non-blocking terminal that is full right now: this text only is dropped
                pass
            except (OSError, ValueError):  # the reader is gone (EPIPE), the terminal closed (EIO), a closed file
                self._lose_stream()
        self._log.write(id(self), text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self._lost:
            try:
                self._stream.flush()
            except BlockingIOError:
                pass
            except (OSError, ValueError):
                self._lose_stream()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, errors, buffer, …
        return getattr(self._stream, name)


LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric")
_active: _LogFile | None = None  # the run.log that `tee_output` holds open, if any


def to_log_only(text: str) -> bool:
    """Write `text` (whole lines) to the open run.log and not to the terminal; False when none is open."""
    if _active is None:
        return False
    _active.write(LOG_ONLY, text if text.endswith("\n") else text + "\n")
    return True


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
    global _active
    out, err, outer = sys.stdout, sys.stderr, _active
    tees = _Tee(out, log), _Tee(err, log)
    sys.stdout, sys.stderr = tees
    _active = log
    try:
        yield
    except Exception:  # Hydra prints the traceback after this block: the run's log gets it too
        log.write(0, traceback.format_exc())
        raise
    finally:
        for tee in tees:  # what stdout still buffers, while a broken pipe can still be caught (not at exit)
            tee.flush()
        sys.stdout, sys.stderr = out, err
        _active = outer
        log.close()
