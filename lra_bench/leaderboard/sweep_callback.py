"""Hydra callbacks (registered under `hydra.callbacks` in conf/config.yaml).

`LeaderboardCallback`
* `on_job_end` (next to the job, on the SLURM node under submitit): when the job raised, make its `results.json` say
  so — what `train()` cannot record itself (a config error before the record existed, a record left at "running").
* `on_multirun_end` (once, where the sweep was launched): build the leaderboard in the sweep dir and log it to W&B
  when the sweep's runs do. Hydra skips it when any job failed, so `on_multirun_start` also registers an exit hook
  that builds the leaderboard — failures listed — in that case; the sweep still exits non-zero.

Light at import (no torch): Hydra instantiates callbacks in every process it starts.
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lra_bench.kit.plain import plain_dict
from lra_bench.kit.terminal import table_console
from lra_bench.leaderboard.wandb_log import log_to_wandb
from lra_bench.record import results
from lra_bench.record.builder import new_record


def _rank() -> int:
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def _select(config: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(config, key, default=None)
    except Exception:  # an interpolation that cannot resolve: leave the field empty
        return None


class LeaderboardCallback(Callback):
    def __init__(self, plots: bool = True, wandb: bool = True) -> None:
        self.plots = plots
        self.wandb = wandb
        self._sweep_dir: str | None = None
        self._wandb_cfg: dict[str, Any] | None = None
        self._pending = False

    # -- per job ------------------------------------------------------------------------------------------------
    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.status != JobStatus.FAILED or _rank() != 0:
            return

        output_dir = Path(str(config.hydra.runtime.output_dir))
        path = output_dir / results.FILENAME
        error = getattr(job_return, "_return_value", None)
        message = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        try:
            record = results.read_record(path) if path.exists() else None
        except (OSError, ValueError):
            record = None
        if record is not None and record.get("status") != "running":
            return  # train() recorded its own end
        if record is None:  # the same builder as the run's own records: one method, one leaderboard row
            record = new_record(config, output_dir).to_dict()
        record["status"], record["error"] = "failed", message
        record["run"]["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        results.write_atomic(path, record)

    # -- per sweep ----------------------------------------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_dir = str(config.hydra.sweep.dir)
        wandb_cfg = _select(config, "logger.wandb")
        self._wandb_cfg = plain_dict(wandb_cfg) if wandb_cfg is not None else None
        self._pending = True
        atexit.register(self._at_exit)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._pending = False
        self.build()

    def _at_exit(self) -> None:
        if self._pending:  # the sweep ended early, normally because a job failed
            self._pending = False
            self.build()

    def build(self) -> dict[str, Any] | None:
        """Build the leaderboard in the sweep dir; never raises (a sweep's results matter more than its table)."""
        if not self._sweep_dir or not Path(self._sweep_dir).is_dir():
            return None
        try:
            # the table's code (pandas, matplotlib) only when a sweep ends: this module loads in every job's process
            from lra_bench.leaderboard import build_leaderboard, render

            table = build_leaderboard([self._sweep_dir], out_dir=self._sweep_dir, plots=self.plots)
            render.print_summary(table["wide"], table["published"], table_console(highlight=False))  # the sweep's table
        except Exception as err:
            print(f"[lra-bench] leaderboard for {self._sweep_dir} failed: {type(err).__name__}: {err}", file=sys.stderr)
            return None
        print(
            f"[lra-bench] leaderboard: {table['markdown']} ({table['n_files']} results, "
            f"{len(table['failures'])} failed or unfinished)"
        )
        if self.wandb:
            self._log_wandb(table)
        return table

    def _log_wandb(self, table: dict[str, Any]) -> None:
        """The same W&B run as `python -m lra_bench.leaderboard DIR --wandb`, in the sweep's mode and group."""
        w = self._wandb_cfg or {}
        mode = os.environ.get("WANDB_MODE", w.get("mode") or "disabled")
        if not w.get("enabled") or mode not in ("online", "offline"):
            return

        log_to_wandb(table, mode=mode, project=w.get("project"), entity=w.get("entity"), group=w.get("group"))
