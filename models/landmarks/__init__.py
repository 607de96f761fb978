"""Landmark selectors (the `selector` axis): one module per selector, each a subclass of `LandmarkSelector` that
sets its own `name` and `config` (discovered by `lra_bench.registry`)."""

from models.landmarks.base import Landmarks, LandmarkSelector, resolve_num_landmarks

__all__ = ["LandmarkSelector", "Landmarks", "resolve_num_landmarks"]
