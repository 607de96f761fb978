"""Fair tuning: the `hparams_search=optuna` config, the Optuna sweeper's search space and ask-and-tell loop (a fake
launcher), the `tuned` resolver and `tuning=tuned`, and (slow) real Optuna searches on CPU: one followed by a final
run that records the chosen values, two that draw the same trials from the same sampler seed."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hydra_plugins.lra_bench_sweeper import optuna_sweeper
from hydra_plugins.lra_bench_sweeper._optuna_space import render, search_space
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


def test_the_search_space_reads_hydras_grammar_as_optuna_distributions() -> None:
    lines = [f"{k}={v}" for k, v in SPACE.items()]
    extra = ["attn=choice(gpa, nystrom)", "model.depth=range(1, 4)", "seed=3", "+notes.owner=me", "model.dropout=0.1"]
    space = search_space(OverridesParser.create(), [*lines, *extra])
    assert space.distributions == {
        "optim.lr": FloatDistribution(1e-5, 3e-3, log=True),
        "optim.warmup_steps": IntDistribution(0, 2000),
        "attn": CategoricalDistribution(["gpa", "nystrom"]),
        "model.depth": IntDistribution(1, 3),  # Hydra's range: the stop is not a value
    }
    assert space.fixed == ["seed=3", "+notes.owner=me", "model.dropout=0.1"]  # the command line's value wins
    assert space.overrides({"optim.lr": 1e-4, "attn": "gpa"}) == [*space.fixed, "optim.lr=0.0001", "attn=gpa"]
    parser = OverridesParser.create()
    for value in ("a b", "1", "null", "it's", 2, 0.5, True, None, "x=y"):  # every value reads back as itself
        assert parser.parse_override(f"key={render(value)}").value() == value, value
    for bad, why in [
        ("optim.lr=tag(logg, interval(1e-5, 1e-3))", "unknown tag logg"),
        ("optim.lr=interval(1e-3, 1e-5)", "optim.lr=interval"),
        ("attn=choice([1, 2], [3])", "scalars only"),
        ("optim.lr=interval(1e-5", r"hydra.sweeper.params: optim.lr=interval\(1e-5: no viable alternative"),
    ]:
        with pytest.raises(ConfigError, match=why):
            search_space(OverridesParser.create(), [bad])


def _sweeper(tmp_path: Path, outcomes: list[object], max_failure_rate: float) -> optuna_sweeper.OptunaSweeper:
    """The sweeper with a fake launcher: the i-th job launched returns `outcomes[i]` (an exception: the job raised
    it)."""

    def launch(jobs: list[list[str]], initial_job_idx: int) -> list[JobReturn]:
        returns = []
        for i, job in enumerate(jobs):
            value = outcomes[initial_job_idx + i]
            status = JobStatus.FAILED if isinstance(value, Exception) else JobStatus.COMPLETED
            returns.append(JobReturn(overrides=job, status=status))
            returns[-1].return_value = value
        return returns

    sweeper = optuna_sweeper.OptunaSweeper(
        sampler=optuna.samplers.TPESampler(seed=0), direction="maximize", storage=None, study_name="fake",
        n_trials=6, n_jobs=2, max_failure_rate=max_failure_rate, params={"model.dropout": "interval(0.0, 0.4)"},
    )  # fmt: skip
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "sweeper": {"sampler": {}}}})
    sweeper.hydra_context = SimpleNamespace(config_loader=None)  # type: ignore[assignment]
    sweeper.launcher = SimpleNamespace(launch=launch)  # type: ignore[assignment]
    return sweeper


def _states(sweep: Path) -> tuple[list[str], dict]:
    found = OmegaConf.to_container(OmegaConf.load(sweep / OPTUNA_RESULTS))
    assert [t["number"] for t in found["trials"]] == list(range(len(found["trials"])))
    return [t["state"] for t in found["trials"]], found


def test_a_failed_trial_is_told_as_failed_and_the_best_completed_one_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(optuna_sweeper, "check_jobs", lambda context, config, jobs, varying: jobs)
    outcomes = [0.5, RuntimeError("loss is NaN"), None, 0.7, float("nan"), 0.6]  # raised, no number, not finite
    _sweeper(tmp_path, outcomes, max_failure_rate=1.0).sweep(["seed=1"])
    states, found = _states(tmp_path)
    assert states == ["COMPLETE", "FAIL", "FAIL", "COMPLETE", "FAIL", "COMPLETE"]
    assert [t["value"] for t in found["trials"]] == [0.5, None, None, 0.7, None, 0.6]
    assert found["best_value"] == 0.7 and found["best_params"] == found["trials"][3]["params"]
    assert (tmp_path / "multirun.yaml").is_file()

    # half a batch may fail under max_failure_rate=0.5; the old plugin's default 0 stops at any failure, with the
    # job's own error
    failing = [RuntimeError("loss is NaN"), 0.5] * 3
    _sweeper(tmp_path / "half", failing, max_failure_rate=0.5).sweep([])
    assert _states(tmp_path / "half")[0] == ["FAIL", "COMPLETE"] * 3
    with pytest.raises(RuntimeError, match="loss is NaN"):
        _sweeper(tmp_path / "strict", failing, max_failure_rate=0.0).sweep([])
    assert not (tmp_path / "strict" / OPTUNA_RESULTS).exists()

    # an incompatible combination (left out by the checks) is told as failed, never launched
    monkeypatch.setattr(optuna_sweeper, "check_jobs", lambda context, config, jobs, varying: jobs[1:])
    _sweeper(tmp_path / "skip", [0.1, 0.2, 0.3], max_failure_rate=0.0).sweep([])
    states, found = _states(tmp_path / "skip")
    assert states == ["FAIL", "COMPLETE"] * 3 and [t["value"] for t in found["trials"]] == [
        None,
        0.1,
        None,
        0.2,
        None,
        0.3,
    ]


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


def _trials(sweep: Path) -> list[tuple[float, int, float]]:
    """The (lr, warm-up, dropout) each trial of a search ran with, from the trials' own records."""
    records = [results.read_record(p) for p in sweep.rglob(results.FILENAME)]
    ran = [(r["config"]["optim"]["lr"], r["config"]["optim"]["warmup_steps"], r["config"]["model"]["dropout"])
           for r in records]  # fmt: skip
    return sorted(ran)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_search_on_current_optuna_draws_the_same_trials_for_the_same_sampler_seed(tmp_path: Path) -> None:
    assert int(optuna.__version__.split(".")[0]) >= 5, f"optuna {optuna.__version__}: the search runs on Optuna 5"
    args = ["hparams_search=optuna", "tuning.budget=2", "tuning.sampler_seed=7", *TINY_LISTOPS]
    sweeps = [tmp_path / "a", tmp_path / "b"]
    for sweep in sweeps:
        run_cli([*args, f"hydra.sweep.dir={sweep}"], tmp_path)
    first, second = (_trials(sweep) for sweep in sweeps)
    assert len(first) == 2 and first[0] != first[1]  # two trials, drawn apart
    assert first == second  # the sampler seed fixes the trials: a search is repeatable
    saved = OmegaConf.to_container(OmegaConf.load(sweeps[0] / FILENAME))
    assert saved["sampler_seed"] == 7 and saved["sampler"]["seed"] == 7 and saved["trials_completed"] == 2
    chosen = (saved["values"]["optim.lr"], saved["values"]["optim.warmup_steps"], saved["values"]["model.dropout"])
    assert chosen in first  # tuning.yaml holds one trial's values: the best one's
