"""Fault injection for the tests: a Lightning callback that a test adds to a real `run.py` process through the
user-callback path (`+callbacks.fault._target_=tests.faults.FaultInjection`, built by
`lra_bench.run.build`), so the harness carries no test-only code. `fault(...)` in `tests/conftest.py`
writes the overrides. `callbacks.fault` is logistics in the run's identity (`lra_bench.record.identity`): a run
with a fault resumes as the same experiment without it."""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
import torch


class FaultInjection(pl.Callback):
    """`step_sleep_s=0.3` (slow steps, so a test can interrupt mid-run), `eval_sleep_s=2` (slow validation batches,
    sanity check left out, so a test can interrupt an evaluation), `nan_loss_at_step=K` (poison a weight before step
    K's forward: the module refuses the NaN loss), `nan_grad_at_step=K` (NaN gradients in step K: the parameters
    turn NaN and `FiniteGuard` stops the run)."""

    def __init__(
        self,
        step_sleep_s: float = 0.0,
        nan_loss_at_step: int | None = None,
        nan_grad_at_step: int | None = None,
        eval_sleep_s: float = 0.0,
    ) -> None:
        self.step_sleep_s = float(step_sleep_s or 0.0)
        self.eval_sleep_s = float(eval_sleep_s or 0.0)
        self.nan_loss_at_step = nan_loss_at_step
        self.nan_grad_at_step = nan_grad_at_step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.nan_loss_at_step is not None and trainer.global_step + 1 == int(self.nan_loss_at_step):
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self.nan_grad_at_step is not None and trainer.global_step + 1 == int(self.nan_grad_at_step):
            for p in pl_module.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.eval_sleep_s and not trainer.sanity_checking:
            time.sleep(self.eval_sleep_s)
