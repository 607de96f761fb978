"""What a run shows and keeps: `run.log` (`tee_output`), what the terminal leaves to it (`quiet_terminal`), and the
progress a person watches (`StepProgressBar`, `StatusLine`).

`run.log` is the run's whole log, not only what went through Python's `logging`: Hydra's job logging writes
Lightning's records there, but everything the run `print`s (data generation, resume and signal messages, status
lines, the summary, a failure's traceback) went only to the terminal. `tee_output` copies stdout and stderr into the
same file, line by line (appended, so Hydra's records and ours interleave in order), without a progress bar's
redraws (text before a carriage return) or terminal colours; the streams keep their own behaviour (`isatty`,
`fileno`, encoding), and a failure to write the file (a full disk) never disturbs the run.

A terminal that goes away never stops the run. Ctrl-C under `python run.py … 2>&1 | tee log` kills `tee` too, and
every later write to stdout/stderr failed with EPIPE — raising inside whatever the run was doing (the save at the step
boundary was lost that way), and Python's final flush turned the exit status into 120. A stream whose write fails is
therefore pointed at /dev/null (Python's own advice for SIGPIPE), and the run goes on writing `run.log` alone.

Lightning talks about its own wiring on every run — "GPU available: False", "Seed set to 0", its model summary,
"Restoring states from the checkpoint", warnings about callbacks a test does not need — and in a terminal it drowned
the lines about the user's experiment. Inside `quiet_terminal()` Lightning's log records below WARNING and the
warnings its own code raises go to `run.log` only (`to_log_only`); its warning-level records, other libraries'
warnings and everything the harness prints still reach the terminal. Without an open `run.log` (DDP ranks > 0) a
warning is shown as usual.

Our runs are step-based (`max_steps`, `max_epochs=-1`), so Lightning's bars count batches per epoch and title
themselves "Epoch 0/-2". `StepProgressBar` counts optimizer steps to `trainer.max_steps` across epochs (tqdm then
shows the rate and ETA), with the loss and validation accuracy beside it; a resumed run starts the bar at its step.
Without a terminal (SLURM logs, `nohup`, CI) `StatusLine` prints one line every `callbacks.status_every_s` seconds
and one at the end. In both modes `ScheduleEstimate` times training steps and evaluations apart and prints, after the
first evaluation, the projected wall time of the whole schedule (a faithful LRA schedule spends a third of its time
evaluating, which a steps-only ETA leaves out). `callbacks.progress_bar`: `auto` (bar in a terminal, status lines
otherwise), `bar`, `status`, `none` (`true`/`false` mean `auto`/`none`). Every line printed while the run trains
goes through `lra_bench.kit.say`: a plain `print` beside a live bar lands inside the bar's line.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import lightning_fabric
import pytorch_lightning
import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar

from lra_bench.kit.say import say

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOG_ONLY = -1  # the stream id of text that goes to the file only (the tees use their own ids)


def _plain(line: str) -> str:
    """A line as the file keeps it: its last redraw (after the last carriage return), without colours."""
    return ANSI.sub("", line.rsplit("\r", 1)[-1])


class _LogFile:
    """The file side shared by both streams: complete lines only, redraws and colours removed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: IO[str] | None = open(path, "a", encoding="utf-8", errors="replace")
        self.pending: dict[int, str] = {}

    def write(self, stream_id: int, text: str) -> None:
        if self.fh is None:
            return
        *lines, rest = (self.pending.get(stream_id, "") + text).split("\n")
        self.pending[stream_id] = rest[-4096:]
        if not lines:
            return
        try:
            self.fh.writelines(_plain(line) + "\n" for line in lines)
            self.fh.flush()
        except (OSError, ValueError):  # disk full, file closed: the terminal still gets everything
            self.close()

    def close(self) -> None:
        fh, self.fh = self.fh, None
        if fh is not None:
            with contextlib.suppress(OSError, ValueError):
                fh.writelines(_plain(rest) + "\n" for rest in self.pending.values() if rest.strip())
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

    def _to_stream(self, action: Callable[[], Any]) -> None:
        if self._lost:
            return
        try:
            action()
        except BlockingIOError:  # a non-blocking terminal that is full right now: this text only is dropped
            pass
        except (OSError, ValueError):  # the reader is gone (EPIPE), the terminal closed (EIO), a closed file
            self._lost = True
            silence(self._stream)

    def write(self, text: str) -> int:
        self._to_stream(lambda: self._stream.write(text))
        self._log.write(id(self), text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._to_stream(self._stream.flush)

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
    """Inside the block (and inside `tee_output`), Lightning's chatter goes to run.log only."""
    installed = [(handler, LightningInfoOffTerminal(copy)) for handler, copy in _terminal_handlers()]
    for handler, log_filter in installed:
        handler.addFilter(log_filter)
    show = warnings.showwarning
    folders = tuple(str(Path(str(p.__file__)).parent) for p in (pytorch_lightning, lightning_fabric))  # Lightning's

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


def progress_mode(setting: object, isatty: bool | None = None) -> str:
    """`callbacks.progress_bar` → bar | status | none (`auto` decides by whether stdout is a terminal)."""
    mode = "auto" if setting is True else "none" if setting is False else str(setting)
    if mode == "auto":
        tty = sys.stdout.isatty() if isatty is None else isatty
        return "bar" if tty else "status"
    return mode


def progress_callbacks(setting: object, every_s: float) -> tuple[list[pl.Callback], bool]:
    """The callbacks for `callbacks.progress_bar`, and whether Lightning's progress bar is enabled."""
    mode = progress_mode(setting)
    estimate = ScheduleEstimate()
    if mode == "bar":
        return [estimate, StepProgressBar()], True
    if mode == "status":
        return [estimate, StatusLine(every_s, estimate)], False
    return [estimate], False


def _value(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar over optimizer steps (`n/max_steps`, rate, ETA), not over each epoch's batches."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        bar = self.init_train_tqdm()
        bar.reset(total=int(trainer.max_steps))
        bar.initial = bar.n = int(trainer.global_step)  # a resumed run: the ETA counts this attempt's rate only
        bar.set_description("train step")
        bar.refresh()
        self.train_progress_bar = bar

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        """One bar for the whole run (Lightning's default starts a new one, per epoch)."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        bar = self.train_progress_bar
        step = int(trainer.global_step)
        if bar is not None and self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=True)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))


class ScheduleEstimate(pl.Callback):
    """Times this attempt's training steps and evaluations apart (sanity checks left out) and projects the rest of
    the schedule: remaining steps × seconds per step + remaining evaluations × seconds per evaluation. Prints the
    projection once, after the first evaluation of this attempt."""

    def __init__(self) -> None:
        self._train_start: float | None = None
        self._first_step = 0
        self._eval_s = 0.0
        self._evals = 0
        self._eval_start: float | None = None
        self.printed = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_start, self._first_step = time.monotonic(), int(trainer.global_step)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._eval_start = time.monotonic()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._eval_start is None:
            return
        self._eval_s += time.monotonic() - self._eval_start
        self._evals += 1
        self._eval_start = None
        if not self.printed and trainer.is_global_zero and self.remaining_s(trainer) is not None:
            self.printed = True
            say(f"[lra-bench] {self.describe(trainer)}")

    def step_s(self, trainer: pl.Trainer) -> float | None:
        """Seconds per training step so far in this attempt, evaluations excluded."""
        done = int(trainer.global_step) - self._first_step
        if self._train_start is None or done <= 0:
            return None
        running = self._eval_s + (time.monotonic() - self._eval_start if self._eval_start is not None else 0.0)
        return (time.monotonic() - self._train_start - running) / done

    def evaluations_left(self, trainer: pl.Trainer) -> int:
        """Evaluations still to come (0 when they are not every N steps: a fraction of an epoch)."""
        every = trainer.val_check_interval
        if not isinstance(every, int) or every < 1 or trainer.max_steps <= 0:
            return 0
        return trainer.max_steps // every - int(trainer.global_step) // every

    def remaining_s(self, trainer: pl.Trainer) -> float | None:
        step_s = self.step_s(trainer)
        if step_s is None:
            return None
        left = max(int(trainer.max_steps) - int(trainer.global_step), 0) * step_s
        if self._evals:
            left += self.evaluations_left(trainer) * self._eval_s / self._evals
        return left

    def describe(self, trainer: pl.Trainer) -> str:
        step_s, remaining = self.step_s(trainer), self.remaining_s(trainer)
        assert step_s is not None and remaining is not None
        per_eval = self._eval_s / max(self._evals, 1)
        return (
            f"projected: {dt.timedelta(seconds=round(remaining))} to the end of the schedule "
            f"({max(int(trainer.max_steps) - int(trainer.global_step), 0)} steps × {step_s:.2f} s + "
            f"{self.evaluations_left(trainer)} evaluations × {per_eval:.1f} s; the test pass not included)"
        )


class StatusLine(pl.Callback):
    """`[lra-bench] step 120/5000 (2.4%) | loss 1.2345 | val/acc 0.3100 | 3.1 steps/s | ETA 0:26:14` every
    `every_s` seconds of training, and once at the end (for logs without a terminal)."""

    def __init__(self, every_s: float = 30.0, estimate: ScheduleEstimate | None = None) -> None:
        self.every_s = float(every_s)
        self.estimate = estimate
        self._start: tuple[float, int] | None = None
        self._last = 0.0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = (time.monotonic(), int(trainer.global_step))
        self._last = time.monotonic()

    def line(self, trainer: pl.Trainer) -> str:
        step, total = int(trainer.global_step), int(trainer.max_steps)
        parts = [f"step {step}/{total}" + (f" ({100 * step / total:.1f}%)" if total > 0 else "")]
        metrics = trainer.progress_bar_metrics
        for key, label in (("train/loss", "loss"), ("val/acc", "val/acc"), ("val/acc_best", "best")):
            value = _value(metrics, key)
            if value is not None:
                parts.append(f"{label} {value:.4f}")
        if self._start is not None:
            elapsed, done = time.monotonic() - self._start[0], step - self._start[1]
            if elapsed > 0 and done > 0:
                rate = done / elapsed
                parts.append(f"{rate:.2f} steps/s")
                remaining = self.estimate.remaining_s(trainer) if self.estimate is not None else None
                if total > step:
                    eta = remaining if remaining is not None else (total - step) / rate
                    parts.append(f"ETA {dt.timedelta(seconds=round(eta))}")
        return "[lra-bench] " + " | ".join(parts)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        now = time.monotonic()
        if trainer.is_global_zero and now - self._last >= self.every_s:
            self._last = now
            say(self.line(trainer))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            say(self.line(trainer))
