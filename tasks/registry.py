"""One registry for the `task` axis: name → (data module class, config schema dataclass)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

_TASKS: dict[str, tuple[type, type]] = {}


def register_task(name: str, config: type) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if name in _TASKS:
            raise ValueError(f"task {name!r} registered twice")
        _TASKS[name] = (cls, config)
        cls.task_name = name
        return cls

    return wrap


def load_all() -> None:
    """Import every module of `tasks` that defines a task (modules register themselves on import)."""
    import tasks

    skip = {"registry", "base", "layout", "tokenizers", "cache", "prepare"}
    for info in pkgutil.iter_modules(tasks.__path__):
        if not info.ispkg and info.name not in skip:
            importlib.import_module(f"tasks.{info.name}")


def list_tasks() -> list[str]:
    load_all()
    return sorted(_TASKS)


def task_entry(name: str) -> tuple[type, type]:
    load_all()
    if name not in _TASKS:
        raise KeyError(f"task={name!r} is not a known task; valid: {', '.join(sorted(_TASKS))}")
    return _TASKS[name]


def all_entries() -> dict[str, tuple[type, type]]:
    load_all()
    return dict(_TASKS)
