"""What both stages that run a Trainer (`train`, `evaluation`) build the same way: the LightningModule, the
Trainer's arguments and plugins, and the data on every rank.

Why a module of its own: evaluation used to import these from `train`, private helpers included, which tied the two
stages into an import cycle; both now import them from here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
from omegaconf import DictConfig
from pytorch_lightning.plugins.environments import SLURMEnvironment

from lra_bench.config.plain import plain_dict
from lra_bench.run import pretrain
from lra_bench.run.build import build_model
from lra_bench.run.module import LRAModule
from lra_bench.run.pretrained import PretrainedSource, load_encoder
from models.heads import LanguageModel


def build_module(
    cfg: DictConfig, dm: Any, source: PretrainedSource | None = None, pretrain_info: dict[str, Any] | None = None
) -> pl.LightningModule:
    """The network `cfg` describes in its training wrapper: the LM objective for `stage=pretrain`
    (`pretrain_info` given), else the classifier, with a pretrained encoder when `source` is given."""
    model = build_model(cfg, dm)
    if pretrain_info is not None:  # stage=pretrain: the LM objective (lra_bench.run.pretrain)
        if not isinstance(model, LanguageModel):
            raise TypeError(f"stage=pretrain built a {type(model).__name__}, not a LanguageModel")
        return pretrain.build_pretrain_module(cfg, dm, model, {k: v for k, v in pretrain_info.items() if k != "curve"})
    if isinstance(model, LanguageModel):
        raise TypeError("a LanguageModel outside stage=pretrain")
    if source is not None:  # pretrained=: the pretrained encoder, a fresh head (lra_bench.run.pretrained)
        load_encoder(model, source)
    return LRAModule(model, dm.num_classes, plain_dict(cfg.optim), int(cfg.trainer.max_steps))


def trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    kwargs = plain_dict(cfg.trainer)
    kwargs["gradient_clip_val"] = cfg.optim.grad_clip_val
    kwargs["gradient_clip_algorithm"] = cfg.optim.grad_clip_algorithm
    return kwargs


def slurm_plugins() -> list[Any]:
    """Under SLURM exactly one component owns requeueing: submitit (or the user's sbatch), not Lightning.

    Lightning would otherwise pick `SLURMEnvironment(auto_requeue=True)` by itself (a SIGUSR1 handler that
    requeues, and a SIGTERM bypass) whenever the job runs under srun. Lightning's plain SIGTERM notifier stays:
    it only stops training at the next step boundary.
    """
    if "SLURM_JOB_ID" not in os.environ:
        return []
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def launch_token() -> str:
    """The same string on every rank of one launch (srun tasks, or ddp children of one parent), new per launch."""
    if "SLURM_JOB_ID" in os.environ:
        return f"slurm-{os.environ['SLURM_JOB_ID']}-{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    return f"pid-{os.getppid() if os.environ.get('LOCAL_RANK', '0') != '0' else os.getpid()}"


def prepare_data(dm: Any, output_dir: Path, is_zero: bool, timeout_s: float = 6 * 3600) -> None:
    """Rank 0 generates/caches the data; other ranks wait for its marker, then load the cache (no races)."""
    marker = output_dir / ".data-ready"
    token = launch_token()
    if is_zero:
        dm.prepare_data()
        dm.setup()
        marker.write_text(token + "\n")
        return
    deadline = time.monotonic() + timeout_s
    while not (marker.exists() and marker.read_text().strip() == token):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not prepare the data within {timeout_s:.0f}s ({marker})")
        time.sleep(1.0)
    dm.setup()


def majority_share(dm: Any) -> float | None:
    """The share of the validation split's most common label: the accuracy a constant guess gets."""
    split = dm.splits.get("val")
    if split is None or len(split) == 0:
        return None
    _, counts = np.unique(np.asarray(split.table["label"]), return_counts=True)
    return float(counts.max() / counts.sum())
