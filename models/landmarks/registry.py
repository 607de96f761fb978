"""One registry for the `selector` axis: name → selector class (and its config schema)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from models.landmarks.base import LandmarkSelector

_SELECTORS: dict[str, type[LandmarkSelector]] = {}


def register_selector(name: str, config: type) -> Callable[[type[LandmarkSelector]], type[LandmarkSelector]]:
    """Register `cls` under `name` with its config dataclass (fields = constructor kwargs, plus `name`)."""

    def wrap(cls: type[LandmarkSelector]) -> type[LandmarkSelector]:
        if name in _SELECTORS:
            raise ValueError(f"selector {name!r} registered twice")
        _SELECTORS[name] = cls
        cls.registry_name = name
        cls.config = config
        return cls

    return wrap


def list_selectors() -> list[str]:
    return sorted(_SELECTORS)


def selector_class(name: str) -> type[LandmarkSelector]:
    if name not in _SELECTORS:
        raise KeyError(f"selector={name!r} is not a known selector; valid: {', '.join(list_selectors())}")
    return _SELECTORS[name]


def build_selector(name: str, **kwargs: Any) -> LandmarkSelector:
    cls = selector_class(name)
    known = {f.name for f in fields(cls.config)} - {"name"}
    return cls(**{k: v for k, v in kwargs.items() if k in known})
