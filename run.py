"""lra-bench entry point: `python run.py task=listops attn=gpa` (see README.md and `--help`)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from lra_bench.config.setup import quiet_third_party_warnings, setup
from lra_bench.preflight.digest import check_unchanged, remember_checked
from lra_bench.runtime import prepare_process

setup()
quiet_third_party_warnings()
prepare_process()  # OpenMP's idle threads sleep, freed memory stays in the heap: before anything imports torch


def check_run(cfg: DictConfig) -> None:
    """Everything `run_stage()` checks first (schemas, types and ranges, paths, task options), before Hydra writes."""
    from lra_bench.run.build import check_run_config

    check_run_config(cfg)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    check_unchanged(cfg)  # the config Hydra composed is the one the pre-flight checked, or one line, exit 2

    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    from lra_bench.errors import ConfigError
    from lra_bench.run.entry import run_stage
    from lra_bench.run.rundir import LOG_NAME, is_new, remove_unstarted
    from lra_bench.run.terminal import quiet_terminal, route_lightning_logs_to_hydra, tee_output
    from tasks.layout import DataSourceError

    route_lightning_logs_to_hydra()
    hydra_cfg = HydraConfig.get()
    output_dir, single = Path(hydra_cfg.runtime.output_dir), hydra_cfg.mode.name == "RUN"
    new = single and rank_zero_only.rank == 0 and is_new(output_dir, hydra_cfg.output_subdir)
    try:
        with tee_output(output_dir / LOG_NAME if rank_zero_only.rank == 0 else None), quiet_terminal():
            try:
                record = run_stage(cfg, output_dir)
            except (ConfigError, DataSourceError) as err:
                print(f"error: {err}", file=sys.stderr)
                raise
    except (ConfigError, DataSourceError) as err:
        if new and isinstance(err, DataSourceError):  # no data, so no step: the folder it made holds nothing
            remove_unstarted(output_dir, Path(str(cfg.output_root)))
        if single:
            sys.exit(2)
        raise
    return record["metrics"].get("val_acc")


if __name__ == "__main__":
    from lra_bench.preflight.command_line import preflight

    remember_checked(preflight(sys.argv[1:], check=check_run))  # bad input: one line, exit 2, before Hydra writes
    main()  # Hydra composes again and runs; the job first compares its config with the checked one
