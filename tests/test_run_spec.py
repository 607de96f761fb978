"""A run's configuration is settled once (`lra_bench.config.spec.settle`): checked, derived keys filled, identity and
protocol check made; the stage receives that specification, read-only, and records exactly it."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from lra_bench.config.spec import settle
from lra_bench.errors import ConfigError
from lra_bench.record.identity import config_identity
from lra_bench.run.entry import run_stage
from tests.conftest import TINY_LISTOPS, compose


def _cfg(tmp_path: Path, *overrides: str):
    return compose([*TINY_LISTOPS, f"data_dir={tmp_path / 'data'}", *overrides])


def test_settle_fills_the_derived_keys_in_a_read_only_copy(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    given = OmegaConf.to_container(cfg)
    spec = settle(cfg, tmp_path / "run")
    assert OmegaConf.to_container(cfg) == given  # the caller's config is left as given
    assert cfg.get("pretraining") is None and spec.config.pretraining == "none"  # derived in the spec only
    with pytest.raises(ReadonlyConfigError):
        spec.config.seed = 7
    with pytest.raises(ReadonlyConfigError):
        spec.config.model.dim = 32
    assert spec.identity == config_identity(spec.resolved)
    assert spec.resolved["pretraining"] == "none" and spec.trains
    assert set(spec.protocol) == {"off_protocol", "deviations"}
    assert spec.protocol["off_protocol"] is True and "trainer.max_steps" in spec.protocol["deviations"]


def test_settle_refuses_a_bad_config_in_one_line_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.batch_size=0"):
        settle(_cfg(tmp_path, "data.batch_size=0"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_stage_records_the_specification_it_was_given(tmp_path: Path) -> None:
    """Through the entry a run takes: the record holds the settled config and the protocol check settle made."""
    cfg, out = _cfg(tmp_path), tmp_path / "run"
    record = run_stage(cfg, out)
    assert record["status"] == "completed"
    spec = settle(cfg, out)
    assert record["config"] == spec.resolved
    assert record["off_protocol"] == spec.protocol["off_protocol"]
    assert record["deviations"] == spec.protocol["deviations"]
    assert {k: v for k, v in record["identity"].items() if k in spec.identity} == spec.identity
