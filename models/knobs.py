"""A component's knobs: its config dataclass is the one place each default is written.

Every attention and selector declares a `config` dataclass (its `name` plus one field per knob, each with its
default). The constructor takes an instance of it, the cost model (`flops`, `memory`) reads its values through
`knobs`, and `lra_bench.config.generate` writes the option YAML (`conf/attn/<name>.yaml`,
`conf/selector/<name>.yaml`) from it — so a default changed in the dataclass changes all of them at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, fields
from typing import Any, ClassVar, TypeVar

Config = TypeVar("Config")

#: field metadata: the top-level config key a knob follows in the option YAML (`${seed}`), see `follows_run_seed`
FOLLOWS = "follows"


def knob_values(schema: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `params` that are knobs of `schema` (its fields other than `name`), in `params`' order: what
    a config node or a cost model's arguments hold beside the knobs is left out."""
    names = {f.name for f in fields(schema)} - {"name"}  # `schema` is a dataclass by contract
    return {k: v for k, v in params.items() if k in names}


def knobs(schema: type[Config], params: Mapping[str, Any]) -> Config:
    """An instance of `schema` from config values by name: a missing knob takes its dataclass default, and keys
    that are not knobs are ignored."""
    return schema(**knob_values(schema, params))


class NamedByConfig:
    """A component named by its config dataclass: a subclass that declares `config` gets `name = config.name`, so
    the option name is written once, in the dataclass (and `lra_bench.registry` finds the class by its own name)."""

    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        config = cls.__dict__.get("config")
        if config is not None:
            cls.name = str(config.name)


def follows_run_seed() -> Any:
    """A `seed` knob whose option YAML says `${seed}`: in a run it follows the run seed (the component draws from
    its own generator, never the global RNG); built directly, the component gets seed 0."""
    return field(default=0, metadata={FOLLOWS: "seed"})
