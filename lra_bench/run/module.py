"""The one LightningModule: a classifier, cross-entropy, accuracy per stage, AdamW with warm-up + decay."""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.utilities.types import OptimizerLRSchedulerConfig
from torch import nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy


def lr_lambda(schedule: str, warmup: int, total: int):
    """Multiplier on the base lr at optimizer step `s`: linear warm-up, then linear/cosine decay or constant.

    `rsqrt` is the LRA JAX schedule `constant · linear_warmup · rsqrt_decay`: base · min(1, s/w) / √max(s, w),
    so its base lr is the JAX config's (0.05), not a peak.
    """

    def factor(step: int) -> float:
        if schedule == "rsqrt":
            s = step + 1
            return min(1.0, s / max(warmup, 1)) / math.sqrt(max(s, warmup, 1))
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(0.0, 1.0 - progress)

    return factor


class LRAModule(pl.LightningModule):
    def __init__(self, model: nn.Module, num_classes: int, optim: dict[str, Any], max_steps: int) -> None:
        super().__init__()
        self.model = model
        self.optim_cfg, self.max_steps = dict(optim), max_steps
        self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # in the checkpoint: a resumed run keeps its best, not a fresh -inf

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch)

    def _step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each example's loss and prediction: every stage's means are over examples, never over batch means."""
        logits = self(batch)
        return F.cross_entropy(logits.float(), batch["label"], reduction="none"), logits.argmax(-1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        losses, preds = self._step(batch)
        loss = losses.mean()
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"loss is {loss.item()} at step {self.global_step}; stopping (last good checkpoint kept)"
            )
        self.train_loss(loss)
        self.train_acc(preds, batch["label"])
        self.log("train/loss", self.train_loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=True, on_epoch=False, prog_bar=False)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        losses, preds = self._step(batch)
        self.val_loss(losses)
        self.val_acc(preds, batch["label"])
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint from before `val_acc_best` was saved: start it from the best score the checkpoint holds."""
        state = checkpoint.get("state_dict", {})
        if "val_acc_best.max_value" not in state:
            scores = [
                v.get("best_model_score")
                for k, v in checkpoint.get("callbacks", {}).items()
                if isinstance(v, dict) and "ModelCheckpoint" in str(k)
            ]
            best = next((float(s) for s in scores if s is not None), float("-inf"))
            state["val_acc_best.max_value"] = torch.tensor(best)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        """Also returns each example's prediction and loss: `lra_bench.run.recorder` keeps them per example."""
        losses, preds = self._step(batch)
        self.test_loss(losses)  # per example: a short last batch weighs its examples, not a whole batch
        self.test_acc(preds, batch["label"])
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True)
        return {"pred": preds.detach(), "loss": losses.detach()}

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        return adamw_with_schedule(self.parameters(), self.optim_cfg, self.max_steps)


def onecycle_phases(warmup: int, max_steps: int) -> tuple[int, float]:
    """`(total_steps, pct_start)` for `optim.schedule=onecycle`: the Nyströmformer reference's
    `OneCycleLR(total_steps=num_train_steps, pct_start=warmup / num_train_steps)` wherever torch can run it.

    Torch's warm-up phase runs from step 0 to `pct_start·total − 1` (= warmup − 1) and its decay from there to
    `total − 1`; an empty phase divides by zero. Two cases the reference never meets get the nearest schedule torch
    can run: a warm-up of 1 step (peak at step 0) runs as none (0: the lr starts at the peak and anneals), and a
    warm-up as long as the run or longer (a run shrunk by hand, which `warmup_warning` already flags) runs the
    reference's warm-up ramp and is cut by the run's end — the schedule is built for `warmup + 2` steps, so the decay
    phase is never reached.
    """
    if warmup <= 1:
        return max_steps, 0.0
    total = max(max_steps, warmup + 2)
    return total, warmup / total


def adamw_with_schedule(params: Any, o: dict[str, Any], max_steps: int) -> OptimizerLRSchedulerConfig:
    """AdamW and its per-step schedule from the `optim` node (shared by every stage's LightningModule).

    `onecycle` is torch's `OneCycleLR` with the Nyströmformer reference's arguments (mlpen/Nystromformer
    LRA/code/run_tasks.py): lr/25 → lr linearly over the warm-up, then linearly to lr/25/1e4 at `max_steps`, and
    β1 (it overrides `betas[0]`) 0.95 → 0.85 → 0.95 over the same two phases. The others are a `LambdaLR`
    (`lr_lambda`) with β1 fixed.
    """
    optimizer = torch.optim.AdamW(
        params,
        lr=o["lr"],
        betas=tuple(o.get("betas", (0.9, 0.999))),
        eps=o.get("eps", 1e-6),
        weight_decay=o.get("weight_decay", 0.0),
    )
    name, warmup = o.get("schedule", "linear"), int(o.get("warmup_steps", 0) or 0)
    scheduler: torch.optim.lr_scheduler.LRScheduler
    if name == "onecycle":
        total, pct_start = onecycle_phases(warmup, max_steps)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=o["lr"],
            total_steps=total,
            pct_start=pct_start,
            anneal_strategy="linear",
            cycle_momentum=True,
            base_momentum=0.85,
            max_momentum=0.95,
            div_factor=25.0,
            final_div_factor=1e4,
            three_phase=False,
        )
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(name, warmup, max_steps))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
