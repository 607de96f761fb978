"""Efficiency callbacks: step time, tokens/s, share of time waiting for data, peak memory, parameters.

Step time is measured around each training batch with CUDA synchronised at both ends (otherwise it
measures kernel launches), excluding the first `warmup` steps; the median is reported. The wait between one
batch's end and the next batch's start is data loading: its share of wall-clock is `data_share`.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any

import pytorch_lightning as pl
import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


class EfficiencyMonitor(pl.Callback):
    def __init__(self, warmup_steps: int = 5) -> None:
        self.warmup_steps = warmup_steps
        self.step_times: list[float] = []
        self.data_waits: list[float] = []
        self.tokens_per_step: list[int] = []
        self._start = 0.0
        self._last_end: float | None = None
        self._seen = 0

    # -- timing ----------------------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._last_end = None

    def on_train_batch_start(self, trainer, pl_module, batch: dict[str, Any], batch_idx: int) -> None:
        _sync(pl_module.device)
        now = time.perf_counter()
        if self._last_end is not None and self._seen >= self.warmup_steps:
            self.data_waits.append(now - self._last_end)
        self._start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: dict[str, Any], batch_idx: int) -> None:
        _sync(pl_module.device)
        now = time.perf_counter()
        self._seen += 1
        if self._seen > self.warmup_steps:
            self.step_times.append(now - self._start)
            tokens = batch["input_ids"].numel() + (batch["input_ids_2"].numel() if "input_ids_2" in batch else 0)
            self.tokens_per_step.append(tokens * trainer.world_size)
        self._last_end = now

    def on_validation_start(self, trainer, pl_module) -> None:
        self._last_end = None  # validation time is not data wait

    # -- results ---------------------------------------------------------------------------------------
    def summary(self, pl_module: pl.LightningModule) -> dict[str, float | int | None]:
        median = statistics.median(self.step_times) if self.step_times else None
        tokens = statistics.median(self.tokens_per_step) if self.tokens_per_step else None
        busy = sum(self.step_times) + sum(self.data_waits)
        if pl_module.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        else:
            peak = process_peak_rss_mib()
        return {
            "step_time_median_s": median,
            "tokens_per_s": (tokens / median) if median and tokens else None,
            "data_share": (sum(self.data_waits) / busy) if busy > 0 else None,
            "peak_memory_mib": round(peak, 1),
            "peak_memory_kind": "cuda_max_allocated" if pl_module.device.type == "cuda" else "process_peak_rss",
            "params": sum(p.numel() for p in pl_module.parameters()),
        }

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stats = {f"efficiency/{k}": v for k, v in self.summary(pl_module).items() if isinstance(v, (int, float))}
        for logger in trainer.loggers:
            logger.log_metrics(stats, step=trainer.global_step)
