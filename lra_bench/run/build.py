"""From a composed config to the objects of a run: the data module, the network (with one attention per block).

The one place that turns config nodes into components through `lra_bench.registry`; training, evaluation and the
approximation study's model capture all build through it, so a checkpoint is always rebuilt the way it was made.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from lra_bench.config.plain import plain_dict
from lra_bench.errors import ConfigError
from lra_bench.registry import ATTENTIONS, TASKS, build_attention, build_selector
from models.attention.base import Attention
from models.build import AttentionFactory, build_classifier, offset_seed
from models.heads import LanguageModel, TaskNetwork
from tasks.masking import extra_tokens


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
        from lra_bench.run.pretrain import pretraining_data

        return pretraining_data(cfg, dm)
    return dm


def selector_node(cfg: DictConfig) -> dict[str, Any] | None:
    """The selector's config node, or None when the attention takes no selector."""
    if not ATTENTIONS.get(cfg.attn.name).takes_selector:
        return None
    return plain_dict(cfg.selector)


def attention_factory(
    attn: dict[str, Any], selector: dict[str, Any] | None, *, num_heads: int, head_dim: int
) -> AttentionFactory:
    """Each block's attention (and its own selector instance), seeded `seed + 1000·layer` (`offset_seed`)."""
    name = attn["name"]
    params = ATTENTIONS.params(name, attn)

    def make(layer: int, total_len: int) -> Attention:
        sel = None
        if selector is not None:
            sel = build_selector(selector["name"], **offset_seed(dict(selector), layer))
        return build_attention(
            name,
            head_dim=head_dim,
            num_heads=num_heads,
            seq_len=total_len,
            selector=sel,
            **offset_seed(dict(params), layer),
        )

    return make


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
        from lra_bench.run.pretrain import language_model

        return language_model(cfg, network, dm)
    return network


def check_run_config(cfg: DictConfig) -> None:
    """Everything a run checks before it builds anything, for the pre-flight of `run.py` and of every sweep job:
    the config (`lra_bench.config.validate.validate`) and the task's own options (its constructor, no I/O)."""
    from lra_bench.config.validate import validate

    validate(cfg)
    build_datamodule(cfg)
