"""The one registry: every component describes itself (name + config dataclass) and has a complete YAML option."""

from __future__ import annotations

from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from lra_bench.registry import AXES, Registry, UnknownComponent
from tests.conftest import CONF

COMPONENTS = [(axis, name) for axis, registry in AXES.items() for name in registry.names()]


def test_every_axis_has_its_components() -> None:
    assert {"full", "nystrom", "gpa"} <= set(AXES["attn"].names())
    assert {"uniform", "segment_means", "kmeans"} <= set(AXES["selector"].names())
    assert set(AXES["task"].names()) == {"listops", "text", "retrieval", "image", "pathfinder", "pathx"}


@pytest.mark.parametrize(("axis", "name"), COMPONENTS)
def test_yaml_option_lists_every_knob(axis: str, name: str) -> None:
    """`conf/<axis>/<name>.yaml` names the component and carries every field of its config dataclass, so each knob
    shows in `--cfg job` and can be overridden from the command line (the schema is not in Hydra's ConfigStore)."""
    path = CONF / axis / f"{name}.yaml"
    assert path.exists(), f"{path} is missing"
    node = OmegaConf.load(path)
    keys = {str(k) for k in node if k != "defaults"}
    knobs = {f.name for f in fields(AXES[axis].config(name))}
    assert keys == knobs, f"{path}: missing {sorted(knobs - keys)}, unknown {sorted(keys - knobs)}"
    assert node.name == name


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownComponent, match=r"attn='nope' is not known; valid: .*full.*nystrom"):
        AXES["attn"].get("nope")


def test_a_class_without_a_config_dataclass_is_refused(tmp_path) -> None:
    (tmp_path / "broken.py").write_text(
        "from models.attention.base import Attention\nclass Broken(Attention):\n    name = 'broken'\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        registry = Registry("attn", "models.attention.base:Attention", "models.attention")
        import broken  # noqa: F401

        with pytest.raises(TypeError, match="needs a `config` dataclass"):
            registry._collect(sys.modules["broken"], {})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken", None)


@pytest.mark.parametrize("name", AXES["attn"].names())
def test_every_attention_exposes_its_implied_matrix(name: str) -> None:
    """The diagnostics and the approximation study need `implied_matrix` (a plugin without it just gets none)."""
    from lra_bench.diagnostics.callback import exposes_implied_matrix

    assert exposes_implied_matrix(AXES["attn"].get(name).__new__(AXES["attn"].get(name)))


def _params(axis: str, name: str) -> dict:
    from tests.conftest import compose

    node = compose([f"{axis}={name}"] + (["attn=nystrom"] if axis == "selector" else []))[axis]
    return OmegaConf.to_container(node, resolve=True)


@pytest.mark.parametrize("name", AXES["attn"].names())
def test_every_attention_describes_its_cost_and_rank(name: str) -> None:
    """The hooks the benchmark, the approximation study and the record ask instead of name tables: a rank knob that
    is one of its config fields, a FLOP count and a memory estimate that grow with n, and a rank budget that
    follows the knob. A component without them fails here, not as a silent "unknown" in a report."""
    cls = AXES["attn"].get(name)
    params = _params("attn", name)
    knob = cls.rank_knob
    assert knob is None or knob in {f.name for f in fields(cls.config)}, f"{name}.rank_knob={knob!r}"
    m = 16 if knob else None
    small, large = cls.flops(512, m, 32, params), cls.flops(1024, m, 32, params)
    assert 0 < small.forward < large.forward and small.forward_backward > small.forward
    for mode in ("forward", "forward_backward"):
        assert 0 < cls.memory(512, m, 32, mode, params) < cls.memory(1024, m, 32, mode, params)
    if knob is not None:
        from lra_bench.registry import build_attention, build_selector

        kwargs = {k: v for k, v in params.items() if k != "name"} | {knob: 16}
        selector = None
        if cls.takes_selector:
            sel = _params("selector", "uniform" if cls.needs_token_landmarks else "segment_means")
            selector = build_selector(sel["name"], **sel)
        attention = build_attention(name, head_dim=32, num_heads=2, seq_len=256, selector=selector, **kwargs)
        assert attention.rank_budget(256) == 16


@pytest.mark.parametrize("name", AXES["selector"].names())
def test_every_selector_describes_its_cost(name: str) -> None:
    cls = AXES["selector"].get(name)
    params = _params("selector", name)
    cost = cls.flops(1024, 16, 32, params)
    assert cost.forward >= 0 and cost.differentiable >= 0
    assert cls.flops(2048, 16, 32, params).forward >= cost.forward


@pytest.mark.parametrize(("axis", "name"), [(axis, name) for axis, name in COMPONENTS if axis != "task"])
def test_cost_models_default_to_the_dataclass(axis: str, name: str) -> None:
    """A knob the caller leaves out counts at the config dataclass's default: a cost model with a default of its own
    (`params.get("conv_kernel", 0)` beside `conv_kernel: int = 35`) fails here."""
    from dataclasses import asdict

    cls = AXES[axis].get(name)
    defaults = asdict(AXES[axis].config(name)())
    if axis == "selector":
        assert cls.flops(512, 16, 32, {}) == cls.flops(512, 16, 32, defaults)
        return
    budget = defaults.get(cls.rank_knob) if cls.rank_knob else None
    for m in (16, None):  # None: the cost model reads the rank knob itself
        assert cls.flops(512, m, 32, {}) == cls.flops(512, m, 32, defaults), m
        if m is not None or budget is None or isinstance(budget, int):
            for mode in ("forward", "forward_backward"):
                assert cls.memory(512, m, 32, mode, {}) == cls.memory(512, m, 32, mode, defaults), (m, mode)
