"""Register every axis' schema dataclass in Hydra's ConfigStore, so YAML options type-check at compose time.

Each option YAML lists `schema_<name>` first in its defaults (e.g. `conf/attn/nystrom.yaml` →
`attn/schema_nystrom`); a misspelt or unknown key then fails when the config is composed, naming the key.
The dataclasses live next to the code they configure (models/attention/*.py, models/landmarks/*.py,
tasks/*.py): one source of truth for a component's knobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

import models.attention as attention
import models.landmarks as landmarks
from models.attention.registry import attention_entry
from tasks.registry import all_entries


@dataclass
class NoSelectorConfig:
    """`selector=none`: the attention takes no landmark selector."""

    name: str = "none"


def register_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(group="selector", name="schema_none", node=NoSelectorConfig)
    for name in attention.list_attentions():
        cs.store(group="attn", name=f"schema_{name}", node=attention_entry(name)[1])
    for name in landmarks.list_selectors():
        cs.store(group="selector", name=f"schema_{name}", node=landmarks.selector_class(name).config)
    for name, (_, config) in all_entries().items():
        cs.store(group="task", name=f"schema_{name}", node=config)
