"""Fair tuning: the `hparams_search=optuna` config, the `tuned` resolver and `tuning=tuned`, and (slow) a real
two-trial Optuna search on CPU followed by a final run that records the chosen values."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from lra_bench.config.validate import check_resolvable
from lra_bench.errors import ConfigError
from lra_bench.record import results
from lra_bench.record.identity import config_identity
from lra_bench.sweep.tuning import FILENAME, OPTUNA_RESULTS, write_result
from tests.conftest import TINY_LISTOPS, compose, run_cli

SPACE = {
    "optim.lr": "tag(log, interval(1e-5, 3e-3))",
    "optim.warmup_steps": "int(interval(0, 2000))",
    "model.dropout": "interval(0.0, 0.3)",
}


def test_search_config_gives_every_method_the_same_budget_space_and_sampler_seed() -> None:
    for attn in ("gpa", "nystrom"):
        cfg = compose([f"attn={attn}", "hparams_search=optuna", "tuning.budget=7"], return_hydra_config=True)
        sweeper = cfg.hydra.sweeper
        assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
        assert sweeper.n_trials == 7 and sweeper.sampler.seed == 0  # both follow tuning.*
        assert dict(sweeper.params) == SPACE
        assert cfg.test is False and cfg.tuning.role == "trial"  # trials never look at the test split
        assert (
            cfg.hydra.mode.name == "MULTIRUN"
            and cfg.hydra.callbacks.tuning._target_ == "lra_bench.sweep.tuning.TuningCallback"
        )
    assert "tuning" not in compose(["attn=gpa"])  # untuned runs carry no tuning keys (their identity is unchanged)


def _fake_search(tmp_path: Path) -> Path:
    """A finished search dir: the Optuna sweeper's own result file, then ours from the search's config."""
    cfg = compose(["attn=gpa", "hparams_search=optuna", "tuning.budget=3"], return_hydra_config=True)
    OmegaConf.save(
        OmegaConf.create({"name": "optuna", "best_params": {"optim.lr": 3.1e-4, "optim.warmup_steps": 420,
                                                            "model.dropout": 0.05}, "best_value": 0.41}),
        tmp_path / OPTUNA_RESULTS,
    )  # fmt: skip
    write_result(cfg, tmp_path)
    return tmp_path


def test_tuned_runs_resolve_the_chosen_values_into_their_config(tmp_path: Path) -> None:
    search = _fake_search(tmp_path)
    saved = OmegaConf.load(search / FILENAME)
    assert saved.budget == 3 and saved.trials_completed == 0 and dict(saved.space) == SPACE
    cfg = compose(["attn=gpa", "tuning=tuned", f"tuning.search_dir={search}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["optim"]["lr"] == 3.1e-4 and resolved["optim"]["warmup_steps"] == 420
    assert resolved["model"]["dropout"] == 0.05
    assert resolved["tuning"] == {
        "role": "tuned",
        "search_dir": str(search),
        "budget": 3,
        "sampler_seed": 0,
        "space": SPACE,
        "best_val_acc": 0.41,
    }
    identity = config_identity(resolved)  # what compare reads: budget and space are part of the experiment
    assert identity["tuning.budget"] == 3 and identity["tuning.space.optim.lr"] == SPACE["optim.lr"]


def test_a_bad_or_missing_search_dir_is_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no tuning.yaml there — give the sweep dir of a finished"):
        check_resolvable(compose(["tuning=tuned", f"tuning.search_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"Missing mandatory value: tuning.search_dir"):
        check_resolvable(compose(["tuning=tuned"]))
    proc = run_cli(["tuning=tuned", f"tuning.search_dir={tmp_path}", *TINY_LISTOPS], tmp_path, check=False)
    (line,) = proc.stderr.strip().splitlines()  # run.py: one line, exit 2, nothing built
    assert (
        proc.returncode == 2 and line.startswith("error: ") and f"tuning.search_dir={tmp_path}: no tuning.yaml" in line
    )
    cfg = compose(["attn=gpa"])
    with open_dict(cfg):
        cfg.optim.lr = "${oc.env:LRA_TEST_UNSET_VARIABLE}"
    with pytest.raises(ConfigError, match=r"optim.lr: .*LRA_TEST_UNSET_VARIABLE"):
        check_resolvable(cfg)


@pytest.mark.slow
def test_optuna_search_runs_two_trials_end_to_end_then_a_tuned_run_records_them(tmp_path: Path) -> None:
    sweep = tmp_path / "search"
    proc = run_cli(["hparams_search=optuna", "tuning.budget=2", *TINY_LISTOPS, f"hydra.sweep.dir={sweep}"], tmp_path)
    trials = [results.read_record(p) for p in sweep.rglob(results.FILENAME)]
    assert len(trials) == 2 and all(t["status"] == "completed" for t in trials)
    assert all(t["metrics"]["test_acc"] is None and t["metrics"]["val_acc"] is not None for t in trials)
    assert all(t["config"]["tuning"]["role"] == "trial" and t["config"]["tuning"]["space"] == SPACE for t in trials)
    lrs = [t["config"]["optim"]["lr"] for t in trials]
    assert lrs[0] != lrs[1] and all(1e-5 <= lr <= 3e-3 for lr in lrs)  # Optuna sampled them from the space
    saved = OmegaConf.to_container(OmegaConf.load(sweep / FILENAME))
    assert saved["budget"] == 2 and saved["trials_completed"] == 2
    best = max(trials, key=lambda t: t["metrics"]["val_acc"])
    assert saved["best_value"] == pytest.approx(best["metrics"]["val_acc"])
    assert saved["values"]["optim.lr"] in lrs

    command = next(line for line in proc.stdout.splitlines() if "final runs:" in line).split("final runs: ")[1]
    args = shlex.split(command)[2:]  # drop "python run.py"
    assert "tuning=tuned" in args and f"tuning.search_dir={sweep.resolve()}" in args and "seed=0,1,2" in args
    args = [a if a != "seed=0,1,2" else "seed=0" for a in args] + [f"hydra.sweep.dir={tmp_path / 'final'}"]
    run_cli(args, tmp_path)
    (final,) = [results.read_record(p) for p in (tmp_path / "final").rglob(results.FILENAME)]
    assert final["status"] == "completed" and final["metrics"]["test_acc"] is not None
    assert final["config"]["optim"]["lr"] == saved["values"]["optim.lr"]
    assert final["config"]["optim"]["warmup_steps"] == saved["values"]["optim.warmup_steps"]
    assert final["config"]["model"]["dropout"] == saved["values"]["model.dropout"]
    assert final["config"]["tuning"]["role"] == "tuned" and final["config"]["tuning"]["budget"] == 2
