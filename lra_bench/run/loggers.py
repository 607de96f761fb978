"""Loggers: CSV always works; W&B offline by default (no account), its run id kept in the run dir so a
resumed or requeued job continues the same W&B run. The API key is never written anywhere by us."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, Logger

WANDB_ID_FILE = "wandb_id.txt"
os.environ.setdefault("WANDB_SILENT", "true")


def wandb_run_id(output_dir: Path) -> str | None:
    """The run dir's W&B id, created by rank 0 on first use (other DDP ranks never write it: they only read it,
    and their WandbLogger never starts a run anyway)."""
    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    path = output_dir / WANDB_ID_FILE
    if path.exists():
        return path.read_text().strip()
    if rank_zero_only.rank != 0:
        return None
    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id + "\n")
    return run_id


def build_loggers(cfg: DictConfig, output_dir: Path, run_name: str) -> tuple[list[Logger], str | None]:
    loggers: list[Logger] = []
    if cfg.logger.csv:
        loggers.append(CSVLogger(save_dir=str(output_dir), name="csv"))
    wandb_id = None
    w = cfg.logger.wandb
    mode = os.environ.get("WANDB_MODE", w.mode)
    if w.enabled and mode != "disabled":
        from pytorch_lightning.loggers import WandbLogger

        wandb_id = wandb_run_id(output_dir)
        config: Any = OmegaConf.to_container(cfg, resolve=True)
        loggers.append(
            WandbLogger(
                project=w.project,
                entity=w.entity,
                group=w.group,
                tags=list(w.tags),
                name=run_name,
                id=wandb_id,
                resume="allow",
                save_dir=str(output_dir),
                mode=mode,
                config=config,
            )
        )
    return loggers, wandb_id


def finish_wandb() -> None:
    """Close the W&B run so the next job of a multirun does not write into it.

    Never raises: this runs in `train()`'s `finally`, also when SLURM is stopping the job for a requeue (SIGTERM
    reaches W&B's service process too, so `finish()` may fail); an exception here would replace the job's own
    outcome — and a requeued submitit job that returns, instead of exiting, leaves a stale result for the sweep.
    """
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    except ImportError:
        pass
    except Exception as err:  # the W&B data written so far stays on disk; the run id is kept for the resume
        print(f"[lra-bench] wandb.finish() failed: {type(err).__name__}: {err}", file=sys.stderr)
