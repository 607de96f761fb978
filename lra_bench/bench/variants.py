"""Which operators the bench sweeps: every registered attention (never a hard-coded list) at its paper
defaults, read from `conf/attn/<name>.yaml` — the same defaults `run.py attn=<name>` gets — including the
selector it brings, plus any extra selectors asked for, at each landmark count m for attentions whose schema
has a landmark-count field. References (`lra_bench.bench.references`) are added by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lra_bench.bench.references import REFERENCES
from lra_bench.record.provenance import REPO_ROOT

CONF = REPO_ROOT / "conf"


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


def _yaml_node(path: Path, context: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """A group option's own keys and its defaults list; ({}, []) when the file is missing.

    Interpolations are resolved against `context` (the run-level keys an option may refer to, e.g.
    `seed: ${seed}`); a key whose interpolation cannot be resolved here is left out (the schema default
    applies)."""
    if not path.exists():
        return {}, []
    raw = OmegaConf.load(path)
    defaults = OmegaConf.to_container(raw.get("defaults", []) or [], resolve=False)
    root = OmegaConf.create({**(context or {}), "_node": raw})
    node: dict[str, Any] = {}
    for key in raw:
        if key == "defaults":
            continue
        try:
            value = root._node[key]
            node[str(key)] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:
            continue
    return node, list(defaults)  # type: ignore[arg-type]


def default_selector(attn: str) -> str | None:
    """The selector `conf/attn/<attn>.yaml` overrides `selector` with (its paper's choice), if any."""
    _, defaults = _yaml_node(CONF / "attn" / f"{attn}.yaml")
    for entry in defaults:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if "selector" in str(key) and value not in (None, "none"):
                    return str(value)
    return None


def attn_params(attn: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """Constructor kwargs from the schema dataclass defaults overlaid with `conf/attn/<attn>.yaml`."""
    from models.attention.registry import attention_entry

    _, schema = attention_entry(attn)
    params = {f.name: f.default for f in fields(schema) if f.name != "name" and _has_default(f)}
    node, _ = _yaml_node(CONF / "attn" / f"{attn}.yaml", context)
    params.update({k: v for k, v in node.items() if k in params and k != "name"})
    return params


def selector_params(selector: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    from models.landmarks import selector_class

    schema = selector_class(selector).config
    params = {f.name: f.default for f in fields(schema) if f.name != "name" and _has_default(f)}
    node, _ = _yaml_node(CONF / "selector" / f"{selector}.yaml", context)
    params.update({k: v for k, v in node.items() if k in params and k != "name"})
    return params


def _has_default(f: Any) -> bool:
    from dataclasses import MISSING

    return f.default is not MISSING


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
    landmark_keys: list[str],
    references: Any,
    context: dict[str, Any] | None = None,
) -> list[Variant]:
    """`attns`: "all" or names; `selectors`: extra selectors ("all" = every registered) for landmark attentions."""
    from models.attention import attention_entry, list_attentions
    from models.landmarks import list_selectors

    names = list_attentions() if attns in ("all", None) else _as_list(attns)
    extra = list_selectors() if selectors == "all" else _as_list(selectors)
    out: list[Variant] = []
    for name in names:
        cls, _ = attention_entry(name)
        params = attn_params(name, context)
        key = next((k for k in landmark_keys if k in params), None)
        sels: list[str | None] = [None]
        if cls.takes_selector:
            own = default_selector(name)
            sels = list(dict.fromkeys([s for s in [own, *extra] if s]))
            if not sels:
                raise ValueError(f"attn={name} takes a selector but conf/attn/{name}.yaml names none; pass selectors=")
        ms: list[Any] = list(landmarks) if key else [None]
        for sel in sels:
            for m in ms:
                p = dict(params)
                if key is not None:
                    p[key] = m
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
