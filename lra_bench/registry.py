"""The one registry: attentions, selectors and tasks, discovered from the classes that describe themselves.

A component is a class that derives from its axis' base (`models.attention.base.Attention`,
`models.landmarks.base.LandmarkSelector`, `tasks.base.LRADataModule`) and sets its own `name` (the option name on
the command line) and `config` (a dataclass whose fields are its knobs, each with its one default; see
`models.knobs`). Nothing else registers it: every module of the axis' package is imported and every such class in it
is an option, so a new attention is one file in `models/attention/` plus its YAML, which `make configs` writes from
the dataclass (`lra_bench.config.generate`). Components outside the repository are found the same way in the
directories of `LRA_BENCH_PLUGINS` (`os.pathsep`-separated; their YAML in a config dir Hydra searches,
`hydra.searchpath=[file:///path/to/conf]`).

Why discovery rather than decorators: one mechanism for three axes in a package that `models` and `tasks` may not
import (they never import `lra_bench`), and errors that list every valid name. Building from config nodes is here
too (`attention_factory`: each block's attention from the `attn`/`selector` nodes), below the run package: the
record builder asks a built attention for its rank budget without importing the run that trains it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
import sys
from dataclasses import is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from lra_bench.kit.plain import plain_dict
from models.knobs import knob_values, knobs

if TYPE_CHECKING:  # the bases are imported lazily at run time: building the CLI must not import torch
    from omegaconf import DictConfig

    from models.attention.base import Attention
    from models.build import AttentionFactory
    from models.landmarks.base import LandmarkSelector
    from tasks.base import LRADataModule

PLUGINS_ENV = "LRA_BENCH_PLUGINS"


class UnknownComponent(KeyError):
    """`<axis>=<name>` names no component; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Described(Protocol):
    """What every component class says about itself (see the module docstring; `name` is read from the class's own
    `__dict__`, so a base class without one is not an option)."""

    config: ClassVar[type | None]


Component = TypeVar("Component", bound=Described)


class Registry(Generic[Component]):
    """The components of one axis (`attn`, `selector` or `task`), found on first use; `Component` is the axis'
    base class, so a looked-up class is typed with the base's hooks (`takes_selector`, `flops`, …)."""

    def __init__(self, axis: str, base: str, package: str) -> None:
        self.axis = axis
        self._base_path = base  # "module:Class", imported lazily: building the CLI must not import torch
        self.package = package
        self._components: dict[str, type[Component]] | None = None

    @property
    def base(self) -> type[Component]:
        module, _, cls = self._base_path.partition(":")
        base: type[Component] = getattr(importlib.import_module(module), cls)
        return base

    # -- discovery ------------------------------------------------------------------------------------------
    def _discover(self) -> dict[str, type[Component]]:
        if self._components is None:
            found: dict[str, type[Component]] = {}
            package = importlib.import_module(self.package)
            for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
                if not info.ispkg and not info.name.startswith("_"):
                    self._collect(importlib.import_module(f"{self.package}.{info.name}"), found)
            for module in plugin_modules():
                self._collect(module, found)
            self._components = found
        return self._components

    def _collect(self, module: Any, found: dict[str, type[Component]]) -> None:
        base = self.base
        for _, cls in inspect.getmembers(module, inspect.isclass):
            name = cls.__dict__.get("name")
            if not (issubclass(cls, base) and isinstance(name, str) and name):
                continue
            if name in found and found[name] is not cls:
                raise ValueError(
                    f"{self.axis}={name} is defined twice: "
                    f"{found[name].__module__}.{found[name].__qualname__} "
                    f"and {cls.__module__}.{cls.__qualname__}"
                )
            if not is_dataclass(cls.__dict__.get("config")):
                where = f"{cls.__module__}.{cls.__qualname__}"
                raise TypeError(f"{where} (`{self.axis}={name}`) needs a `config` dataclass")
            found[name] = cls

    # -- lookup ---------------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(self._discover())

    def get(self, name: str) -> type[Component]:
        components = self._discover()
        if name not in components:
            raise UnknownComponent(f"{self.axis}={name!r} is not known; valid: {', '.join(sorted(components))}")
        return components[name]

    def config(self, name: str) -> type:
        """The component's config dataclass (its schema)."""
        schema = self.get(name).config
        assert schema is not None  # `_collect` admits only classes with a config dataclass
        return schema

    def params(self, name: str, node: dict[str, Any]) -> dict[str, Any]:
        """The knobs in a config node: the schema's fields, minus `name`."""
        return knob_values(self.config(name), node)


_PLUGINS: dict[Path, Any] = {}


def plugin_modules() -> list[Any]:
    """Every `*.py` in the `LRA_BENCH_PLUGINS` dirs, imported once (a missing dir is an error naming it)."""
    modules = []
    folders = [Path(p).expanduser() for p in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if p.strip()]
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{PLUGINS_ENV}: {folder} is not a directory")
        for path in sorted(folder.glob("*.py")):
            path = path.resolve()
            if path not in _PLUGINS:
                name = f"lra_bench_plugin_{path.stem}"
                spec = importlib.util.spec_from_file_location(name, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
                _PLUGINS[path] = module
            modules.append(_PLUGINS[path])
    return modules


ATTENTIONS: Registry[Attention] = Registry("attn", "models.attention.base:Attention", "models.attention")
SELECTORS: Registry[LandmarkSelector] = Registry(
    "selector", "models.landmarks.base:LandmarkSelector", "models.landmarks"
)
TASKS: Registry[LRADataModule] = Registry("task", "tasks.base:LRADataModule", "tasks")
AXES: dict[str, Registry[Any]] = {"attn": ATTENTIONS, "selector": SELECTORS, "task": TASKS}


def build_selector(name: str, /, **kwargs: Any) -> LandmarkSelector:
    """A selector from its config node's keys (keys that are not its knobs are ignored: `name`, …): its config
    dataclass filled from them, the rest at their defaults."""
    return SELECTORS.get(name)(knobs(SELECTORS.config(name), kwargs))


def build_attention(
    name: str, /, *, head_dim: int, num_heads: int, seq_len: int, selector: Any = None, **params: Any
) -> Attention:
    """An attention with its selector (required exactly when the attention `takes_selector`); `params` fill its
    config dataclass, the rest at their defaults."""
    cls = ATTENTIONS.get(name)
    params = {k: v for k, v in params.items() if k != "name"}  # anything else must be a knob (TypeError if not)
    geometry: dict[str, Any] = {"head_dim": head_dim, "num_heads": num_heads, "seq_len": seq_len}
    if cls.takes_selector:
        if selector is None:
            raise ValueError(f"attn={name} needs a landmark selector")
        geometry["selector"] = selector
    elif selector is not None:
        raise ValueError(f"attn={name} takes no selector (got {type(selector).__name__}); drop selector=")
    return cls(**geometry, cfg=ATTENTIONS.config(name)(**params))


def offset_seed(kwargs: dict[str, Any], layer: int) -> dict[str, Any]:
    """Seeded components get `seed + 1000·layer`, so layers draw different landmarks/features while a run stays
    reproducible from its one `seed`."""
    if isinstance(kwargs.get("seed"), int):
        kwargs["seed"] = kwargs["seed"] + 1000 * layer
    return kwargs


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
