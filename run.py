"""lra-bench entry point: `python run.py task=listops attn=gpa` (see README.md and `--help`)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from lra_bench.config.setup import quiet_third_party_warnings, setup

setup()
quiet_third_party_warnings()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from lra_bench.config.validate import ConfigError
    from lra_bench.run.train import train
    from tasks.layout import DataSourceError

    try:
        record = train(cfg, Path(HydraConfig.get().runtime.output_dir))
    except (ConfigError, DataSourceError) as err:
        print(f"error: {err}", file=sys.stderr)
        if HydraConfig.get().mode.name == "RUN":
            sys.exit(2)
        raise
    return record["metrics"].get("val_acc")


if __name__ == "__main__":
    main()
