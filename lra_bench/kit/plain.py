"""A mapping config node as a plain `dict[str, Any]`.

`OmegaConf.to_container` is typed as a union over every container kind (list, str and key types a composed config
never has), so each caller either checked or ignored the type. This is the one place that does it: a mapping node
in, a dict with `str` keys out, or a `TypeError` naming what came instead.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf


def plain_dict(node: Any, *, resolve: bool = True, enum_to_str: bool = False) -> dict[str, Any]:
    """`node` (a `DictConfig` or a mapping) as a plain dict: interpolations resolved unless `resolve=False`."""
    container = (
        OmegaConf.to_container(node, resolve=resolve, enum_to_str=enum_to_str) if isinstance(node, DictConfig) else node
    )
    if not isinstance(container, dict):
        raise TypeError(f"expected a mapping config node, got {type(container).__name__}")
    return {str(key): value for key, value in container.items()}
