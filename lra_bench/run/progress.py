"""What a person watching a run sees: a step bar in a terminal, a one-line status every N seconds without one.

Our runs are step-based (`max_steps`, `max_epochs=-1`), so Lightning's bars count batches per epoch and title
themselves "Epoch 0/-2". `StepProgressBar` counts optimizer steps to `trainer.max_steps` across epochs — tqdm then
shows `step/max_steps`, the rate and the ETA — with the loss and validation accuracy beside it; a resumed run starts
the bar at its step (the ETA counts only this attempt's steps). Without a terminal (SLURM logs, `nohup`, CI) a bar's
redraws are noise, so `StatusLine` prints one line every `callbacks.status_every_s` seconds and one at the end.
`callbacks.progress_bar`: `auto` (bar in a terminal, status lines otherwise), `bar`, `status`, `none`
(`true`/`false` mean `auto`/`none`).
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
    if mode == "bar":
        return [StepProgressBar()], True
    if mode == "status":
        return [StatusLine(every_s)], False
    return [], False


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


class StatusLine(pl.Callback):
    """`[lra-bench] step 120/5000 (2.4%) | loss 1.2345 | val/acc 0.3100 | 3.1 steps/s | ETA 0:26:14` every
    `every_s` seconds of training, and once at the end (for logs without a terminal)."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = float(every_s)
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
                if total > step:
                    parts.append(f"ETA {dt.timedelta(seconds=round((total - step) / rate))}")
        return "[lra-bench] " + " | ".join(parts)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        now = time.monotonic()
        if trainer.is_global_zero and now - self._last >= self.every_s:
            self._last = now
            print(self.line(trainer), flush=True)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            print(self.line(trainer), flush=True)
