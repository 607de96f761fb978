"""The config tree's shape (lightning-hydra-template's): a protocol holds what its tasks share, a recipe only what
its task changes; `callbacks/` only callbacks; the leaderboard experiments sweep the registry's attentions."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from lra_bench.registry import ATTENTIONS
from tests.conftest import CONF, compose
from tests.test_protocols import PROTOCOLS, TASKS, flatten, recipe

SHARED_SECTIONS = ("model", "optim")  # what a protocol shares across its tasks (conf/model/, conf/optim/)


def shared_part(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flatten(node).items() if k.split(".")[0] in SHARED_SECTIONS}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_recipes_hold_only_what_their_task_changes(protocol: str) -> None:
    """A model or optimiser value belongs in the recipe only when its task changes it: a value that every recipe of
    the protocol sets alike belongs to the protocol's options, and a recipe value the protocol already gives (the
    config composed without the recipe) is a restatement — unless the key is set per task by every recipe
    (warm-up steps, a learning rate that differs between tasks)."""
    rows = {task: shared_part(recipe(protocol, task)) for task in TASKS}
    per_task = set.intersection(*(set(row) for row in rows.values()))
    alike = sorted(k for k in per_task if len({repr(row[k]) for row in rows.values()}) == 1)
    assert not alike, f"every {protocol} recipe sets {alike} alike: the protocol's (conf/protocol/{protocol}.yaml)"
    restated = []
    for task, row in rows.items():
        without = flatten(OmegaConf.to_container(compose([f"protocol={protocol}", f"task={task}", "~recipe"])))
        restated += [f"{protocol}_{task}: {k}={v!r}" for k, v in row.items() if k not in per_task and without[k] == v]
    assert not restated, f"recipes restate what their protocol gives: {restated}"


def test_callbacks_group_holds_only_callbacks() -> None:
    """Each option of `callbacks/` is Lightning callbacks only (`_target_` nodes); the harness's own settings are
    `callbacks.*` in conf/config.yaml (their keys kept: two of them are part of every run's fingerprint)."""
    for path in sorted((CONF / "callbacks").glob("*.yaml")):
        node = OmegaConf.to_container(OmegaConf.load(path)) or {}
        assert isinstance(node, dict)
        bad = [k for k, v in node.items() if not (isinstance(v, dict) and "_target_" in v)]
        assert not bad, f"callbacks/{path.name}: {bad} are not callbacks (a `_target_` node each)"
    cfg = compose([])
    assert set(cfg.callbacks) == {"progress_bar", "status_every_s", "checkpoint_every_n_steps", "stats_warmup_steps"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_leaderboard_experiments_sweep_the_registry_attentions(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swept attentions are the registry's, read when the sweep is read: a newly registered attention joins
    every leaderboard without an edit."""
    registered = ATTENTIONS.names()
    expected = list(registered)
    cfg = compose([f"experiment=leaderboard/{protocol}"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params.attn.split(",") == expected
    monkeypatch.setattr(ATTENTIONS, "names", lambda: sorted([*registered, "zz_new"]))
    cfg = compose([f"experiment=leaderboard/{protocol}"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params.attn.split(",") == [*expected, "zz_new"]
