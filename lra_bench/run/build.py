"""Building a run from its composed config: the data module, the network (with one attention per block), the
LightningModule, the Trainer's arguments and plugins, the data on every rank, and the user's callbacks.

The one place that turns config nodes into components through `lra_bench.registry`: training, evaluation and the
approximation study's model capture all build through it, so a checkpoint is always rebuilt the way it was made;
both stages that run a Trainer (`train`, `evaluation`) import it from here.

The harness's own callbacks are built in `lra_bench.run.train` (each carries a guarantee: resume, NaN stop, the
record's numbers), so a config cannot drop one by accident; a user's `_target_` nodes under `callbacks:`
(`+callbacks.lr_monitor._target_=pytorch_lightning.callbacks.LearningRateMonitor`) only add. Their targets are checked
when the run starts (`lra_bench.config.validate.check_callback_targets`); building one that fails, or that is not a
Lightning callback, is one line naming the node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
from hydra.utils import instantiate
from omegaconf import DictConfig
from pytorch_lightning.plugins.environments import SLURMEnvironment

from lra_bench.config.pretrained_run import PretrainedSource
from lra_bench.config.validate import callback_nodes, validate
from lra_bench.errors import ConfigError
from lra_bench.kit.plain import plain_dict
from lra_bench.registry import TASKS, attention_factory, selector_node
from lra_bench.run import pretrain
from lra_bench.run.module import LRAModule
from models.build import build_classifier
from models.heads import LanguageModel, TaskNetwork
from tasks.masking import extra_tokens


def instantiate_callbacks(cfg: DictConfig) -> list[pl.Callback]:
    out: list[pl.Callback] = []
    for name, node in callback_nodes(cfg).items():
        try:
            callback: Any = instantiate(node)
        except Exception as err:  # bad arguments, a failing constructor
            cause = err.__cause__ or err
            raise ConfigError(f"callbacks.{name}: {node['_target_']} failed: {type(cause).__name__}: {cause}") from None
        if not isinstance(callback, pl.Callback):
            raise ConfigError(
                f"callbacks.{name}._target_={node['_target_']} is a {type(callback).__name__}, not a Lightning "
                "callback (pytorch_lightning.Callback)"
            )
        out.append(callback)
    return out


def build_datamodule(cfg: DictConfig) -> Any:
    """The task's data module; for `stage=pretrain` its self-pretraining view (train inputs only, masked). A task
    constructor's `ValueError` is an option it rejects (`task.difficulty=x`, lengths a task cannot have): a
    `ConfigError`, one line, exit 2 — not a traceback."""
    cls = TASKS.get(cfg.task.name)
    try:
        dm = cls(
            plain_dict(cfg.task),
            data_dir=str(cfg.data_dir),
            cache_dir=str(cfg.cache_dir),
            batch_size=int(cfg.data.batch_size),
            eval_batch_size=cfg.data.eval_batch_size,
            num_workers=int(cfg.data.num_workers),
            seed=int(cfg.seed),
        )
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"task={cfg.task.name}: {err}") from None
    if cfg.get("stage") == "pretrain":
        return pretrain.pretraining_data(cfg, dm)
    return dm


def build_network(
    *,
    vocab_size: int,
    seq_len: int,
    num_classes: int,
    dual: bool,
    model: dict[str, Any],
    attn: dict[str, Any],
    selector: dict[str, Any] | None,
) -> TaskNetwork:
    """The classifier from plain config nodes (`attn`/`selector` with their `name`; `selector` None when the
    attention takes none)."""
    return build_classifier(
        vocab_size=vocab_size,
        seq_len=seq_len,
        num_classes=num_classes,
        dual=dual,
        model=model,
        make_attention=attention_factory(
            attn, selector, num_heads=int(model["num_heads"]), head_dim=int(model["head_dim"])
        ),
    )


def build_model(cfg: DictConfig, dm: Any) -> TaskNetwork | LanguageModel:
    """The run's network. An encoder pretrained with `mlm` (or being pretrained) has one more embedding row, the
    mask token (`tasks.masking.extra_tokens`); `stage=pretrain` puts the per-token LM head on it instead."""
    model, attn = plain_dict(cfg.model), plain_dict(cfg.attn)
    network = build_network(
        vocab_size=dm.vocab_size + extra_tokens(cfg.get("pretraining")),
        seq_len=dm.seq_len,
        num_classes=dm.num_classes,
        dual=dm.dual,
        model=model,
        attn=attn,
        selector=selector_node(cfg),
    )
    if cfg.get("stage") == "pretrain":
        return pretrain.language_model(cfg, network, dm)
    return network


def check_run_config(cfg: DictConfig) -> None:
    """Everything a run checks before it builds anything, for the pre-flight of `run.py` and of every sweep job:
    the config (`lra_bench.config.validate.validate`) and the task's own options (its constructor, no I/O)."""
    validate(cfg)
    build_datamodule(cfg)


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
    if source is not None:  # pretrained=: the pretrained encoder, a fresh head
        pretrain.load_encoder(model, source)
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
