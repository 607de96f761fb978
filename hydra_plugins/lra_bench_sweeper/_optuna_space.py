"""A search space in Hydra's override grammar, as Optuna distributions: what `hydra.sweeper.params` (and a sweep on
the command line) means to the Optuna sweeper.

    interval(a, b)              float, uniform on [a, b]
    tag(log, interval(a, b))    float, log-uniform
    int(interval(a, b))         int, uniform (with `tag(log, ...)`: log-uniform)
    range(a, b, s)              int (or float) from a in steps of s, below b: Hydra's values, ordered
    choice(x, y) / x,y          categorical (scalars: str, int, float, bool, null)
    a plain value               fixed: every trial carries the override as written

Why our own reading: the grammar is the one `hydra.sweeper.params` has always used, so a space written for
hydra-optuna-sweeper means the same here, but in Optuna 5's distributions (`FloatDistribution`, `IntDistribution`;
the 2.x classes are gone). A `range` keeps Hydra's meaning (the stop is excluded) and an unknown tag is refused:
`tag(logg, ...)` would otherwise sample uniformly and quietly change the search a comparison rests on.

The name starts with `_` so that Hydra's plugin scan (which imports every other module of `hydra_plugins`, in every
run) leaves it alone: Optuna loads only when a search starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, Quote, QuotedString, RangeSweep, Transformer
from hydra.errors import HydraException, OverrideParseException
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from lra_bench.errors import ConfigError

TAGS = {"log"}  # the only tag with a meaning here


@dataclass(frozen=True)
class SearchSpace:
    """The sampled parameters (override key → distribution) and the overrides every trial carries unchanged."""

    distributions: dict[str, BaseDistribution]
    fixed: list[str]

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """One trial's overrides: the fixed ones as written, then each sampled value in the grammar."""
        return [*self.fixed, *(f"{key}={render(value)}" for key, value in params.items())]


def render(value: Any) -> str:
    """`value` in the override grammar, read back by Hydra as the same value: a str that would read as another
    type (`'1'`, `'null'`) or does not lex unquoted is written quoted."""
    text = Transformer.str(value)
    if isinstance(value, str):
        try:
            same = OverridesParser.create().parse_override(f"key={text}").value() == value
        except HydraException:
            same = False
        if not same:
            text = QuotedString(text=value, quote=Quote.single).with_quotes()
    return text


def search_space(parser: OverridesParser, lines: Sequence[str]) -> SearchSpace:
    """The space of `lines` (`hydra.sweeper.params` as `key=value`, then the command line's overrides: a key given
    twice takes its last value). A value that is no space here raises `ConfigError` naming its key."""
    parsed: dict[str, Override] = {}
    try:
        overrides = parser.parse_overrides(list(lines))
    except OverrideParseException as err:
        raise ConfigError(f"hydra.sweeper.params: {err.override}: {str(err).splitlines()[0]}") from err
    for override in overrides:
        parsed.pop(override.get_key_element(), None)
        parsed[override.get_key_element()] = override
    distributions: dict[str, BaseDistribution] = {}
    fixed: list[str] = []
    for key, override in parsed.items():
        if not override.is_sweep_override():
            fixed.append(str(override.input_line))
            continue
        try:
            distributions[key] = distribution(override)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"hydra.sweeper.params: {override.input_line}: {err}") from err
    return SearchSpace(distributions, fixed)


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution of one sweep override (see the module's table)."""
    value = override.value()
    if isinstance(value, IntervalSweep):
        log = _log(value.tags)
        assert value.start is not None and value.end is not None
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    if isinstance(value, RangeSweep):
        if value.tags or value.shuffle:
            raise ValueError("a range is searched in order: no tag, no shuffle (a categorical is choice(...))")
        values: list[Any] = list(override.sweep_iterator())
        if not values:
            raise ValueError("the range holds no value")
        low, high, step = min(values), max(values), abs(value.step)
        if all(isinstance(v, int) for v in values):
            return IntDistribution(int(low), int(high), step=int(step))
        return FloatDistribution(float(low), float(high), step=float(step))
    if override.is_choice_sweep():
        tags: set[str] = getattr(value, "tags", set())
        if tags:
            raise ValueError(f"a choice takes no tag (got {', '.join(sorted(tags))})")
        choices: list[Any] = [c.text if isinstance(c, QuotedString) else c for c in override.sweep_iterator()]
        bad = [c for c in choices if not (c is None or isinstance(c, (str, int, float, bool)))]
        if bad:
            raise ValueError(f"a choice holds scalars only (str, int, float, bool, null), not {bad[0]!r}")
        if any(isinstance(c, float) and not math.isfinite(c) for c in choices):
            raise ValueError("a choice holds finite numbers only")
        return CategoricalDistribution(choices)
    raise ValueError("not a search space: use interval(a, b), int(interval(a, b)), range(a, b) or choice(...)")


def _log(tags: set[str]) -> bool:
    unknown = sorted(set(tags) - TAGS)
    if unknown:
        raise ValueError(f"unknown tag {', '.join(unknown)} (the only tag here is log: a log-uniform interval)")
    return "log" in tags
