"""Lightning callbacks a user adds as `_target_` nodes under `callbacks:` (a config, or the command line:
`+callbacks.lr_monitor._target_=pytorch_lightning.callbacks.LearningRateMonitor`).

The harness's own callbacks are built in `lra_bench.run.train` (each carries a guarantee: resume, NaN stop, the
record's numbers), so a config cannot drop one by accident; `_target_` nodes only add. Their targets are checked
when the run starts (`lra_bench.config.validate.check_callback_targets`); building one that fails, or that is not a
Lightning callback, is one line naming the node.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from hydra.utils import instantiate
from omegaconf import DictConfig

from lra_bench.config.validate import callback_nodes
from lra_bench.errors import ConfigError


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
