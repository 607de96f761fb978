"""Self-pretraining: the `stage=pretrain` stage, the `stage=spt` plan (pretrain, then fine-tune, in one job), and a
fine-tune's start from a pretraining run (`pretrained=<run dir or .ckpt>`: `load_encoder`).

Amos, Berant & Gupta, "Never Train from Scratch" (ICLR 2024, arXiv 2310.02980): pretraining on the downstream task's
own training inputs with a denoising objective, then fine-tuning, closes most of the gap between architectures that
training from scratch shows on LRA. Here a pretraining run is an ordinary run — its own run dir, checkpoints, resume,
record — with three differences, all decided in this module:

* data: `tasks.masking.PretrainingData` (train split only, masked or shifted targets, no labels);
* network: the same encoder (with one more embedding row, the mask token, for `mlm`) under
  `models.heads.LanguageModel`'s per-token head; `causal` switches every attention into its causal mode;
* module: `PretrainModule` — masked cross-entropy over the vocabulary (`spt.loss=ce`), or L1 on the pixel value
  scaled to [0, 1] (`spt.loss=l1`, the paper's code for Image); `val/acc` is the accuracy on the targets of a
  held-out slice of the training split. Its curve is checkpointed, so a resumed run reports it whole.

The stage keys are checked and `pretraining` (none | mlm | causal, which keeps self-pretrained rows apart from scratch
rows in every comparison) derived below the run, in `lra_bench.config.stages`, which also plans `stage=spt`.

`stage=spt` (`python run.py experiment=spt/<task>`) is two ordinary stages, each with its own dir, lock, checkpoints
and record (`lra_bench.run.entry.run_stage` runs the plan `lra_bench.config.stages.plan` returns):

    <run dir>/pretrain/   stage=pretrain on the task's training inputs      (this config ⊕ `spt.pretrain`)
    <run dir>/finetune/   stage=supervised, pretrained=<run dir>/pretrain   (this config)

One Hydra job rather than a driver that launches two: the job is then like every other (`-m` sweeps, the SLURM
launcher, requeueing, the end-of-sweep leaderboard), and its stages can never be paired with the wrong partner.
Re-running the command skips a pretraining stage whose record is `completed` with the same configuration, and
otherwise resumes it; the fine-tune then resumes from its own `last.ckpt`. A completed pretraining stage whose
configuration has since changed is refused with the keys that differ (its fine-tunes would mix two recipes).

A fine-tune takes over the encoder — embeddings (the mask token's row included), every block (selector state such as
GPA's codebook is a buffer inside its block), the final norm — with a fresh task head, optimiser, schedule and step
count, as IdoAmos/not-from-scratch@f919137 (`train.py::load_pretrained_model`: every weight but the decoder, then a
new run). Unlike theirs (`strict=False`, then a tolerance check), loading here is strict: the encoder's tensors are
copied exactly, or the run stops with one line. Which run `pretrained=` names, and the checks on it, come before
anything is built (`lra_bench.config.pretrained_run`).
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from pytorch_lightning.utilities.types import OptimizerLRSchedulerConfig
from torchmetrics import MeanMetric

from lra_bench.config.pretrained_run import PretrainedSource
from lra_bench.errors import ConfigError
from lra_bench.kit.plain import plain_dict
from lra_bench.record.checkpoint_file import load_checkpoint
from lra_bench.run.module import adamw_with_schedule
from models.attention.base import Attention
from models.heads import LanguageModel, TaskNetwork
from tasks.masking import IGNORE_INDEX, PretrainingData

CURVE_KEY = "spt_curve"  # where the curve lives in a checkpoint
STAGE_KEY = "spt_stage"  # what a pretraining checkpoint says about itself
ENCODER_PREFIX = "model.encoder."  # the encoder's keys in a LightningModule's state_dict (`self.model.encoder`)


# -- data and network -------------------------------------------------------------------------------------------
def pretraining_data(cfg: DictConfig, task: Any) -> PretrainingData:
    return PretrainingData(
        task, str(cfg.objective), float(cfg.spt.mask_ratio), float(cfg.spt.holdout_fraction), int(cfg.seed)
    )


def language_model(cfg: DictConfig, network: TaskNetwork, dm: PretrainingData) -> LanguageModel:
    """The pretraining network around a classifier's encoder (its head is dropped): per-token logits over the
    task's vocabulary (the mask id is never a target) or one value per position (`spt.loss=l1`)."""
    outputs = 1 if str(cfg.spt.loss) == "l1" else dm.task.vocab_size
    model = LanguageModel(network.encoder, int(cfg.model.dim), outputs)
    causal = str(cfg.objective) == "causal"
    for attention in (m for m in model.modules() if isinstance(m, Attention)):
        attention.set_causal(causal)
    return model


# -- the LightningModule ----------------------------------------------------------------------------------------
def token_loss(out: torch.Tensor, target: torch.Tensor, loss: str, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, correct) over the positions with a target: mean cross-entropy / L1, and per-target 0/1 correctness.

    With no target in the batch the loss is a zero that keeps the graph (no NaN, no step) and `correct` is empty.
    """
    valid = target != IGNORE_INDEX
    wanted = target[valid]
    if loss == "l1":
        pred = out[..., 0][valid].float()
        value = wanted.float() / scale
        loss_value = (pred - value).abs().mean() if wanted.numel() else out.sum() * 0.0
        correct = (pred * scale).round().clamp(0, scale) == wanted.float()
    else:
        logits = out[valid].float()
        loss_value = F.cross_entropy(logits, wanted) if wanted.numel() else out.sum() * 0.0
        correct = logits.argmax(-1) == wanted
    return loss_value, correct


class PretrainModule(pl.LightningModule):
    """Denoising / next-token training of a `LanguageModel`; the same optimiser and schedule as the supervised
    module (`adamw_with_schedule`)."""

    window: torch.Tensor

    def __init__(
        self, model: LanguageModel, loss: str, vocab_size: int, optim: dict[str, Any], max_steps: int, info: dict
    ) -> None:
        super().__init__()
        self.model, self.loss_kind = model, loss
        self.scale = float(vocab_size - 1)  # l1: pixel value v ↦ v / 255
        self.optim_cfg, self.max_steps = dict(optim), max_steps
        self.info = dict(info)  # what a checkpoint of this stage says about itself (see STAGE_KEY)
        self.train_loss, self.train_acc = MeanMetric(), MeanMetric()
        self.val_loss, self.val_acc = MeanMetric(), MeanMetric()
        self.curve: list[dict[str, Any]] = []
        self.register_buffer("window", torch.zeros(3, dtype=torch.float64), persistent=False)  # Σloss·n, Σcorrect, n

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch)

    def _step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return token_loss(self(batch), batch["target"], self.loss_kind, self.scale)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, correct = self._step(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"loss is {loss.item()} at step {self.global_step}; stopping (last good checkpoint kept)"
            )
        n = correct.numel()
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True)
        if n:
            self.train_loss.update(loss.detach(), weight=n)
            self.train_acc.update(correct.float().mean(), weight=n)
            self.window += torch.stack(
                [loss.detach().double() * n, correct.sum().double(), torch.tensor(float(n), device=self.device)]
            )
            self.log("train/acc", correct.float().mean(), on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, correct = self._step(batch)
        n = correct.numel()
        if n:
            self.val_loss.update(loss, weight=n)
            self.val_acc.update(correct.float().mean(), weight=n)

    def on_validation_epoch_end(self) -> None:
        val_loss, val_acc = float(self.val_loss.compute()), float(self.val_acc.compute())
        self.val_loss.reset()
        self.val_acc.reset()
        self.log("val/loss", val_loss, prog_bar=False)
        self.log("val/acc", val_acc, prog_bar=True)
        if self.trainer.sanity_checking:
            return
        total, correct, n = self.window.tolist()
        self.curve.append(
            {
                "step": int(self.global_step),
                "train_loss": total / n if n else None,
                "train_acc": correct / n if n else None,
                "val_loss": val_loss,
                "val_acc": val_acc,
            }
        )
        self.window.zero_()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CURVE_KEY] = {"points": list(self.curve), "window": self.window.tolist()}
        checkpoint[STAGE_KEY] = dict(self.info)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(CURVE_KEY) or {}
        self.curve = list(saved.get("points", []))
        if saved.get("window"):
            self.window.copy_(torch.tensor(saved["window"], dtype=torch.float64))

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        return adamw_with_schedule(self.parameters(), self.optim_cfg, self.max_steps)


def stage_info(cfg: DictConfig, dm: PretrainingData) -> dict[str, Any]:
    """The record's `pretrain` section at start (the curve and final numbers are added when training ends)."""
    mlm = str(cfg.objective) == "mlm"
    return {
        "objective": str(cfg.objective),
        "mask_ratio": float(cfg.spt.mask_ratio) if mlm else None,
        "mask_id": dm.mask_id if mlm else None,
        "loss": str(cfg.spt.loss),
        "holdout_fraction": float(cfg.spt.holdout_fraction),
        "curve": [],
        "best_val_acc": None,
        "final": None,
    }


def build_pretrain_module(cfg: DictConfig, dm: PretrainingData, model: LanguageModel, info: dict) -> PretrainModule:
    optim, steps = plain_dict(cfg.optim), int(cfg.trainer.max_steps)
    return PretrainModule(model, str(cfg.spt.loss), dm.task.vocab_size, optim, steps, info)


def load_encoder(network: TaskNetwork, source: PretrainedSource) -> int:
    """Copy the pretrained encoder into `network.encoder` exactly (strict); return the number of tensors copied."""
    checkpoint = load_checkpoint(source.checkpoint)
    if STAGE_KEY not in checkpoint:
        raise ConfigError(f"pretrained={source.value}: {source.checkpoint} is not a self-pretraining checkpoint")
    state = checkpoint["state_dict"]
    encoder = {k[len(ENCODER_PREFIX) :]: v for k, v in state.items() if k.startswith(ENCODER_PREFIX)}
    try:
        network.encoder.load_state_dict(encoder, strict=True)
    except RuntimeError as err:
        first = " ".join(str(err).split())[:300]
        raise ConfigError(f"pretrained={source.value}: its encoder tensors do not fit this network ({first})") from None
    return len(encoder)


def final_section(info: dict[str, Any], best_val_acc: float | None, module: PretrainModule) -> dict[str, Any]:
    """The record's `pretrain` section at the end of the stage: `info` with the curve, the best masked-token
    validation accuracy and the final point. Its metrics are not classification accuracies, so the stage's record
    leaves `metrics.val_acc`/`test_acc` null (no table can mistake a masked-token accuracy for a task score)."""
    final = module.curve[-1] if module.curve else None  # the state `pretrained=<run dir>` loads
    return {**info, "curve": list(module.curve), "best_val_acc": best_val_acc, "final": final}
