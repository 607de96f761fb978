"""Which operators the bench sweeps: every registered attention (never a hard-coded list) at its paper
defaults, composed from the config tree exactly as `run.py attn=<name>` gets them — including the selector it
brings, plus any extra selectors asked for, at each landmark count m for attentions whose schema
has a landmark-count field. References (`lra_bench.bench.references`) are added by name.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from lra_bench.bench.references import REFERENCES
from lra_bench.config.compose import compose_config
from lra_bench.kit.plain import plain_dict
from lra_bench.registry import ATTENTIONS, SELECTORS


@dataclass
class Variant:
    """One operator configuration, independent of n."""

    attn: str
    kind: str  # "attention" | "reference"
    selector: str | None = None
    m: int | str | None = None
    m_key: str | None = None
    default_selector: bool = True  # the selector is the one the attention's YAML brings
    attn_params: dict[str, Any] = field(default_factory=dict)
    selector_params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        parts = [self.attn]
        if self.selector:
            parts.append(self.selector)
        if self.m is not None:
            parts.append(f"m={self.m}")
        return "/".join(parts)


@functools.cache
def _composed(attn: str | None, selector: str | None, seed: int) -> dict[str, Any]:
    """The `attn` and `selector` nodes `run.py attn=<attn> [selector=<selector>] seed=<seed>` would get."""
    overrides = [f"seed={seed}"] + ([f"attn={attn}"] if attn else []) + ([f"selector={selector}"] if selector else [])
    cfg = compose_config(overrides)
    return {"attn": plain_dict(cfg.attn), "selector": plain_dict(cfg.selector)}


def _seed(context: dict[str, Any] | None) -> int:
    return int((context or {}).get("seed", 0))


def default_selector(attn: str) -> str | None:
    """The selector `conf/attn/<attn>.yaml` brings (its paper's choice), if any."""
    name = _composed(attn, None, 0)["selector"]["name"]
    return None if name in (None, "none") else str(name)


def attn_params(attn: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The attention's knobs (its config dataclass's fields) as a run composes them (`conf/attn/<attn>.yaml`)."""
    return ATTENTIONS.params(attn, _composed(attn, None, _seed(context))["attn"])


def selector_params(selector: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The selector's knobs (its config dataclass's fields) as a run composes them (`conf/selector/<selector>.yaml`)."""
    return SELECTORS.params(selector, _composed(None, selector, _seed(context))["selector"])


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def build_variants(
    attns: Any,
    selectors: Any,
    landmarks: list[Any],
    references: Any,
    context: dict[str, Any] | None = None,
) -> list[Variant]:
    """`attns`: "all" or names; `selectors`: extra selectors ("all" = every registered) for landmark attentions."""

    names = ATTENTIONS.names() if attns in ("all", None) else _as_list(attns)
    extra = SELECTORS.names() if selectors == "all" else _as_list(selectors)
    out: list[Variant] = []
    for name in names:
        cls = ATTENTIONS.get(name)
        params = attn_params(name, context)
        key = cls.rank_knob  # the knob m sets (num_landmarks, proj_dim, num_features): the attention says which
        sels: list[str | None] = [None]
        if cls.takes_selector:
            own = default_selector(name)
            tokens_only = getattr(cls, "needs_token_landmarks", False)  # e.g. pivoted: cluster means cannot serve
            fits = [s for s in extra if not tokens_only or SELECTORS.get(s).token_landmarks]
            sels = list(dict.fromkeys([s for s in [own, *fits] if s]))
            if not sels:
                raise ValueError(f"attn={name} takes a selector but conf/attn/{name}.yaml names none; pass selectors=")
        ms: list[Any] = list(landmarks) if key else [None]
        for sel in sels:
            for m in ms:
                p = dict(params) if key is None else {**params, key: m}
                out.append(
                    Variant(
                        attn=name,
                        kind="attention",
                        selector=sel,
                        default_selector=(sel == sels[0]) if cls.takes_selector else True,
                        m=m,
                        m_key=key,
                        attn_params=p,
                        selector_params=selector_params(sel, context) if sel else {},
                    )
                )
    for ref in _as_list(references):
        if ref not in REFERENCES:
            raise ValueError(f"references: {ref!r} is not a reference; valid: {', '.join(REFERENCES)}")
        out.append(Variant(attn=ref, kind="reference"))
    return out
