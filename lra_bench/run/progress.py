"""What a person watching a run sees: a step bar in a terminal, a one-line status every N seconds without one.

Our runs are step-based (`max_steps`, `max_epochs=-1`), so Lightning's bars count batches per epoch and title
themselves "Epoch 0/-2". `StepProgressBar` counts optimizer steps to `trainer.max_steps` across epochs — tqdm then
shows `step/max_steps`, the rate and the ETA — with the loss and validation accuracy beside it; a resumed run starts
the bar at its step (the ETA counts only this attempt's steps). Without a terminal (SLURM logs, `nohup`, CI) a bar's
redraws are noise, so `StatusLine` prints one line every `callbacks.status_every_s` seconds and one at the end.
In both modes `ScheduleEstimate` times training steps and evaluations apart and prints, after the first evaluation,
the projected wall time of the whole schedule (a faithful LRA schedule spends a third of its time evaluating, which
a steps-only ETA leaves out); the status line's ETA is the same projection.
`callbacks.progress_bar`: `auto` (bar in a terminal, status lines otherwise), `bar`, `status`, `none`
(`true`/`false` mean `auto`/`none`).

Every line the run prints while it trains goes through `say`: a plain `print` beside a live bar lands inside the
bar's line (the bar redraws with `\r` and never ends its line), e.g. `…| 2/2 [00:00<00:00]\x1b[A[lra-bench] projected`.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar

MODES = ("auto", "bar", "status", "none")
SHOWN = ("train/loss", "val/acc", "val/acc_best")


def say(message: str, file: Any = None) -> None:
    """Print `message` on a line of its own, also while progress bars are on screen: tqdm's `write` (through
    Lightning's `Tqdm`, the class of its bars) clears the live bars, prints and draws them again below. Never
    raises (it runs in signal handlers too, where a broken pipe would land in the middle of a step)."""
    from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm

    stream = file if file is not None else sys.stdout
    try:
        Tqdm.write(message, file=stream)
        stream.flush()
    except (OSError, ValueError):
        pass


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
