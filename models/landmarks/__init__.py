"""Landmark selectors (the `selector` axis). Importing this package registers every selector module in it."""

import importlib
import pkgutil

from models.landmarks.base import Landmarks, LandmarkSelector, resolve_num_landmarks
from models.landmarks.registry import build_selector, list_selectors, register_selector, selector_class

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in {"base", "registry"}:
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "LandmarkSelector",
    "Landmarks",
    "build_selector",
    "list_selectors",
    "register_selector",
    "resolve_num_landmarks",
    "selector_class",
]
