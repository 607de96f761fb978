"""One registry for the `attn` axis: name → (attention class, config schema dataclass).

The schema dataclass is the single source of truth for an attention's knobs: the Hydra ConfigStore
registers it as `attn/schema_<name>` (so a misspelt key fails at compose time) and its fields are the
constructor's keyword arguments. We build by registry name rather than Hydra `_target_`: errors can then
list the valid names, and no config can make the harness import an arbitrary dotted path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from models.attention.base import Attention

_ATTENTIONS: dict[str, tuple[type[Attention], type]] = {}


def register_attention(name: str, config: type) -> Callable[[type[Attention]], type[Attention]]:
    """Register `cls` under `name` with its config dataclass (whose `name` field defaults to `name`)."""

    def wrap(cls: type[Attention]) -> type[Attention]:
        if name in _ATTENTIONS:
            raise ValueError(f"attention {name!r} registered twice")
        _ATTENTIONS[name] = (cls, config)
        cls.registry_name = name
        return cls

    return wrap


def list_attentions() -> list[str]:
    return sorted(_ATTENTIONS)


def attention_entry(name: str) -> tuple[type[Attention], type]:
    if name not in _ATTENTIONS:
        raise KeyError(f"attn={name!r} is not a known attention; valid: {', '.join(list_attentions())}")
    return _ATTENTIONS[name]


def attention_params(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The constructor kwargs in `cfg` (the schema's fields, minus `name`)."""
    _, schema = attention_entry(name)
    keys = {f.name for f in fields(schema)} - {"name"}
    return {k: v for k, v in cfg.items() if k in keys}


def build_attention(
    name: str, *, head_dim: int, num_heads: int, seq_len: int, selector: Any = None, **params: Any
) -> Attention:
    cls, _ = attention_entry(name)
    if cls.takes_selector:
        if selector is None:
            raise ValueError(f"attn={name} needs a landmark selector")
        params["selector"] = selector
    elif selector is not None:
        raise ValueError(f"attn={name} takes no selector (got {type(selector).__name__}); drop selector=")
    return cls(head_dim=head_dim, num_heads=num_heads, seq_len=seq_len, **params)
