"""Refuse schedules that cannot train or cannot produce the record's numbers, before any step is taken.

A record says `completed` only when every planned step ran and the best-val checkpoint was tested. So a run is
refused (one line with the split size, the batch and the steps) when the train split gives no optimizer step per
epoch (a batch larger than the split: Lightning would "finish" with 0 steps), when no validation would run before
`trainer.max_steps` (no best-val checkpoint to test), or when a split it needs is empty. After training,
`check_steps_ran` turns a fit that returned early into a failure instead of a completion.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from lra_bench.errors import ConfigError


def _size(dm: Any, split: str) -> int:
    data = dm.splits.get(split)
    return 0 if data is None else len(data)


def validation_interval(cfg: DictConfig, batches_per_epoch: int) -> int:
    """Training batches between validations (`trainer.val_check_interval`: batches, or a fraction of an epoch)."""
    value = cfg.trainer.get("val_check_interval", 1.0)
    if isinstance(value, float) and value <= 1.0:
        return max(1, int(batches_per_epoch * value))
    return int(value)


def check_schedule(cfg: DictConfig, dm: Any) -> None:
    """Raise `ConfigError` when the planned schedule cannot run as the record will describe it."""
    train_n, batch = _size(dm, "train"), int(cfg.data.batch_size)
    accumulate = int(cfg.trainer.get("accumulate_grad_batches", 1) or 1)
    max_steps = int(cfg.trainer.max_steps)
    steps_per_epoch = (train_n // batch) // accumulate
    if steps_per_epoch == 0:
        raise ConfigError(
            f"the train split has {train_n} examples: with data.batch_size={batch}"
            + (f" and trainer.accumulate_grad_batches={accumulate}" if accumulate > 1 else "")
            + f" that is 0 optimizer steps per epoch, so none of trainer.max_steps={max_steps} can run; use "
            f"data.batch_size <= {train_n // accumulate if accumulate > 1 else train_n}"
        )
    if cfg.train and _size(dm, "val") == 0:
        raise ConfigError(f"the val split is empty ({dm.name}): no best-val checkpoint to test; check the data")
    limit = cfg.trainer.get("limit_val_batches", 1.0)
    if cfg.train and limit is not None and float(limit) == 0:
        raise ConfigError(
            "trainer.limit_val_batches=0: no validation runs, so there is no best-val checkpoint to test; "
            "use a positive value"
        )
    interval = validation_interval(cfg, train_n // batch)
    if cfg.train and interval > max_steps * accumulate:
        raise ConfigError(
            f"trainer.val_check_interval={cfg.trainer.val_check_interval} ({interval} steps) > "
            f"trainer.max_steps={max_steps}: no validation would run, so there is no best-val checkpoint to test; "
            f"use trainer.val_check_interval <= {max_steps}"
        )
    tests = cfg.test and cfg.get("stage", "train") != "pretrain"  # a pretraining stage never tests
    if tests and _size(dm, "test") == 0:
        raise ConfigError(f"test=true but the test split is empty ({dm.name}); check the data or set test=false")


def check_steps_ran(trained: int, planned: int) -> None:
    """A fit that returned before `planned` steps is a failure, never a completion."""
    if trained < planned:
        raise RuntimeError(
            f"training stopped after {trained} of trainer.max_steps={planned} planned steps; "
            "re-running the same command resumes"
        )


def warmup_warning(cfg: DictConfig) -> str | None:
    """One line when the learning rate never reaches `optim.lr`: `optim.warmup_steps >= trainer.max_steps`.

    Every schedule (`lra_bench.run.module.adamw_with_schedule`, `onecycle` included) reaches its peak at the end of
    the warm-up, so a run shrunk by hand (`trainer.max_steps=20` under the protocol's 1,000 warm-up steps) trains at
    a few percent of its learning rate and typically predicts one class: trainable, but misleading, so it warns
    instead of refusing.
    """
    warmup, max_steps = int(cfg.optim.get("warmup_steps", 0) or 0), int(cfg.trainer.max_steps)
    if warmup < max_steps:
        return None
    reached = min(1.0, max_steps / warmup) if warmup else 1.0
    return (
        f"[lra-bench] warning: optim.warmup_steps={warmup} >= trainer.max_steps={max_steps}: the learning rate "
        f"never passes the warm-up (it reaches {100 * reached:.0f}% of optim.lr={cfg.optim.lr} at the last step); "
        f"set optim.warmup_steps below trainer.max_steps (e.g. optim.warmup_steps={max(1, max_steps // 10)}), or "
        "try experiment=smoke / experiment=cpu_small"
    )
