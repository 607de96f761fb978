"""Attention operators (the `attn` axis). Importing this package registers every variant module in it,
so a new attention is one file here plus one YAML in conf/attn/."""

import importlib
import pkgutil

from models.attention.base import Attention
from models.attention.registry import (
    attention_entry,
    attention_params,
    build_attention,
    list_attentions,
    register_attention,
)

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in {"base", "registry", "numerics"}:
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "Attention",
    "attention_entry",
    "attention_params",
    "build_attention",
    "list_attentions",
    "register_attention",
]
