"""Efficiency callbacks: step time, tokens/s, share of time waiting for data, peak memory, parameters.

Step time is measured around each training batch with CUDA synchronised at both ends (otherwise it
measures kernel launches), excluding the first `warmup` steps; the median is reported. The wait between one
batch's end and the next batch's start is data loading: its share of wall-clock is `data_share`.

A resumed run merges its segments: the samples (step times, data waits, tokens per step) and the peak memory so
far travel in every checkpoint (`state_dict`), so the record of a run killed and resumed summarises all the steps
that made its weights, not only the last segment's. Each segment skips its own first `warmup` steps (a new process
warms up again). Steps re-run after a kill are measured once: the checkpoint holds the samples up to its step.
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
        self.earlier_peak_mib: float | None = None  # the peak of earlier segments (from the checkpoint)
        self.segments = 0  # earlier segments that contributed samples
        self._device: torch.device | None = None

    # -- checkpointed state (plain lists and numbers: weights-only loadable) --------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "step_times": list(self.step_times),
            "data_waits": list(self.data_waits),
            "tokens_per_step": list(self.tokens_per_step),
            "peak_memory_mib": self._peak_so_far(),
            "segments": self.segments + 1,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step_times = [float(x) for x in state_dict.get("step_times", [])]
        self.data_waits = [float(x) for x in state_dict.get("data_waits", [])]
        self.tokens_per_step = [int(x) for x in state_dict.get("tokens_per_step", [])]
        peak = state_dict.get("peak_memory_mib")
        self.earlier_peak_mib = None if peak is None else float(peak)
        self.segments = int(state_dict.get("segments", 0))

    def _peak_so_far(self) -> float | None:
        current = self._device_peak
        peaks = [p for p in (self.earlier_peak_mib, current) if p is not None]
        return max(peaks) if peaks else None

    @property
    def _device_peak(self) -> float | None:
        """This process's peak since training started (CUDA: max allocated; CPU: peak RSS), in MiB."""
        if self._device is None:
            return None
        if self._device.type == "cuda":
            return torch.cuda.max_memory_allocated(self._device) / 2**20
        return process_peak_rss_mib()

    # -- timing ----------------------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._device = pl_module.device
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self._last_end = None
        self._seen = 0  # every segment warms up anew

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
        self._device = self._device or pl_module.device
        peak = self._peak_so_far() or 0.0
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
