"""Loggers: CSV always works; W&B offline by default (no account), its run id kept in the run dir so a
resumed or requeued job continues the same W&B run. The API key is never written anywhere by us.

`RunWandbLogger` differs from Lightning's `WandbLogger` in two ways, both for resumed and signalled runs:

* W&B's `_step` is the trainer's step (`wandb.log(..., step=step)`), not W&B's per-process row counter. A resumed
  run writes a second `offline-run-*` part with the same run id (wandb 0.31 offline mode cannot resume a run by
  itself, and restarts its counter at 0, which the server would drop as going backwards); with the trainer's step
  the parts' steps continue each other, and `wandb sync --id <id> <run dir>/wandb/offline-run-*` uploads them, in
  start order, as one run (README, "Where things live").
* A W&B service that died does not stop training. SLURM sends its SIGTERM to every process of a job, `wandb-core`
  included, which exits at once (inherited SIG_IGN does not protect it: Go re-installs its own SIGTERM handler) and
  without flushing its transaction log; the next `wandb.log` then raised and the job ended without saving at the
  signal. Now the first failure prints one warning and W&B logging stops for this process (CSV continues), and the
  log is flushed every second (`wandb_settings`), so the stopped attempt keeps all but its last second of W&B rows.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_fabric.utilities.logger import _add_prefix  # the prefixing WandbLogger.log_metrics itself uses
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger

WANDB_ID_FILE = "wandb_id.txt"
os.environ.setdefault("WANDB_SILENT", "true")


def wandb_run_id(output_dir: Path) -> str | None:
    """The run dir's W&B id, created by rank 0 on first use (other DDP ranks never write it: they only read it,
    and their WandbLogger never starts a run anyway)."""
    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    path = output_dir / WANDB_ID_FILE
    if path.exists():
        return path.read_text().strip()
    if getattr(rank_zero_only, "rank", 0) != 0:
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
        wandb_id = wandb_run_id(output_dir)
        config: Any = OmegaConf.to_container(cfg, resolve=True)
        loggers.append(
            RunWandbLogger(
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
                **wandb_settings(),
            )
        )
    return loggers, wandb_id


#: seconds between W&B's writes of its transaction log (wandb's default: 15 s)
WANDB_FLUSH_INTERVAL_S = 1.0


def wandb_settings() -> dict[str, Any]:
    """Flush W&B's offline transaction log every second instead of every 15 s: a service killed by the job's
    SIGTERM (SLURM signals every process of a job) then loses at most its last second of rows, not 15 s of them.
    (Only for wandb versions that have the setting.)"""
    import wandb

    if "x_transaction_log_flush_interval" not in getattr(wandb.Settings, "model_fields", {}):
        return {}
    return {"settings": wandb.Settings(x_transaction_log_flush_interval=WANDB_FLUSH_INTERVAL_S)}


class RunWandbLogger(WandbLogger):
    """Lightning's W&B logger with the trainer's step as W&B's step, and a dead service tolerated (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("anonymous") is None:  # Lightning passes `anonymous=None` to wandb.init, and wandb warns "The
            self._wandb_init.pop("anonymous", None)  # anonymous setting has no effect" on every run when it is set
        self.failure: str | None = None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.failure is not None:
            return
        try:
            if step is None:
                super().log_metrics(metrics)
                return
            prefixed = _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
            self.experiment.log(dict(prefixed, **{"trainer/global_step": step}), step=int(step))
        except Exception as err:  # the service is gone (a signal, a crash): training and CSV logging go on
            self.failure = f"{type(err).__name__}: {err}"
            print(
                f"[lra-bench] W&B logging stopped at step {step} ({self.failure}); CSV logging continues, the W&B "
                "data written so far stays on disk",
                file=sys.stderr,
                flush=True,
            )


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
        try:  # a dead service: W&B's own atexit teardown would print a traceback at exit; unhook it now
            wandb.teardown()
        except Exception:
            pass
