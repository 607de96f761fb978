"""Protocols: every protocol × task has a recipe, composes, validates, and its values reach the run config."""

from __future__ import annotations

from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from lra_bench.config.validate import validate
from lra_bench.registry import TASKS as TASK_REGISTRY
from tests.conftest import CONF, compose

PROTOCOLS = ("nystromformer", "skyformer", "lra_original")
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
RECIPE_SECTIONS = ("model", "optim", "data", "trainer", "task")


def flatten(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def recipe(protocol: str, task: str) -> dict:
    path = CONF / "recipe" / f"{protocol}_{task}.yaml"
    assert path.read_text().startswith("# @package _global_"), f"{path.name}: must start with '# @package _global_'"
    return OmegaConf.to_container(OmegaConf.load(path))  # type: ignore[return-value]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_protocol_file_names_itself_and_its_source(protocol: str) -> None:
    node = OmegaConf.load(CONF / "protocol" / f"{protocol}.yaml")
    assert node.name == protocol and node.source
    assert {p.stem for p in (CONF / "recipe").glob(f"{protocol}_*.yaml")} == {f"{protocol}_{t}" for t in TASKS}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_recipe_keys_are_known(protocol: str, task: str) -> None:
    """A misspelt key in a recipe would silently add a new key (model/optim/data are plain dicts)."""
    base = compose([])  # the harness's model/optim/data keys (conf/model/, conf/optim/, conf/config.yaml)
    trainer = OmegaConf.load(CONF / "trainer" / "default.yaml")
    task_fields = {f.name for f in fields(TASK_REGISTRY.config(task))}
    for key in flatten(recipe(protocol, task)):
        section, _, rest = key.partition(".")
        assert section in RECIPE_SECTIONS, f"{protocol}_{task}.yaml: unexpected section {section!r}"
        known = {"trainer": set(trainer), "task": task_fields}.get(section) or set(base[section])
        assert rest in known, f"{protocol}_{task}.yaml: {key} is not a known key of {section}"


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_composes_and_validates(protocol: str, task: str) -> None:
    cfg = compose([f"protocol={protocol}", f"task={task}"])
    validate(cfg)
    assert cfg.protocol.name == protocol and cfg.task.name == task


def test_recipe_values_reach_the_run_config() -> None:
    """Every value a recipe sets is the composed value (a later defaults entry must not overwrite it)."""
    wrong = {}
    for protocol in PROTOCOLS:
        for task in TASKS:
            composed = flatten(OmegaConf.to_container(compose([f"protocol={protocol}", f"task={task}"])))
            for key, value in flatten(recipe(protocol, task)).items():
                if composed.get(key) != value:
                    wrong[f"{protocol}_{task}:{key}"] = (value, composed.get(key))
    keys = sorted({k.split(":")[1] for k in wrong})
    example = next(iter(wrong.items()), None)
    assert not wrong, (
        f"{len(wrong)} recipe values are overridden in the composed config (keys: {', '.join(keys)}; e.g. "
        f"{example[0]}: recipe {example[1][0]!r}, composed {example[1][1]!r}). For trainer.* keys: conf/config.yaml "
        f"must list `recipe: ${{protocol}}_${{task}}` after `trainer` and `callbacks` in its defaults."
    )


@pytest.mark.parametrize(
    ("protocol", "text_length"), [("nystromformer", 4000), ("skyformer", 4000), ("lra_original", 1000)]
)
def test_text_length_per_protocol(protocol: str, text_length: int) -> None:
    cfg = compose([f"protocol={protocol}", "task=text"])
    assert cfg.task.max_length == text_length and cfg.task.seq_len >= text_length


def test_protocol_specifics() -> None:
    sky = compose(["protocol=skyformer", "task=image"])
    assert sky.optim.grad_clip_val == 1.0 and sky.optim.grad_clip_algorithm == "value"
    lra = compose(["protocol=lra_original", "task=retrieval"])
    assert lra.model.interaction == "concat" and lra.model.pooling == "cls" and list(lra.optim.betas) == [0.9, 0.98]
    assert compose(["protocol=nystromformer", "task=retrieval"]).model.interaction == "nli"
    px = compose(["protocol=lra_original", "task=pathx"])
    assert px.task.seq_len == 16384 and px.optim.grad_clip_val == 1.0 and px.model.pooling == "mean"


def protocol_pinned(protocol: str) -> set[str]:
    """The keys a protocol pins for all its tasks: those of the model and optimiser options its file selects
    (`override /<group>@_global_.<group>: <option>`), with the options those inherit (their own defaults lists)."""

    def option_keys(group: str, option: str) -> set[str]:
        node = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
        assert isinstance(node, dict)
        inherited = {k for parent in node.pop("defaults", []) for k in option_keys(group, str(parent))}
        return inherited | {f"{group}.{key}" for key in flatten(node)}

    keys: set[str] = set()
    for entry in OmegaConf.to_container(OmegaConf.load(CONF / "protocol" / f"{protocol}.yaml")).get("defaults", []):
        for target, option in entry.items():
            group = target.removeprefix("override ").removeprefix("/").split("@")[0]
            keys |= option_keys(group, option)
    return keys


def test_recipes_are_complete() -> None:
    """Every recipe, with its protocol's shared model and optimiser (`protocol_pinned`), pins the model, the
    optimiser, the batch and the step budget (no silent defaults)."""
    required = {
        "model.dim",
        "model.depth",
        "model.num_heads",
        "model.head_dim",
        "model.ffn_dim",
        "model.dropout",
        "model.pooling",
        "model.head_hidden",
        "optim.lr",
        "optim.weight_decay",
        "optim.warmup_steps",
        "optim.schedule",
        "data.batch_size",
        "trainer.max_steps",
        "trainer.val_check_interval",
        "trainer.limit_val_batches",
    }
    for protocol in PROTOCOLS:
        for task in TASKS:
            keys = set(flatten(recipe(protocol, task))) | protocol_pinned(protocol)
            assert required <= keys, f"{protocol}_{task}.yaml lacks {sorted(required - keys)}"
