"""What a run measures and where its metrics go: the efficiency callback (`EfficiencyMonitor`: step time, tokens/s,
share of time waiting for data, peak memory, parameters) and the loggers (CSV, W&B).

Step time is measured around each training batch with CUDA synchronised at both ends (otherwise it measures kernel
launches), excluding each process's first `warmup` steps; the median is reported, with how much to trust it:
`timed_steps`, `step_time_iqr_s` (the spread) and `load_avg_1m` (the machine's load at the timed steps: a busy
machine slows every step). The wait between one batch's end and the next batch's start is data loading, `data_share`.

A resumed run merges its segments: the samples and the peak memory so far travel in every checkpoint (`state_dict`),
so the record of a run killed and resumed summarises all the steps that made its weights (steps re-run after a kill
are measured once). Samples travel with the machine they were timed on (`env.hardware`, as `compare` matches it): a
run resumed on another machine drops the earlier segments' timing samples and says so, since a median over two
machines would belong to neither. The peak memory is kept: it is the run's, wherever it was reached.

Peak memory is this run's own, not the process's: under Hydra's basic launcher every job of a sweep trains in one
process, whose lifetime peak (`ru_maxrss`) only rises. On CUDA the allocator's peak is reset at the start of training
(`cuda_max_allocated`). On CPU the heap a previous job freed is handed back to the kernel (`lra_bench.memory.settle`)
and the kernel's high-water mark of the resident set is reset (`/proc/self/clear_refs` ← 5, Linux >= 4.0:
`rss_hwm_since_train_start`); where that is not available the resident set is sampled after every step
(`rss_sampled_at_steps`: a peak inside a step can be missed).

Loggers: CSV always; W&B offline by default (no account), its run id kept in the run dir so a resumed or requeued job
continues the same W&B run. The API key is never written anywhere by us. `RunWandbLogger` differs from Lightning's
`WandbLogger` in two ways, both for resumed and signalled runs:

* W&B's `_step` is the trainer's step, not W&B's per-process row counter: a resumed run writes a second
  `offline-run-*` part with the same run id (wandb 0.31 offline cannot resume a run, and restarts its counter at 0,
  which the server would drop as going backwards); with the trainer's step the parts continue each other, and
  `wandb sync --id <id> <run dir>/wandb/offline-run-*` uploads them as one run (README, "Where things live").
* A W&B service that died does not stop training. SLURM sends its SIGTERM to every process of a job, `wandb-core`
  included, which exits at once without flushing; the next `wandb.log` then raised and the job ended without saving
  at the signal. Now the first failure prints one warning and W&B logging stops for this process (CSV continues),
  and the log is flushed every second (`wandb_settings`), so a stopped attempt loses at most its last second of rows.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.logger import _add_prefix  # the prefixing WandbLogger.log_metrics itself uses
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench.memory import CLEAR_REFS, settle, status_kib
from lra_bench.record.provenance import hardware

CUDA_PEAK = "cuda_max_allocated"
RSS_HWM = "rss_hwm_since_train_start"
RSS_SAMPLED = "rss_sampled_at_steps"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- CPU memory (the probes of the attention benchmark, `lra_bench.memory`) --------------------------------------------
def _status_mib(field: str) -> float | None:
    kib = status_kib(field)
    return None if kib is None else kib / 1024


def reset_rss_peak() -> bool:
    """Reset the kernel's high-water mark of this process's resident set (VmHWM) to its current size.

    Whether it worked: the write is refused before Linux 4.0 (or where /proc is read-only), and afterwards VmHWM
    must not exceed VmRSS (it is the current size right after a reset)."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    hwm, rss = _status_mib("VmHWM"), _status_mib("VmRSS")
    return hwm is not None and rss is not None and hwm <= rss + 1.0  # (the page or two touched in between)


def current_rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def load_average_1m() -> float | None:
    """The machine's 1-minute load average (None where the platform has none)."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


def interquartile_range(values: list[float]) -> float | None:
    """Q3 − Q1 with linear interpolation between order statistics (numpy's default); None below two values."""
    if len(values) < 2:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


#: the per-step samples a checkpoint carries, and their type
SAMPLES: dict[str, type] = {"step_times": float, "data_waits": float, "tokens_per_step": int, "load_samples": float}


class EfficiencyMonitor(pl.Callback):
    def __init__(self, warmup_steps: int = 5) -> None:
        self.warmup_steps = warmup_steps
        self.step_times: list[float] = []
        self.data_waits: list[float] = []
        self.tokens_per_step: list[int] = []
        self.load_samples: list[float] = []  # 1-minute load average at each timed step (where there is one)
        self._start = 0.0
        self._last_end: float | None = None
        self._seen = 0
        self.earlier_peak_mib: float | None = None  # the peak of earlier segments (from the checkpoint)
        self.segments = 0  # earlier segments that contributed samples
        self._device: torch.device | None = None
        self.peak_kind: str | None = None  # how this segment's peak is measured (set at train start)
        self._sampled_peak_mib: float | None = None  # RSS_SAMPLED: the largest resident set seen after a step

    # -- checkpointed state (plain lists and numbers: weights-only loadable) --------------------------------------
    def state_dict(self) -> dict[str, Any]:
        samples = {name: list(getattr(self, name)) for name in SAMPLES}
        # `machine`: what the samples were timed on (the record's env.hardware)
        return {**samples, "peak_memory_mib": self._peak_so_far(), "segments": self.segments + 1, "machine": hardware()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, kind in SAMPLES.items():
            setattr(self, name, [kind(x) for x in state_dict.get(name, [])])
        peak = state_dict.get("peak_memory_mib")
        self.earlier_peak_mib = None if peak is None else float(peak)
        self.segments = int(state_dict.get("segments", 0))
        timed_on = state_dict.get("machine")  # absent in checkpoints written before it was kept
        if isinstance(timed_on, str):  # one commit (48709bd) kept it as canonical JSON; a committed snapshot has it
            timed_on = json.loads(timed_on)
        if timed_on is not None and timed_on != hardware():
            print(
                f"[lra-bench] the checkpoint's {len(self.step_times)} step times were taken on another machine "
                f"({timed_on}): this run's speed is timed from this segment only",
                flush=True,
            )
            for name in SAMPLES:
                setattr(self, name, [])

    def _peak_so_far(self) -> float | None:
        peaks = [p for p in (self.earlier_peak_mib, self._segment_peak) if p is not None]
        return max(peaks) if peaks else None

    @property
    def _segment_peak(self) -> float | None:
        """This run's peak since training started in this process (see the module docstring), in MiB."""
        if self._device is None:
            return None
        if self.peak_kind == CUDA_PEAK:
            return torch.cuda.max_memory_allocated(self._device) / 2**20
        if self.peak_kind == RSS_HWM:
            return _status_mib("VmHWM")
        return self._sampled_peak_mib

    def _start_peak(self, device: torch.device) -> None:
        """Start this run's peak at the current usage (see the module docstring for the kinds)."""
        self._device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.peak_kind = CUDA_PEAK
            return
        settle(device)  # garbage collected, freed heap handed back: what an earlier job freed is not counted
        self.peak_kind = RSS_HWM if reset_rss_peak() else RSS_SAMPLED
        self._sampled_peak_mib = current_rss_mib()

    # -- timing ----------------------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start_peak(pl_module.device)
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
            if (load := load_average_1m()) is not None:
                self.load_samples.append(load)
        if self.peak_kind == RSS_SAMPLED:
            self._sampled_peak_mib = max(self._sampled_peak_mib or 0.0, current_rss_mib())
        self._last_end = time.perf_counter()  # (the samples above are not data wait)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._last_end = None  # validation time is not data wait

    # -- results ---------------------------------------------------------------------------------------
    def summary(self, pl_module: pl.LightningModule) -> dict[str, float | int | str | None]:
        median = statistics.median(self.step_times) if self.step_times else None
        tokens = statistics.median(self.tokens_per_step) if self.tokens_per_step else None
        busy = sum(self.step_times) + sum(self.data_waits)
        self._device = self._device or pl_module.device
        peak = self._peak_so_far() or 0.0
        return {
            "step_time_median_s": median,
            "timed_steps": len(self.step_times),
            "step_time_iqr_s": interquartile_range(self.step_times),
            "load_avg_1m": statistics.fmean(self.load_samples) if self.load_samples else None,
            "tokens_per_s": (tokens / median) if median and tokens else None,
            "data_share": (sum(self.data_waits) / busy) if busy > 0 else None,
            "peak_memory_mib": round(peak, 1),
            "peak_memory_kind": self.peak_kind,
            "params": sum(p.numel() for p in pl_module.parameters()),
        }

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stats = {f"efficiency/{k}": v for k, v in self.summary(pl_module).items() if isinstance(v, (int, float))}
        for logger in trainer.loggers:
            logger.log_metrics(stats, step=trainer.global_step)


WANDB_ID_FILE = "wandb_id.txt"
os.environ.setdefault("WANDB_SILENT", "true")


def wandb_run_id(output_dir: Path) -> str | None:
    """The run dir's W&B id, created by rank 0 on first use (other DDP ranks never write it: they only read it,
    and their WandbLogger never starts a run anyway)."""
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
    import wandb  # only for a run that logs to W&B: slow to import, and optional

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
        import wandb  # (see `wandb_settings`)

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
