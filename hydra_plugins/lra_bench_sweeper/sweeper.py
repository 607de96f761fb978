"""`ValidatingSweeper`: Hydra's basic sweeper (the same cross product, batches and `hydra.sweeper.params`), but
every job is composed and checked before the first one is launched.

Why: a sweep's jobs used to fail one by one inside the launcher (on SLURM: after queueing) for mistakes knowable at
submission — a misspelt option in one value, a type error, and combinations that cannot go together. The README's
own `attn=nystrom,spectral,pivoted selector=uniform,segment_means,kmeans,pivoted_qr` holds two (pivoted needs token
landmarks; segment means and k-means are cluster means). Now:

* a job whose config does not compose, or fails a check (`lra_bench.run.build.check_run_config`), stops the whole
  sweep before anything is written: one line naming the job, exit 2;
* a job that is an `IncompatibleCombination` is left out with one line saying why (its siblings still run); a sweep
  with nothing left is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

# private to Hydra, but its basic sweeper has no public home: subclassed to keep its cross product and batches
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


def _job(overrides: Sequence[str], varying: set[str]) -> str:
    """The job's name: the overrides that vary across the sweep (all of them when none varies)."""
    shown = [o for o in overrides if o.split("=", 1)[0] in varying] or list(overrides)
    return " ".join(shown)


def refuse(message: str) -> NoReturn:
    """Stop the sweep before it launches anything more: one line on stderr, exit 2 (bad input)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class ValidatingSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)

    def split_arguments(  # type: ignore[override]  # an instance method here: it needs the config loader
        self, overrides: list[Override], max_batch_size: int | None
    ) -> list[list[list[str]]]:
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        varying = {o.get_key_element() for o in overrides if o.is_sweep_override()}
        assert self.hydra_context is not None and self.config is not None
        kept = check_jobs(self.hydra_context, self.config, jobs, varying)
        if not kept:
            refuse(f"every one of the {len(jobs)} jobs of this sweep is an incompatible combination (see above)")
        if len(kept) < len(jobs):
            skipped = len(jobs) - len(kept)
            print(f"[lra-bench] sweep: launching {len(kept)} of {len(jobs)} jobs ({skipped} skipped)", flush=True)
        if max_batch_size is None:
            return [kept]
        return [kept[i : i + max_batch_size] for i in range(0, len(kept), max_batch_size)]


def check_jobs(
    hydra_context: HydraContext, config: DictConfig, jobs: list[list[str]], varying: set[str]
) -> list[list[str]]:
    """The jobs that can run, each composed as the launcher will compose it and checked: an incompatible
    combination is left out with one line; anything else wrong stops the sweep (one line, exit 2). Shared by every
    sweeper of this package (the Optuna sweeper checks each batch of trials with it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lra_bench.errors import ConfigError, IncompatibleCombination
    from lra_bench.preflight.command_line import composition_error
    from lra_bench.run.build import check_run_config

    kept = []
    for job in jobs:
        name = _job(job, varying)
        try:
            cfg: Any = hydra_context.config_loader.load_sweep_config(config, list(job))
            check_run_config(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
        except IncompatibleCombination as err:
            print(f"[lra-bench] sweep: skipping {name}: {err}", flush=True)
            continue
        except ConfigError as err:
            refuse(f"sweep job {name}: {err}")
        except (HydraException, OmegaConfBaseException) as err:
            parsed = OverridesParser.create().parse_overrides(list(job))
            refuse(f"sweep job {name}: {composition_error(err, parsed, str(config.hydra.job.config_name))}")
        kept.append(job)
    return kept
