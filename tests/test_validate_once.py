"""One config, one check: the run path (`run_stage`, `stage=spt`'s plan) checks a config only when this process has
not accepted an equal one already (the pre-flight's, the sweeper's), and still leaves its components typed."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from lra_bench.config import validate as checks
from lra_bench.errors import ConfigError
from tests.conftest import compose


def test_an_accepted_config_is_checked_once_and_a_new_one_always(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "_ACCEPTED", set())
    calls: list[int] = []
    rules = checks.check_rules
    monkeypatch.setattr(checks, "check_rules", lambda cfg: (calls.append(1), rules(cfg))[1])
    checks.validate(compose(["attn=nystrom"]))  # the pre-flight's check of the config it composed
    again = compose(["attn=nystrom"])  # what Hydra composes for the run: equal values, another object
    checks.validate_once(again)
    assert calls == [1]
    assert OmegaConf.get_type(again.attn) is not dict  # typed by its dataclass, as `validate` leaves it
    checks.validate_once(compose(["attn=nystrom", "seed=1"]))  # another config: checked
    assert calls == [1, 1]
    with pytest.raises(ConfigError, match="data.batch_size=0"):
        checks.validate_once(compose(["attn=nystrom", "data.batch_size=0"]))
