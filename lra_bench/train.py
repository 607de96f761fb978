"""One training run: validate the config, build data + model, fit, test on the best-val checkpoint, record.

Resuming is the default: the run's output dir is derived from its overrides (same command → same dir), and
`ckpt_path=last` continues from `<output_dir>/checkpoints/last.ckpt` when it exists.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint, RichProgressBar

from lra_bench import results
from lra_bench.callbacks import EfficiencyMonitor
from lra_bench.envinfo import environment
from lra_bench.loggers import build_loggers, finish_wandb
from lra_bench.summary import print_config, print_summary
from lra_bench.validate import check_writable, validate
from models.attention.registry import attention_entry
from models.build import build_classifier
from tasks.registry import task_entry

CHECKPOINT_DIR = "checkpoints"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def build_datamodule(cfg: DictConfig) -> Any:
    cls, _ = task_entry(cfg.task.name)
    return cls(
        OmegaConf.to_container(cfg.task, resolve=True),
        data_dir=str(cfg.data_dir),
        cache_dir=str(cfg.cache_dir),
        batch_size=int(cfg.data.batch_size),
        eval_batch_size=cfg.data.eval_batch_size,
        num_workers=int(cfg.data.num_workers),
        seed=int(cfg.seed),
    )


def selector_node(cfg: DictConfig) -> dict[str, Any] | None:
    if not attention_entry(cfg.attn.name)[0].takes_selector:
        return None
    return OmegaConf.to_container(cfg.selector, resolve=True)  # type: ignore[return-value]


def build_model(cfg: DictConfig, dm: Any) -> torch.nn.Module:
    return build_classifier(
        vocab_size=dm.vocab_size,
        seq_len=dm.seq_len,
        num_classes=dm.num_classes,
        dual=dm.dual,
        model=OmegaConf.to_container(cfg.model, resolve=True),  # type: ignore[arg-type]
        attn=OmegaConf.to_container(cfg.attn, resolve=True),  # type: ignore[arg-type]
        selector=selector_node(cfg),
    )


def trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(kwargs, dict)
    kwargs["gradient_clip_val"] = cfg.optim.grad_clip_val
    kwargs["gradient_clip_algorithm"] = cfg.optim.grad_clip_algorithm
    return kwargs


def slurm_plugins() -> list[Any]:
    """Under SLURM exactly one component owns requeueing: submitit (or the user's sbatch), not Lightning."""
    if "SLURM_JOB_ID" not in os.environ:
        return []
    from pytorch_lightning.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)]


def resume_path(cfg: DictConfig, output_dir: Path) -> str | None:
    if cfg.ckpt_path in (None, "none", "null"):
        return None
    if cfg.ckpt_path == "last":
        last = output_dir / CHECKPOINT_DIR / "last.ckpt"
        return str(last) if last.exists() else None
    path = Path(str(cfg.ckpt_path)).expanduser()
    if not path.exists():
        from lra_bench.validate import ConfigError

        raise ConfigError(f"ckpt_path={cfg.ckpt_path}: no such file; use 'last', null, or an existing .ckpt")
    return str(path)


def checkpoint_step(path: str | None) -> int | None:
    if not path:
        return None
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    return int(ckpt.get("global_step", 0))


def majority_share(dm: Any) -> float | None:
    split = dm.splits.get("val")
    if split is None or len(split) == 0:
        return None
    _, counts = np.unique(np.asarray(split.table["label"]), return_counts=True)
    return float(counts.max() / counts.sum())


def metric(trainer: pl.Trainer, key: str) -> float | None:
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


def train(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Run and return the result record (also written to `<output_dir>/results.json`)."""
    validate(cfg)
    check_writable(output_dir)
    record = results.empty_record()
    record.update(
        task=cfg.task.name,
        attn=cfg.attn.name,
        protocol=cfg.protocol.name,
        seed=int(cfg.seed),
        selector=(cfg.selector.name if selector_node(cfg) else None),
        num_landmarks=cfg.attn.get("num_landmarks"),
        config=OmegaConf.to_container(cfg, resolve=True),
        env=environment(),
    )
    record["run"].update(name=output_dir.name, output_dir=str(output_dir.resolve()), started_at=now())
    record_path = output_dir / results.FILENAME
    results.write_atomic(record_path, record)
    if cfg.print_config:
        print_config(cfg, save_to=output_dir / "config_tree.log")

    try:
        pl.seed_everything(int(cfg.seed), workers=True)
        dm = build_datamodule(cfg)
        dm.prepare_data()
        dm.setup()
        record["data"].update(dm.data_info())
        record["data"]["majority_share"] = majority_share(dm)
        module = _build_module(cfg, dm)
        ckpt = resume_path(cfg, output_dir)
        record["run"]["resumed_from_step"] = checkpoint_step(ckpt)
        checkpoint = ModelCheckpoint(
            dirpath=str(output_dir / CHECKPOINT_DIR),
            filename="best-{step}",
            monitor="val/acc",
            mode="max",
            save_top_k=1,
            save_last=True,
            auto_insert_metric_name=False,
            every_n_train_steps=cfg.callbacks.checkpoint_every_n_steps,
        )
        efficiency = EfficiencyMonitor(warmup_steps=int(cfg.callbacks.stats_warmup_steps))
        callbacks: list[pl.Callback] = [checkpoint, efficiency, *_extra_callbacks(cfg, dm, record)]
        if cfg.callbacks.progress_bar:
            callbacks.append(RichProgressBar())
        loggers, wandb_id = build_loggers(
            cfg, output_dir, run_name=f"{cfg.task.name}-{cfg.attn.name}-{output_dir.name}"
        )
        record["run"]["wandb_id"] = wandb_id
        trainer = pl.Trainer(
            **trainer_kwargs(cfg),
            callbacks=callbacks,
            logger=loggers or False,
            default_root_dir=str(output_dir),
            max_epochs=-1,
            check_val_every_n_epoch=None,
            enable_progress_bar=bool(cfg.callbacks.progress_bar),
            plugins=slurm_plugins(),
        )
        if cfg.train:
            trainer.fit(module, datamodule=dm, ckpt_path=ckpt)
        record["metrics"].update(efficiency.summary(module))
        record["metrics"]["train_steps"] = int(trainer.global_step)
        best = checkpoint.best_model_path or None
        if best:
            record["metrics"]["best_step"] = checkpoint_step(best)
            record["metrics"]["val_acc"] = (
                float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None
            )
        else:
            record["metrics"]["val_acc"] = metric(trainer, "val/acc")
        if cfg.test:
            trainer.test(module, datamodule=dm, ckpt_path=best, weights_only=True) if best else trainer.test(
                module, datamodule=dm
            )
            record["metrics"]["test_acc"] = metric(trainer, "test/acc")
        record["status"] = "completed"
    except KeyboardInterrupt:
        record["status"] = "interrupted"
        raise
    except BaseException as err:
        record["status"], record["error"] = "failed", f"{type(err).__name__}: {err}"
        raise
    finally:
        record["run"]["finished_at"] = now()
        results.write_atomic(record_path, record)
        finish_wandb()
    print_summary(record)
    return record


def _build_module(cfg: DictConfig, dm: Any) -> pl.LightningModule:
    from lra_bench.module import LRAModule

    model = build_model(cfg, dm)
    return LRAModule(model, dm.num_classes, OmegaConf.to_container(cfg.optim, resolve=True), int(cfg.trainer.max_steps))


def _extra_callbacks(cfg: DictConfig, dm: Any, record: dict[str, Any]) -> list[pl.Callback]:
    """Callbacks contributed by other parts of the harness (diagnostics, …), each optional."""
    out: list[pl.Callback] = []
    if cfg.diagnostics.enabled:
        try:
            from lra_bench.diagnostics_callback import DiagnosticsCallback
        except ImportError:
            return out
        out.append(DiagnosticsCallback(cfg.diagnostics, dm, record))
    return out
