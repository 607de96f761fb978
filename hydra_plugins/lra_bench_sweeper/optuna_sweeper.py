"""`OptunaSweeper`: fair tuning's search (`hparams_search=optuna`, `hydra/sweeper=lra_optuna`) on Optuna's own
ask-and-tell API.

Why our own: hydra-optuna-sweeper 1.3, the plugin this replaced, pins `optuna<3` (2.10, of 2021), so the search ran on
an Optuna four majors old and kept every other package of the environment within that pin's reach. The loop it needs
is short in Optuna's public API: ask `n_jobs` trials (each with the space's distributions, `study.ask`), launch them
as one batch through Hydra's launcher (basic, joblib or SLURM), tell each its value (`study.tell`) or that it failed.

The semantics are the old plugin's: `sampler` is instantiated by Hydra (TPE by default, seeded by `sampler.seed`),
`n_trials` trials per invocation, `direction`, `study_name`, `storage` (a database URL keeps a study across
invocations; null: in memory), `n_jobs` trials per batch, the space in `hydra.sweeper.params` (see `_optuna_space`),
`max_failure_rate` (the share of a batch that may fail before the search stops with the failed job's error; 0: any
failure stops it). And the project's own: every trial is composed and checked before its batch launches
(`sweeper.check_jobs`, as `ValidatingSweeper` checks a grid): a trial that cannot be an experiment stops the search
with one line; an incompatible combination is told to Optuna as failed, not launched. A trial that ran and raised,
or returned no finite number, is told as failed too. At the end `<sweep dir>/optimization_results.yaml` holds the
best trial's values (what `lra_bench.sweep.tuning` reads) and every trial's.

Light at import (Hydra's plugin scan imports this module in every run): Optuna loads when a search starts. No
`from __future__ import annotations`: the scan runs the module before it is in `sys.modules`, where a dataclass with
string annotations cannot look its module up.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.lra_bench_sweeper.sweeper import check_jobs, refuse

if TYPE_CHECKING:
    from optuna import Study
    from optuna.samplers import BaseSampler
    from optuna.trial import Trial

    from hydra_plugins.lra_bench_sweeper._optuna_space import SearchSpace


class Direction(str, Enum):
    """What the search does with a trial's value (a str enum: composing refuses any other word)."""

    minimize = "minimize"
    maximize = "maximize"


@dataclass
class OptunaSweeperConf:
    """`hydra/sweeper=lra_optuna`: the one place of the sweeper's defaults (conf/hparams_search/optuna.yaml sets
    what fair tuning uses)."""

    _target_: str = "hydra_plugins.lra_bench_sweeper.optuna_sweeper.OptunaSweeper"
    sampler: dict[str, Any] = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler", "seed": None})
    direction: Direction = Direction.minimize
    storage: str | None = None
    study_name: str | None = None
    n_trials: int = 20
    n_jobs: int = 1
    max_failure_rate: float = 0.0
    params: dict[str, str] | None = None


ConfigStore.instance().store(group="hydra/sweeper", name="lra_optuna", node=OptunaSweeperConf, provider="lra_bench")


class OptunaSweeper(Sweeper):
    def __init__(
        self,
        sampler: "BaseSampler",
        direction: Direction | str,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        params: DictConfig | dict[str, str] | None,
    ) -> None:
        self.sampler = sampler
        self.direction = Direction(direction)
        self.storage = storage
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = max_failure_rate
        self.params = {str(key): str(value) for key, value in (params or {}).items()}
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        import optuna
        from optuna.study import StudyDirection

        from hydra_plugins.lra_bench_sweeper._optuna_space import search_space
        from lra_bench.errors import ConfigError

        assert self.hydra_context is not None and self.config is not None
        self._check_settings()
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        try:
            space = search_space(parser, [*(f"{k}={v}" for k, v in self.params.items()), *arguments])
        except ConfigError as err:
            refuse(str(err))
        if not space.distributions:
            refuse("hydra.sweeper.params: nothing to search (give a key an interval(...) or a choice(...))")
        study = optuna.create_study(
            study_name=self.study_name,
            storage=self.storage,
            sampler=self.sampler,
            direction=StudyDirection[self.direction.name.upper()],
            load_if_exists=True,
        )
        seed = OmegaConf.select(self.config, "hydra.sweeper.sampler.seed")
        print(
            f"[lra-bench] search: Study name {study.study_name} ({self.storage or 'in memory'}): "
            f"{type(self.sampler).__name__} seed {seed}, {self.direction.value}, {self.n_trials} trials, "
            f"{self.n_jobs} at a time",
            flush=True,
        )
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        job_idx = 0
        for first in range(0, self.n_trials, self.n_jobs):
            trials = [study.ask(space.distributions) for _ in range(min(self.n_jobs, self.n_trials - first))]
            job_idx += self._run_batch(study, space, trials, job_idx)
        self._save_results(study, sweep_dir)

    def _check_settings(self) -> None:
        if self.n_trials < 1 or self.n_jobs < 1:
            refuse(f"hydra.sweeper: n_trials={self.n_trials}, n_jobs={self.n_jobs}: both must be at least 1")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            refuse(f"hydra.sweeper.max_failure_rate={self.max_failure_rate}: expected a share in [0, 1]")

    def _run_batch(self, study: "Study", space: "SearchSpace", trials: Sequence["Trial"], job_idx: int) -> int:
        """Check, launch and tell one batch of asked trials; the number of jobs launched."""
        from optuna.trial import TrialState

        assert self.hydra_context is not None and self.config is not None and self.launcher is not None
        jobs = [space.overrides(trial.params) for trial in trials]
        kept = check_jobs(self.hydra_context, self.config, jobs, set(space.distributions))
        launched = [(trial, job) for trial, job in zip(trials, jobs) if any(job is k for k in kept)]
        for trial in trials:
            if not any(trial is t for t, _ in launched):  # an incompatible combination: never an experiment
                study.tell(trial, state=TrialState.FAIL)
        if not launched:
            return 0
        returns = self.launcher.launch([job for _, job in launched], initial_job_idx=job_idx)
        failed = []
        for (trial, _), ret in zip(launched, returns):
            value, why = _objective(ret)
            if value is None:
                study.tell(trial, state=TrialState.FAIL)
                failed.append(ret)
                print(f"[lra-bench] search: trial {trial.number} failed: {why}", flush=True)
            else:
                study.tell(trial, value)
                print(f"[lra-bench] search: trial {trial.number}: {value:.6g} {_best(study)}", flush=True)
        if failed and len(failed) / len(returns) > self.max_failure_rate:
            print(
                f"[lra-bench] search: {len(failed)} of {len(returns)} trials of a batch failed "
                f"(max_failure_rate={self.max_failure_rate}): stopping",
                flush=True,
            )
            _ = failed[0].return_value  # raises the job's own error, as Hydra's basic sweeper does
            raise RuntimeError(f"trial failed: {_objective(failed[0])[1]}")  # returned no number (no error to raise)
        return len(returns)

    def _save_results(self, study: "Study", sweep_dir: Path) -> None:
        from optuna.trial import TrialState

        from lra_bench.sweep.tuning import OPTUNA_RESULTS

        done = [t for t in study.trials if t.state == TrialState.COMPLETE]
        best = study.best_trial if done else None
        results = {
            "name": "optuna",
            "study_name": study.study_name,
            "direction": self.direction.value,
            "best_params": dict(best.params) if best else None,
            "best_value": best.value if best else None,
            "trials": [
                {"number": t.number, "state": t.state.name, "value": t.value, "params": dict(t.params)}
                for t in study.trials
            ],
        }
        OmegaConf.save(OmegaConf.create(results), sweep_dir / OPTUNA_RESULTS)
        if best is None:
            refuse(f"the search completed none of its {len(study.trials)} trials: nothing to choose (see above)")
        print(f"[lra-bench] search: best {best.value:.6g} at trial {best.number}: {best.params}", flush=True)


def _objective(ret: JobReturn) -> tuple[float | None, str]:
    """A launched trial's value, or None and why it counts as failed."""
    try:
        value = ret.return_value  # a failed job's error is raised here (Hydra names its overrides on stderr)
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, f"it returned {value!r}, not a finite number"
    return float(value), ""


def _best(study: "Study") -> str:
    best = study.best_trial
    return f"(best {best.value:.6g}, trial {best.number})"
