"""Config tree: every option composes, registries and YAML agree, mistakes fail early with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lra_bench.config.validate import validate
from lra_bench.errors import ConfigError
from lra_bench.registry import ATTENTIONS, SELECTORS, TASKS
from tests.conftest import CONF, REPO, compose


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_yaml_options_and_registries_agree() -> None:
    assert options("attn") == ATTENTIONS.names()
    assert options("selector") == sorted([*SELECTORS.names(), "none"])
    assert set(options("task")) == set(TASKS.names())


@pytest.mark.parametrize("attn", options("attn"))
def test_every_attention_composes_and_validates(attn: str) -> None:
    cfg = compose([f"attn={attn}"])
    assert cfg.attn.name == attn
    takes = ATTENTIONS.get(attn).takes_selector
    assert (cfg.selector.name != "none") == takes, "landmark attentions bring their paper's selector"
    validate(cfg)


@pytest.mark.parametrize("selector", [s for s in options("selector") if s != "none"])
def test_every_selector_composes_on_nystrom(selector: str) -> None:
    cfg = compose(["attn=nystrom", f"selector={selector}"])
    assert cfg.selector.name == selector
    validate(cfg)


@pytest.mark.parametrize("group", ["trainer", "logger", "callbacks", "debug", "protocol", "model", "optim"])
def test_every_other_option_composes(group: str) -> None:
    """Each option composes, passes the run-start checks, and its own values are what the composed config holds."""
    from lra_bench.record.identity import flatten

    recipe = OmegaConf.to_container(OmegaConf.load(CONF / "recipe" / "nystromformer_listops.yaml"))
    by_recipe = set(flatten(recipe))  # the protocol's row comes after trainer/logger/callbacks: its values win
    for option in options(group):
        cfg = compose([f"{group}={option}"])
        validate(cfg)
        path = CONF / group / f"{option}.yaml"
        package = "" if path.read_text().startswith("# @package _global_") else f"{group}."
        node = OmegaConf.load(path)
        own = flatten({k: v for k, v in OmegaConf.to_container(node).items() if k != "defaults"})
        for key, value in own.items():
            if (isinstance(value, str) and "${" in value) or package + key in by_recipe:
                continue  # an interpolation (resolved against the run's config), or a value the recipe sets
            got = OmegaConf.select(cfg, package + key)
            got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
            assert got == value, f"{group}={option}: {package}{key} is {got!r}, the option says {value!r}"


def test_cfg_job_prints_the_composed_config(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    proc = run_cli(["--cfg", "job", "task=listops", "attn=nystrom"], tmp_path)
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.attn.name == "nystrom" and cfg.selector.name == "segment_means"
    assert cfg.trainer.max_steps == 5000 and cfg.data.batch_size == 32 and cfg.task.seq_len == 2048


@pytest.mark.parametrize("argv", [["--help"], ["--cfg", "job", "task=listops", "attn=nystrom"]])
def test_the_cli_answers_without_importing_torch(argv: list[str]) -> None:
    """What keeps `--help` under a second and `--cfg job` near 0.3 s on 2 cores: neither imports torch or Lightning
    (a module-level `from models… import` in the pre-flight once made them 2.5 s and 1.8 s). `-X importtime` lists
    every module the process imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(REPO / "run.py"), *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_MODE": "disabled"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert imported and not imported & {"torch", "pytorch_lightning", "lightning_fabric"}, sorted(
        imported & {"torch", "pytorch_lightning", "lightning_fabric"}
    )


def test_faithful_nystromformer_listops_protocol() -> None:
    cfg = compose(["task=listops", "attn=nystrom"])
    m, o = cfg.model, cfg.optim
    assert (m.depth, m.dim, m.ffn_dim, m.num_heads, m.head_dim, m.pooling) == (2, 64, 128, 2, 32, "mean_legacy")
    assert (o.lr, o.eps, o.weight_decay, o.warmup_steps, o.schedule) == (1e-4, 1e-6, 0.0, 1000, "onecycle")
    assert (cfg.attn.pinv_init, cfg.selector.over) == ("original", "padded")
    assert (cfg.data.batch_size, cfg.trainer.max_steps, cfg.task.max_length, cfg.task.seq_len) == (32, 5000, 2000, 2048)


def test_unknown_option_lists_valid_ones(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    proc = run_cli(["attn=nope"], tmp_path, check=False)
    assert proc.returncode != 0
    assert "Could not find 'attn/nope'" in proc.stderr and "nystrom" in proc.stderr and "full" in proc.stderr


def test_misspelt_key_fails_at_compose_time() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose(["attn=nystrom", "attn.num_landmark=32"])
    with pytest.raises(ConfigCompositionException):
        compose(["task.seq_length=100"])


def test_schema_rejects_a_misspelt_key_inside_an_option_file(tmp_path: Path) -> None:
    """A YAML option carrying a key its component's schema lacks fails before anything is built (one line naming
    the key and the valid ones), not silently ignored."""
    import shutil

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    nystrom = (conf / "attn" / "nystrom.yaml").read_text()
    (conf / "attn" / "typo.yaml").write_text(nystrom + "num_landmrks: 8\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["attn=typo"])
    GlobalHydra.instance().clear()
    with pytest.raises(ConfigError, match=r"^attn\.num_landmrks: .*attn=nystrom takes: name, num_landmarks"):
        validate(cfg)


def test_schema_checks_types_and_converts() -> None:
    with pytest.raises(ConfigError, match=r"^attn\.pinv_iterations: .*'abc'"):
        validate(compose(["attn=nystrom", "attn.pinv_iterations=abc"]))
    cfg = compose(["attn=nystrom", "attn.pinv_iterations='7'"])
    validate(cfg)
    assert cfg.attn.pinv_iterations == 7 and isinstance(cfg.attn.pinv_iterations, int)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["attn=nystrom", "attn.num_landmarks=4096"], "attn.num_landmarks=4096 exceeds task.seq_len=2048"),
        (["attn=nystrom", "attn.num_landmarks=log3"], "attn.num_landmarks='log3'"),
        (["data.batch_size=33", "trainer.devices=2"], "data.batch_size=33 is not divisible by trainer.devices"),
        (["attn=full", "selector=segment_means"], "selector=segment_means: attn=full takes no landmark selector"),
        (["attn=nystrom", "selector=none"], "selector=none: attn=nystrom needs a landmark selector"),
        (["model.pooling=max"], "model.pooling='max': expected one of mean, mean_legacy, cls"),
        (["optim.schedule=exp"], "optim.schedule='exp'"),
    ],
)
def test_cross_field_mistakes_fail_with_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_cross_field_mistake_from_the_cli_is_one_line(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    proc = run_cli(["attn=nystrom", "attn.num_landmarks=4096"], tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: attn.num_landmarks=4096 exceeds task.seq_len")
    assert "Traceback" not in proc.stderr


def test_same_command_same_run_dir_and_overrides_change_it() -> None:
    a = compose(["task=listops", "seed=1"], return_hydra_config=True)
    b = compose(["seed=1", "task=listops"], return_hydra_config=True)
    c = compose(["task=listops", "seed=2"], return_hydra_config=True)
    dirs = [OmegaConf.to_container(x.hydra.run, resolve=False)["dir"] for x in (a, b, c)]
    assert dirs[0] == dirs[1] == dirs[2]  # same template; the resolved value depends on override_dirname


def test_rsqrt_schedule_is_the_lra_jax_one() -> None:
    import math

    from lra_bench.run.module import lr_lambda

    f = lr_lambda("rsqrt", warmup=1000, total=5000)
    assert math.isclose(f(999), 1 / math.sqrt(1000))  # peak at the end of warm-up: base/sqrt(w)
    assert math.isclose(f(499), 0.5 / math.sqrt(1000))
    assert math.isclose(f(3999), 1 / math.sqrt(4000))
    lin = lr_lambda("linear", warmup=10, total=110)
    assert math.isclose(lin(4), 0.5) and math.isclose(lin(60), 0.5) and lin(200) == 0.0


def test_recipe_values_win_over_trainer_defaults() -> None:
    cfg = compose(["task=listops", "protocol=nystromformer"])
    assert cfg.trainer.limit_val_batches == 62 and cfg.trainer.val_check_interval == 50
    cfg = compose(["task=listops", "protocol=nystromformer", "trainer.limit_val_batches=3"])
    assert cfg.trainer.limit_val_batches == 3
