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
